-- force_release.lua: drop every holder and waiter of a lock (the fence stays).
-- KEYS: x q w s t i g (see common.lua)
-- Returns 1 if anybody held the lock, else 0.
--@common
local now = clock()
local fence, dl, _, writer = x_record()
local held = 0
if fence and writer ~= '' and dl > now then held = 1 end
if redis.call('ZCOUNT', K.s, '(' .. now, '+inf') > 0 then held = 1 end
for _, o in ipairs(redis.call('LRANGE', K.q, 0, -1)) do forget_notify(o) end
redis.call('DEL', K.q, K.w, K.s, K.t)
if fence then fence_to(tonumber(fence)) end
index_drop()
return held
