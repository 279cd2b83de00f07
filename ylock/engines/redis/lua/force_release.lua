-- force_release.lua: drop every holder and waiter of a lock (the fence stays).
-- KEYS[1] = the lock's x key (see common.lua)
-- Returns 1 if anybody held the lock, else 0.
--@queue
local now = clock()
local held = redis.call('EXISTS', K.x) + redis.call('ZCOUNT', K.s, '(' .. now, '+inf')
local writer = writer_of()
local gone = {K.x, K.s, K.q, K.t}
if writer then table.insert(gone, base .. ':h:' .. writer) end
for _, o in ipairs(redis.call('ZRANGE', K.s, 0, -1)) do table.insert(gone, base .. ':h:' .. o) end
for _, o in ipairs(redis.call('LRANGE', K.q, 0, -1)) do
  table.insert(gone, base .. ':h:' .. o)
  table.insert(gone, base .. ':w:' .. o)
end
redis.call('DEL', unpack(gone))
if held > 0 then return 1 end
return 0
