-- renew.lua: extend one owner's hold in one mode by its lease (the watchdog pipelines many).
-- KEYS[1] = the lock's x key (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read" | "permit" (a semaphore's)  ARGV[3] lease ms
-- Returns 1 if renewed, 0 if the owner no longer holds it (lost).
--@queue
local o, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
if mode == 'write' then
  if writer_of() ~= o then return 0 end
  redis.call('PEXPIRE', K.x, lease)
  redis.call('PEXPIRE', base .. ':h:' .. o, lease)
  return 1
end
local now = clock()
local deadline = redis.call('ZSCORE', K.s, o)
if not deadline or tonumber(deadline) <= now then
  if deadline then redis.call('ZREM', K.s, o) end
  return 0
end
redis.call('ZADD', K.s, now + lease, o)
extend_shared(now)
extend(K.t, lease)
extend(base .. ':h:' .. o, lease)
-- A semaphore's permit count (describe() tells a semaphore by it) lives as long as a holder.
if mode == 'permit' then extend(base .. ':c', lease * 2) end
return 1
