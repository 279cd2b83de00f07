-- sem_acquire.lua: take a permit of a semaphore; otherwise join (or stay in) its queue, or leave it.
-- KEYS[1] = the semaphore's x key "<prefix>:{<group>:<name>}:p:x" (never set: it names the base)
-- ARGV[1] owner   ARGV[2] permits   ARGV[3] flags: fair, stay, queued, holders (as acquire.lua)
-- ARGV[4] lease ms   ARGV[5] waiter lease ms   ARGV[6] what the owner is doing (JSON)
-- Every grant lasts min(lease, waiter lease) until the owner's watchdog renews it (see acquire.lua).
-- Returns the token when the fast path took a permit; else {1, token, evicted...} when the owner holds a permit (taken now, or granted by a
-- releaser meanwhile), or {0, ms until the earliest holder's lease runs out, evicted...} (asked for:
-- then, last, the holders' notes, as acquire.lua).
local o, permits, wlease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local lease = math.min(tonumber(ARGV[4]), wlease)

-- Fast path: a permit is free and nobody waits (so nobody can be overtaken, fair or not).
-- Holders whose lease ran out still count here; the full path below clears them when the
-- permits look taken. Returns the bare token, as acquire.lua's fast path does.
if string.sub(ARGV[3], 3, 3) ~= '1' and redis.call('LLEN', K.q) == 0 then
  local card = redis.call('ZCARD', K.s)
  if card < permits then
    local now = clock()
    redis.call('SET', base .. ':c', permits, 'PX', math.max(tonumber(ARGV[4]), wlease) * 2)
    redis.call('SET', base .. ':h:' .. o, fmt(now) .. '|' .. ARGV[6], 'PX', lease)
    local tok = next_token()
    redis.call('ZADD', K.s, now + lease, o)
    redis.call('HSET', K.t, o, fmt(tok))
    if card == 0 then
      -- The first holder: s is new, and whatever t holds belongs to no holder, so both
      -- live exactly as long as this hold.
      redis.call('PEXPIRE', K.s, lease)
      redis.call('PEXPIRE', K.t, lease)
    else
      if redis.call('PTTL', K.s) < lease then redis.call('PEXPIRE', K.s, lease) end
      if redis.call('PTTL', K.t) < lease then redis.call('PEXPIRE', K.t, lease) end
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
-- A new request: an entry of one it gave up on does not keep its place (see acquire.lua).
if not queued then redis.call('LREM', K.q, 0, o) end
expire_readers(now)
remember_permits(permits, math.max(tonumber(ARGV[4]), wlease) * 2)
local evicted = {}
local function done(status, value)
  local out = {status, value}
  for _, e in ipairs(evicted) do table.insert(out, e) end
  if status == 0 and string.sub(ARGV[3], 4, 4) == '1' then table.insert(out, holder_notes(now)) end
  return out
end

-- Granted by a releaser while we waited (or asked again while holding): take it.
if redis.call('ZSCORE', K.s, o) then
  dequeue(o)
  note(o, ARGV[6], lease)
  return done(1, grant_read(o, lease, now, (not queued) and next_token() or nil))   -- see acquire.lua
end
-- Non-fair: a free permit is taken before the queue is served.
if not fair and redis.call('ZCARD', K.s) < permits then
  if queued then dequeue(o) end
  note(o, ARGV[6], lease)
  return done(1, grant_read(o, lease, now))
end
-- Serve the queue first (a larger count admits waiters at once), then see what is left.
dispatch_permits(now, permits, evicted)
if redis.call('ZSCORE', K.s, o) then
  return done(1, grant_read(o, lease, now))
end
if redis.call('ZCARD', K.s) < permits and redis.call('LLEN', K.q) == 0 then
  note(o, ARGV[6], lease)
  return done(1, grant_read(o, lease, now))
end
if stay then
  -- The request carries the waiter's description (see acquire.lua).
  local w = base .. ':w:' .. o
  if not queued or not redis.call('LPOS', K.q, o) then
    redis.call('RPUSH', K.q, o)
    redis.call('SET', w, request('permit', ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6]), 'PX', wlease)
    redis.call('DEL', base .. ':n:' .. o)   -- a grant pushed for an earlier request is not this one's
  elseif redis.call('PEXPIRE', w, wlease) == 0 then   -- still queued but counted dead: alive again
    redis.call('SET', w, request('permit', ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6]), 'PX', wlease)
  end
else
  dequeue(o)
  dispatch_permits(now, permits, evicted)   -- leaving the queue may let others in
end
return done(0, blocked_for(now))
