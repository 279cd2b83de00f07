-- queue.lua: the queue machinery of the slow paths (see common.lua for the keys).
-- Forget readers whose lease ran out (their tokens too).
local function expire_readers(now)
  local dead = redis.call('ZRANGEBYSCORE', K.s, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', K.s, '-inf', now)
    redis.call('HDEL', K.t, unpack(dead))
  end
end

-- A live waiter's request (see parse_meta), or nil once its liveness key expired.
local function meta(o)
  return parse_meta(redis.call('GET', base .. ':w:' .. o))
end

local function dequeue(o)
  redis.call('LREM', K.q, 1, o)
  redis.call('DEL', base .. ':w:' .. o, base .. ':n:' .. o, base .. ':h:' .. o)
end

-- Make o a reader for lease ms; a writer downgrading passes its own token.
local function grant_read(o, lease, now, tok)
  tok = tok or tonumber(redis.call('HGET', K.t, o) or false) or next_token()
  redis.call('ZADD', K.s, now + lease, o)
  extend_shared(now)
  redis.call('HSET', K.t, o, fmt(tok))
  extend(K.t, lease)
  return tok
end

-- Drop waiters at the head of the queue whose liveness key expired; return the live
-- head and its request (the value of its liveness key).
local function live_head(evicted)
  while true do
    local head = redis.call('LINDEX', K.q, 0)
    if not head then return nil end
    local v = redis.call('GET', base .. ':w:' .. head)
    if v then return head, v end
    redis.call('LPOP', K.q)
    redis.call('DEL', base .. ':n:' .. head, base .. ':h:' .. head)
    table.insert(evicted, head)
  end
end

-- Grant the read lock to the run of live fair readers at the head of the queue (at most
-- 256 at a time), in a constant number of calls plus two per reader (its notification).
-- Dead waiters inside the run are evicted with it. Returns how many were granted.
local function grant_reader_run(now, evicted)
  local run = redis.call('LRANGE', K.q, 0, 255)
  local wkeys = {}
  for i, o in ipairs(run) do wkeys[i] = base .. ':w:' .. o end
  local requests = redis.call('MGET', unpack(wkeys))
  local granted, gone, scores, cut, longest = {}, {}, {}, #run, 0
  for i, o in ipairs(run) do
    local mode, lease, _, wlease, fair, ctx = parse_meta(requests[i])
    if not mode then
      table.insert(evicted, o)
      table.insert(gone, base .. ':n:' .. o)
      table.insert(gone, base .. ':h:' .. o)
    elseif mode == 'read' and fair then
      table.insert(granted, {o, wlease, ctx})
      table.insert(gone, wkeys[i])
      table.insert(scores, now + math.min(lease, wlease))
      table.insert(scores, o)
      longest = math.max(longest, math.min(lease, wlease))
    else
      cut = i - 1
      break
    end
  end
  if #granted == 0 then return 0 end
  local first = next_token(#granted)
  local tokens = {}
  for i, g in ipairs(granted) do
    table.insert(tokens, g[1])
    table.insert(tokens, fmt(first + i - 1))
  end
  redis.call('ZADD', K.s, unpack(scores))
  extend_shared(now)
  redis.call('HSET', K.t, unpack(tokens))
  extend(K.t, longest)
  redis.call('LTRIM', K.q, cut, -1)
  redis.call('DEL', unpack(gone))
  for i, g in ipairs(granted) do
    notify(g[1], fmt(first + i - 1), g[2])
    granted_note(g[1], g[2], g[3])
  end
  return #granted
end

-- Hand the lock on from the head of the queue. A fair head is granted the lock right
-- here (with its short waiter lease, until its watchdog renews it) and gets its token
-- pushed; a run of fair readers is granted together. A non-fair head is only woken.
-- ``free``: the caller knows no writer holds (it just deleted the x key itself).
local function dispatch(now, evicted, free)
  if not free and redis.call('EXISTS', K.x) == 1 then return end
  local head, v = live_head(evicted)
  if not head then return end
  local mode, lease, _, wlease, fair, ctx = parse_meta(v)
  if not mode then                      -- unreadable request: drop it, the waiter re-asks
    redis.call('LPOP', K.q)
    redis.call('DEL', base .. ':w:' .. head)
    return dispatch(now, evicted, true)
  end
  if mode == 'write' and redis.call('ZCARD', K.s) > 0 then return end
  if not fair then
    -- wake the head and the readers right behind it; they race for the lock
    local run = redis.call('LRANGE', K.q, 0, 63)
    for i, o in ipairs(run) do
      local m2 = meta(o)
      if i > 1 and m2 ~= 'read' then break end
      notify(o, 'wake', wlease)
      if m2 ~= 'read' then break end
    end
    return
  end
  if mode == 'read' then
    -- a run may stop at a non-fair reader: dispatch again to wake it
    if grant_reader_run(now, evicted) > 0 then return dispatch(now, evicted, true) end
    return
  end
  local tok = grant_write(head, math.min(lease, wlease))
  granted_note(head, math.min(lease, wlease), ctx)
  redis.call('LPOP', K.q)
  redis.call('DEL', base .. ':w:' .. head)
  notify(head, fmt(tok), wlease)
end

-- Fair: a writer enters a free lock only at the head of the queue; a reader enters a
-- lock without a writer if every live waiter ahead of it is a reader. Non-fair: anyone
-- enters a compatible lock unless the head has waited past the barge window, or (for a
-- reader) the head is a writer. (The same rule as ylock.engines.local.may_enter.)
local function may_enter(writer, o, mode, fair, now)
  if mode == 'write' then
    if writer or redis.call('ZCARD', K.s) > 0 then return false end
  elseif writer and writer ~= o then
    return false
  end
  local pos = redis.call('LPOS', K.q, o)
  local n = pos or redis.call('LLEN', K.q)
  if n == 0 then return true end
  local ahead = redis.call('LRANGE', K.q, 0, n - 1)
  local function all_readers()
    for _, a in ipairs(ahead) do
      local m = meta(a)
      if m and m ~= 'read' then return false end    -- a dead waiter (nil) blocks nobody
    end
    return true
  end
  if fair then return mode == 'read' and all_readers() end
  local hmode, _, hsince = meta(ahead[1])
  if hsince and now - hsince >= BARGE then return mode == 'read' and all_readers() end
  return mode == 'write' or hmode == 'read'
end

-- Milliseconds until the current holders' leases run out (a waiter never sleeps longer).
local function blocked_for(now)
  local ms = redis.call('PTTL', K.x)
  if ms > 0 then return ms end
  local first = redis.call('ZRANGE', K.s, 0, 0, 'WITHSCORES')
  if first[2] then return math.max(1, tonumber(first[2]) - now) end
  return 1
end
