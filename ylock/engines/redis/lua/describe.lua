-- describe.lua: what one lock (or semaphore) looks like now, for describe() and ``ylock list``;
-- a lock that nobody holds or waits for any more leaves the index here (its keys expired
-- since it was listed: the index never needs a scan to forget it).
-- KEYS: x q w s t i g (see common.lua), and a semaphore's c
-- Returns {} for a lock nobody holds or waits for; else {writer or "", writer token or 0,
--          ms the writer's lease still runs, what the writer is doing, {owner, deadline, ...}
--          live shared owners, {owner, "<token>[|<ctx>]", ...} their tokens, the queue,
--          {owner, mode or "?", since ms or 0, what it is doing, ...} for the queue, now ms,
--          a semaphore's permit count or false}.
--@common
--@queue
local now = clock()
local fence, dl, wctx, writer = x_record()
if not (fence and writer ~= '' and dl > now) then writer, wctx = '', '' end
local queue = redis.call('LRANGE', K.q, 0, -1)
local shared = redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf', 'WITHSCORES')
if writer == '' and #queue == 0 and #shared == 0 then
  index_drop()
  return {}
end
local waiting = {}
if #queue > 0 then
  local requests = redis.call('HMGET', K.w, unpack(queue))
  for i, o in ipairs(queue) do
    local alive, mode, _, since, _, _, ctx = parse_meta(requests[i])
    if not alive or alive <= now then mode, since, ctx = '?', 0, '' end
    table.insert(waiting, o)
    table.insert(waiting, mode)
    table.insert(waiting, since)
    table.insert(waiting, ctx)
  end
end
local tokens = {}
for i = 1, #shared, 2 do
  table.insert(tokens, shared[i])
  table.insert(tokens, redis.call('HGET', K.t, shared[i]) or '')
end
local permits = false
if KEYS[8] then permits = redis.call('GET', KEYS[8]) end
return {writer, writer ~= '' and fence or 0, writer ~= '' and dl - now or 0, wctx, shared, tokens, queue,
        waiting, now, permits}
