-- describe.lua: what one lock looks like now, for ``ylock list``.
-- KEYS[1] = the lock's x key (see common.lua)
-- Returns {writer or "", writer token or 0, writer pttl, {owner, deadline, ...} live shared
--          owners, queue, {owner, mode, ...} for the queue, {owner, token, ...} readers' tokens, now ms,
--          a semaphore's permit count or false, {owner, "<since ms>|<context>", ...} for holders and waiters}.
--@queue
local now = clock()
local writer, wtok = writer_of()
local queue = redis.call('LRANGE', K.q, 0, -1)
local shared = redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf', 'WITHSCORES')
local notes = {}
local function add_note(o)
  local v = redis.call('GET', base .. ':h:' .. o)
  if v then table.insert(notes, o); table.insert(notes, v) end
end
if writer then add_note(writer) end
for i = 1, #shared, 2 do add_note(shared[i]) end
-- A waiter's description is in its request (one written by an older script: in its h key).
local modes = {}
for _, o in ipairs(queue) do
  local mode, _, since, _, _, ctx = meta(o)
  table.insert(modes, o)
  table.insert(modes, mode or '?')
  if ctx then
    table.insert(notes, o)
    table.insert(notes, fmt(since) .. '|' .. ctx)
  else
    add_note(o)
  end
end
return {writer or '', wtok or 0, redis.call('PTTL', K.x), shared, queue, modes,
        redis.call('HGETALL', K.t), now, redis.call('GET', base .. ':c'), notes}
