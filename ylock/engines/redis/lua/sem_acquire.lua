-- sem_acquire.lua: take a permit of a semaphore; otherwise join (or stay in) its queue, or leave it.
-- KEYS: x q w s t i g c n of the semaphore (see common.lua and permits.lua): x is
--       "<prefix>:{<group>:<name>}:p:x", its fence; n the owner's own notify list
-- ARGV[1] owner   ARGV[2] permits   ARGV[3] flags: fair, stay, queued, holders (as acquire.lua)
-- ARGV[4] lease ms   ARGV[5] waiter lease ms   ARGV[6] what the owner is doing (JSON, or "")
-- ARGV[7] the notify hub the owner waits through (as acquire.lua)
-- Every grant lasts min(lease, waiter lease) until the owner's watchdog renews it (see acquire.lua).
-- Returns the token when the fast path took a permit; else {1, token, evicted...} when the owner holds a permit (taken now, or granted by a
-- releaser meanwhile), or {0, ms until the earliest holder's lease runs out, evicted...} (asked for:
-- then, last, the holders' notes, as acquire.lua).
K.c, K.n = KEYS[8], KEYS[9]
local o, permits, wlease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local lease = math.min(tonumber(ARGV[4]), wlease)

-- Fast path: a permit is free and nobody waits (so nobody can be overtaken, fair or not).
-- Holders whose lease ran out still count here; the full path below clears them when the
-- permits look taken. Returns the bare token, as acquire.lua's fast path does.
if string.sub(ARGV[3], 3, 3) ~= '1' and redis.call('LLEN', K.q) == 0 then
  local card = redis.call('ZCARD', K.s)
  if card < permits then
    local now = clock()
    redis.call('SET', K.c, permits, 'PX', math.max(tonumber(ARGV[4]), wlease) * 2)
    if card == 0 then index_add() end
    local tok = next_token()
    fence_to(tok)
    redis.call('ZADD', K.s, now + lease, o)
    redis.call('HSET', K.t, o, ARGV[6] == '' and fmt(tok) or fmt(tok) .. '|' .. ARGV[6])
    if card == 0 then
      -- The first holder: s is new, and whatever t holds belongs to no holder, so both
      -- live exactly as long as this hold.
      redis.call('PEXPIRE', K.s, lease)
      redis.call('PEXPIRE', K.t, lease)
    else
      extend(K.s, lease)
      extend(K.t, lease)
    end
    return tok
  end
end

--@common
--@queue
--@permits
local fair = string.sub(ARGV[3], 1, 1) == '1'
local stay = string.sub(ARGV[3], 2, 2) == '1'
local queued = string.sub(ARGV[3], 3, 3) == '1'
local now = clock()
-- A new request: one it gave up on neither keeps its place nor leaves a grant (see acquire.lua).
if not queued then dequeue(o) end
expire_readers(now)
remember_permits(permits, math.max(tonumber(ARGV[4]), wlease) * 2)
local evicted = {}
local function done(status, value)
  local out = {status, value}
  for _, e in ipairs(evicted) do table.insert(out, e) end
  if status == 0 and string.sub(ARGV[3], 4, 4) == '1' then table.insert(out, holder_notes(now)) end
  return out
end

-- Granted by a releaser while we waited (or asked again while holding): take it; a new
-- request with a new token (see acquire.lua).
if redis.call('ZSCORE', K.s, o) then
  dequeue(o)
  local tok
  if not queued then
    tok = next_token()
    fence_to(tok)
  end
  return done(1, grant_read(o, lease, now, tok, ARGV[6]))
end
-- Non-fair: a free permit is taken before the queue is served.
if not fair and redis.call('ZCARD', K.s) < permits then
  if queued then dequeue(o) end
  index_add()
  return done(1, grant_read(o, lease, now, nil, ARGV[6]))
end
-- Serve the queue first (a larger count admits waiters at once), then see what is left.
dispatch_permits(now, permits, evicted)
if redis.call('ZSCORE', K.s, o) then
  dequeue(o)
  return done(1, grant_read(o, lease, now, nil, ARGV[6]))
end
if redis.call('ZCARD', K.s) < permits and redis.call('LLEN', K.q) == 0 then
  index_add()
  return done(1, grant_read(o, lease, now, nil, ARGV[6]))
end
if stay then
  -- The request carries the waiter's description and liveness (see acquire.lua).
  if not (queued and refresh(o, now + wlease)) then
    index_add()
    redis.call('DEL', K.n)             -- a grant pushed for an earlier request is not this one's
    enqueue(o, request('permit', ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6], ARGV[7]), wlease)
  else
    extend(K.q, wlease)
    extend(K.w, wlease)
  end
else
  dequeue(o)
  dispatch_permits(now, permits, evicted)   -- leaving the queue may let others in
  if redis.call('EXISTS', K.s, K.q) == 0 then
    redis.call('DEL', K.c)
    index_drop()
  end
end
return done(0, blocked_for(now))
