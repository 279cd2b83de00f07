-- renew.lua: extend one owner's hold in one mode by its lease (the watchdog pipelines many).
-- KEYS[1..3] = x, s, t (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read"  ARGV[3] lease ms
-- Returns 1 if renewed, 0 if the owner no longer holds it (lost).
local K = {x = KEYS[1], s = KEYS[2], t = KEYS[3]}
local o, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
if mode == 'write' then
  if redis.call('GET', K.x) ~= o then return 0 end
  redis.call('PEXPIRE', K.x, lease)
else
  local deadline = redis.call('ZSCORE', K.s, o)
  if not deadline or tonumber(deadline) <= now then
    if deadline then redis.call('ZREM', K.s, o) end
    return 0
  end
  redis.call('ZADD', K.s, now + lease, o)
  extend_shared(K, now)
end
extend(K.t, lease)
return 1
