-- describe.lua: what one lock looks like now, for ``ylock list``.
-- KEYS[1..5] = x, s, q, m, t (see common.lua)
-- Returns {writer or "", writer pttl, {owner, deadline, ...} live shared owners, queue,
--          {owner, mode, ...} for the queue, {owner, token, ...}, now ms}.
local K = {x = KEYS[1], s = KEYS[2], q = KEYS[3], m = KEYS[4], t = KEYS[5]}
local now = clock()
local queue = redis.call('LRANGE', K.q, 0, -1)
local modes = {}
for _, o in ipairs(queue) do
  table.insert(modes, o)
  table.insert(modes, meta(K, o) or '?')
end
return {redis.call('GET', K.x) or '', redis.call('PTTL', K.x),
        redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf', 'WITHSCORES'), queue, modes,
        redis.call('HGETALL', K.t), now}
