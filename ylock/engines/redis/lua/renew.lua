-- renew.lua: extend one owner's hold in one mode by its lease (the watchdog pipelines many).
-- KEYS: mode "write": x alone; "read": s t; "permit": s t c (see common.lua). A writer's renewal
-- touches one key, so it runs through a Cluster slot migration: on the node that has x
-- (the source, then the target after ASK), never refused with TRYAGAIN.
-- ARGV[1] owner  ARGV[2] mode: "write" | "read" | "permit"  ARGV[3] lease ms
-- Returns 1 if renewed, 0 if the owner no longer holds it (lost).
local o, mode, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
if mode == 'write' then
  local v = redis.call('GET', K.x)
  if not v then return 0 end
  local tok, dl = string.match(v, '^(%d+)|(%d+)|')
  if not tok then                                  -- an x of an older version: "owner|token"
    if string.match(v, '^(.*)|%d+$') ~= o then return 0 end
    redis.call('PEXPIRE', K.x, lease)
    return 1
  end
  local n, p = string.match(v, '^%d+|%d+|(%d+)|()')
  local now = clock()
  if string.sub(v, p + tonumber(n)) ~= o or tonumber(dl) <= now then return 0 end
  redis.call('SET', K.x, tok .. '|' .. (now + lease) .. string.sub(v, #tok + #dl + 2), 'PX', lease + RETENTION)
  return 1
end
K.s, K.t = KEYS[1], KEYS[2]
local now = clock()
local deadline = redis.call('ZSCORE', K.s, o)
if not deadline or tonumber(deadline) <= now then
  if deadline then redis.call('ZREM', K.s, o) end
  return 0
end
redis.call('ZADD', K.s, now + lease, o)
extend_shared(now)
extend(K.t, lease)
-- A semaphore's permit count (describe() shows it) lives as long as a holder.
if KEYS[3] then extend(KEYS[3], lease * 2) end
return 1
