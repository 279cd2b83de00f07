-- force_release.lua: drop every holder and waiter of a lock (the fence stays).
-- KEYS[1] = the lock's x key (see common.lua)
-- Returns 1 if anybody held the lock, else 0.
--@queue
local now = clock()
local held = redis.call('EXISTS', K.x) + redis.call('ZCOUNT', K.s, '(' .. now, '+inf')
redis.call('DEL', K.x, K.s, K.q, K.t)
if held > 0 then return 1 end
return 0
