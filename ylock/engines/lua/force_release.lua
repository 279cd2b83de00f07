-- force_release.lua: drop every holder and waiter of a lock (the fence stays).
-- KEYS[1..5] = x, s, q, m, t (see common.lua)
-- Returns 1 if anybody held the lock, else 0.
local now = clock()
local held = redis.call('EXISTS', KEYS[1]) + redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
if held > 0 then return 1 end
return 0
