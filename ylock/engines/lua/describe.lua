-- describe.lua: what one lock looks like now, for ``ylock list``.
-- KEYS[1] = the lock's x key (see common.lua)
-- Returns {writer or "", writer token or 0, writer pttl, {owner, deadline, ...} live shared
--          owners, queue, {owner, mode, ...} for the queue, {owner, token, ...} readers' tokens, now ms}.
--@queue
local now = clock()
local writer, wtok = writer_of()
local queue = redis.call('LRANGE', K.q, 0, -1)
local modes = {}
for _, o in ipairs(queue) do
  table.insert(modes, o)
  table.insert(modes, meta(o) or '?')
end
return {writer or '', wtok or 0, redis.call('PTTL', K.x),
        redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf', 'WITHSCORES'), queue, modes,
        redis.call('HGETALL', K.t), now, redis.call('GET', base .. ':c')}
