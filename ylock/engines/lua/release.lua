-- release.lua: release one owner's hold in one mode, then hand the lock to the queue.
-- KEYS[1..6] = x, s, q, m, t, f (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read"  ARGV[3] fence retention ms  ARGV[4] key base
-- Returns {1 if the owner still held it (else 0: its lease had run out), evicted...}.
local K = {x = KEYS[1], s = KEYS[2], q = KEYS[3], m = KEYS[4], t = KEYS[5], f = KEYS[6], base = ARGV[4]}
local o, mode, retention = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, now_us = clock()
redis.call('ZREMRANGEBYSCORE', K.s, '-inf', now)
local held = 0
if mode == 'write' then
  if redis.call('GET', K.x) == o then
    redis.call('DEL', K.x)
    held = 1
  end
elseif redis.call('ZREM', K.s, o) == 1 then
  held = 1
  extend_shared(K, now)
end
if redis.call('GET', K.x) ~= o and not redis.call('ZSCORE', K.s, o) then
  redis.call('HDEL', K.t, o)
end
local evicted = {}
dispatch(K, now, now_us, retention, evicted)
-- Nobody holds it: forget the tokens of holders that died without releasing.
if redis.call('EXISTS', K.x) == 0 and redis.call('ZCARD', K.s) == 0 then
  redis.call('DEL', K.t)
end
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
