-- queue.lua: the queue machinery of the slow paths (see common.lua for the keys).
-- What each part costs in a queue of n waiters: a poll, a grant and a handoff are O(1)
-- (the head, the caller's own request); a fair reader that may enter past waiters ahead of
-- it reads them (O(its position)), and so does a waiter leaving the queue early (LREM).

-- Forget readers whose lease ran out (their tokens too).
local function expire_readers(now)
  local dead = redis.call('ZRANGEBYSCORE', K.s, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', K.s, '-inf', now)
    redis.call('HDEL', K.t, unpack(dead))
  end
end

-- Take the caller out of the queue (its request tells whether it is there: no scan
-- when it is not), and drop what was pushed to its own notify list meanwhile.
local function dequeue(o)
  if redis.call('HDEL', K.w, o) == 1 then redis.call('LREM', K.q, 1, o) end
  redis.call('DEL', K.n)
end

-- The token of reader o (as its field in t says), or nil; and what it is doing.
local function reader_record(o)
  local v = redis.call('HGET', K.t, o)
  if not v then return nil, nil end
  local tok, ctx = string.match(v, '^(%d+)|?(.*)$')
  return tonumber(tok), ctx
end

-- Make o a reader for lease ms, doing ctx (nil: what it said before); a writer downgrading
-- passes its own token.
local function grant_read(o, lease, now, tok, ctx)
  local had, said = reader_record(o)
  if not tok then
    tok = had
    if not tok then
      tok = next_token()
      fence_to(tok)
    end
  end
  ctx = ctx or said or ''
  redis.call('ZADD', K.s, now + lease, o)
  extend_shared(now)
  redis.call('HSET', K.t, o, ctx == '' and fmt(tok) or fmt(tok) .. '|' .. ctx)
  extend(K.t, lease)
  return tok
end

-- Drop waiters at the head of the queue whose liveness ran out; return the live head and
-- its request (its field in w).
local function live_head(evicted, now)
  while true do
    local head = redis.call('LINDEX', K.q, 0)
    if not head then return nil end
    local v = redis.call('HGET', K.w, head)
    local alive = v and tonumber(string.match(v, '^(%d+)|'))
    if alive and alive > now then return head, v end
    redis.call('LPOP', K.q)
    redis.call('HDEL', K.w, head)
    forget_notify(head)
    table.insert(evicted, head)
  end
end

-- Grant the read lock to the run of live fair readers at the head of the queue (at most
-- 256 at a time), in a constant number of calls plus one per reader (its notification).
-- Dead waiters inside the run are evicted with it. Returns how many were granted.
local function grant_reader_run(now, evicted)
  local run = redis.call('LRANGE', K.q, 0, 255)
  local requests = redis.call('HMGET', K.w, unpack(run))
  local granted, gone, scores, cut, longest = {}, {}, {}, #run, 0
  for i, o in ipairs(run) do
    local alive, mode, lease, _, wlease, fair, ctx, hub = parse_meta(requests[i])
    if not alive or alive <= now then
      table.insert(evicted, o)
      table.insert(gone, o)
    elseif mode == 'read' and fair then
      table.insert(granted, {o, wlease, ctx, hub})
      table.insert(gone, o)
      table.insert(scores, now + math.min(lease, wlease))
      table.insert(scores, o)
      longest = math.max(longest, math.min(lease, wlease))
    else
      cut = i - 1
      break
    end
  end
  if #granted == 0 then
    if #gone > 0 then            -- only dead waiters before the first live one: evict them
      redis.call('LTRIM', K.q, cut, -1)
      redis.call('HDEL', K.w, unpack(gone))
      for _, o in ipairs(gone) do forget_notify(o) end
    end
    return 0
  end
  local first = next_token()
  fence_to(first + #granted - 1)
  local tokens = {}
  for i, g in ipairs(granted) do
    table.insert(tokens, g[1])
    table.insert(tokens, g[3] == '' and fmt(first + i - 1) or fmt(first + i - 1) .. '|' .. g[3])
  end
  redis.call('ZADD', K.s, unpack(scores))
  extend_shared(now)
  redis.call('HSET', K.t, unpack(tokens))
  extend(K.t, longest)
  redis.call('LTRIM', K.q, cut, -1)
  redis.call('HDEL', K.w, unpack(gone))
  local live = {}
  for _, g in ipairs(granted) do live[g[1]] = true end
  for _, o in ipairs(gone) do
    if not live[o] then forget_notify(o) end
  end
  for i, g in ipairs(granted) do notify(g[1], fmt(first + i - 1), g[2], g[4]) end
  return #granted
end

-- Hand the lock on from the head of the queue. A fair head is granted the lock right
-- here (with its short waiter lease, until its watchdog renews it) and gets its token
-- pushed; a run of fair readers is granted together. A non-fair head is only woken.
-- ``free``: the caller knows no writer holds (it just freed x itself).
local function dispatch(now, evicted, free)
  if not free and writer_of() then return end
  local head, v = live_head(evicted, now)
  if not head then return end
  local _, mode, lease, _, wlease, fair, ctx, hub = parse_meta(v)
  if mode == 'write' and redis.call('ZCARD', K.s) > 0 then return end
  if not fair then
    -- wake the head and the readers right behind it; they race for the lock
    local run = redis.call('LRANGE', K.q, 0, 63)
    for i, o in ipairs(run) do
      local m2, _, _, _, _, _, hub2 = meta(o, now)
      if i > 1 and m2 ~= 'read' then break end
      notify(o, 'wake', wlease, hub2)
      if m2 ~= 'read' then break end
    end
    return
  end
  if mode == 'read' then
    -- a run may stop at a non-fair reader: dispatch again to wake it
    if grant_reader_run(now, evicted) > 0 then return dispatch(now, evicted, true) end
    return
  end
  local tok = grant_write(head, math.min(lease, wlease), nil, ctx)
  redis.call('LPOP', K.q)
  redis.call('HDEL', K.w, head)
  notify(head, fmt(tok), wlease, hub)
end

-- Fair: a writer enters a free lock only at the head of the queue; a reader enters a
-- lock without a writer if every live waiter ahead of it is a reader. Non-fair: anyone
-- enters a compatible lock unless the head has waited past the barge window, or (for a
-- reader) the head is a writer. (The same rule as ylock.engines.local.may_enter.) The
-- caller evicted the dead heads first (live_head): the head read here is alive.
-- O(1) but for a reader that must look past readers ahead of it (O(its position)).
local function may_enter(writer, o, mode, fair, now)
  if mode == 'write' then
    if writer or redis.call('ZCARD', K.s) > 0 then return false end
  elseif writer and writer ~= o then
    return false
  end
  local head = redis.call('LINDEX', K.q, 0)
  if not head or head == o then return true end
  local hmode, _, hsince = meta(head, now)
  local barged = hsince and now - hsince >= BARGE
  if mode == 'write' then return not fair and not barged end
  if hmode and hmode ~= 'read' then return false end     -- no reader passes a writer at the head
  if not fair and hmode == 'read' and not barged then return true end
  local pos = redis.call('LPOS', K.q, o)
  local ahead = redis.call('LRANGE', K.q, 1, (pos or redis.call('LLEN', K.q)) - 1)
  for _, a in ipairs(ahead) do
    local m = meta(a, now)
    if m and m ~= 'read' then return false end          -- a dead waiter (nil) blocks nobody
  end
  return true
end

-- Milliseconds until the current holders' leases run out (a waiter never sleeps longer).
local function blocked_for(now)
  local tok, dl, _, o = x_record()
  if tok and o ~= '' and dl > now then return dl - now end
  local first = redis.call('ZRANGE', K.s, 0, 0, 'WITHSCORES')
  if first[2] then return math.max(1, tonumber(first[2]) - now) end
  return 1
end
