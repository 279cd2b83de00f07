-- acquire.lua: try to acquire; otherwise join (or stay in) the queue, or leave it.
-- KEYS[1] = the lock's x key (see common.lua)
-- ARGV[1] owner   ARGV[2] mode: "write" | "read"
-- ARGV[3] flags: three or four characters "1"/"0": fair, stay (wait in the queue if not acquired;
--         "0" is the last try: leave the queue), queued (the owner may be in the queue),
--         holders (a reply that queues ends with the holders' notes, see holder_notes)
-- ARGV[4] lease ms   ARGV[5] waiter lease ms   ARGV[6] what the owner is doing (JSON, see note())
-- Every grant made here lasts min(lease, waiter lease) until the owner's watchdog renews it to
-- the full lease (its first renewal comes a third of the waiter lease later): an acquisition
-- whose answer never reached its owner (a timeout, a frozen server that ran the script after
-- the client gave up, a cancelled task, a dead process) blocks others for a waiter lease at most.
-- Returns the token (an integer) when the write fast path acquired; else {1, token, evicted...}
-- when the owner holds the lock (acquired now, granted by a releaser meanwhile, or a writer
-- downgrading), or {0, ms the holders' leases still run, evicted...} (asked for: then, last, a
-- nested {owner, note, ...} of the holders' notes).
local o, mode, wlease = ARGV[1], ARGV[2], tonumber(ARGV[5])
local lease = math.min(tonumber(ARGV[4]), wlease)
local lease_px = lease == wlease and ARGV[5] or ARGV[4]   -- the same, as sent (see RETENTION)
local queued = string.sub(ARGV[3], 3, 3) == '1'

-- Fast path for a writer: nobody holds, nobody waits.
if mode == 'write' and not queued and redis.call('EXISTS', K.x, K.q, K.s) == 0 then
  fast_note(o, ARGV[6], lease_px)
  return grant_write(o, lease_px)
end

local fair = string.sub(ARGV[3], 1, 1) == '1'
local stay = string.sub(ARGV[3], 2, 2) == '1'
-- A fair writer asking while another writer holds can neither enter nor be granted:
-- it only joins the queue (the holder's release evicts dead waiters and hands on).
if mode == 'write' and not queued and fair and stay then
  local v = redis.call('GET', K.x)
  if v and string.match(v, '^(.*)|%d+$') ~= o then
    -- A new request of this owner: one it gave up on (its answer never came) neither keeps
    -- its place in the queue nor leaves a grant for this one to take from the notify list.
    redis.call('LREM', K.q, 0, o)
    redis.call('DEL', base .. ':n:' .. o)
    redis.call('RPUSH', K.q, o)
    redis.call('SET', base .. ':w:' .. o, request('write', ARGV[4], clock(), ARGV[5], '1', ARGV[6]), 'PX', wlease)
    if string.sub(ARGV[3], 4, 4) ~= '1' then return {0, redis.call('PTTL', K.x)} end
    local holder = string.match(v, '^(.*)|%d+$')
    local said = redis.call('GET', base .. ':h:' .. holder)
    return {0, redis.call('PTTL', K.x), said and {holder, said} or {}}
  end
end

--@common
--@queue

local now = clock()
local writer, wtok = writer_of()

-- Fast path for a reader: no writer holds and nobody waits. A new request: a new token,
-- even if a read grant of a request whose answer never came is still there (its token is
-- below those issued since).
if mode == 'read' and not writer and not queued and redis.call('LLEN', K.q) == 0 then
  fast_note(o, ARGV[6], lease)
  return {1, grant_read(o, lease, now, next_token())}
end

-- A new request (not queued as far as the owner knows): an entry of a request it gave up on
-- (its answer never came) does not keep its place ahead of those who asked since.
if not queued then redis.call('LREM', K.q, 0, o) end

-- (A non-fair writer asking while another writer holds: as the fair one above, it only
-- joins the queue, so it skips the readers' expiry and the dead-head eviction.)
local busy = mode == 'write' and writer and writer ~= o
if not busy then expire_readers(now) end
local evicted = {}
local function done(status, value)
  local out = {status, value}
  for _, e in ipairs(evicted) do table.insert(out, e) end
  if status == 0 and string.sub(ARGV[3], 4, 4) == '1' then table.insert(out, holder_notes(now)) end
  return out
end

-- Granted by a releaser while we waited: take it (its lease starts again). A new request
-- finding a grant (one of a request whose answer never came) takes it with a new token:
-- every first acquisition's token is above all issued before.
if mode == 'write' and writer == o then
  dequeue(o)
  note(o, ARGV[6], lease)
  return done(1, grant_write(o, lease, queued and wtok or nil))
end
if mode == 'read' and redis.call('ZSCORE', K.s, o) then
  dequeue(o)
  note(o, ARGV[6], lease)
  return done(1, grant_read(o, lease, now, (not queued) and next_token() or nil))
end
-- A writer downgrading: it may always read, with its own token.
if mode == 'read' and writer == o then
  return done(1, grant_read(o, lease, now, wtok))
end

if not busy then live_head(evicted) end
if not busy and may_enter(writer, o, mode, fair, now) then
  if queued then dequeue(o) end
  note(o, ARGV[6], lease)
  local tok
  if mode == 'write' then tok = grant_write(o, lease) else
    tok = grant_read(o, lease, now)
    dispatch(now, evicted)             -- the readers queued behind may enter with us
  end
  return done(1, tok)
end

if stay then
  -- The request carries the waiter's description (describe() reads it there), so
  -- refreshing the liveness key refreshes both.
  local w = base .. ':w:' .. o
  if not queued or not redis.call('LPOS', K.q, o) then
    redis.call('RPUSH', K.q, o)
    redis.call('SET', w, request(mode, ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6]), 'PX', wlease)
    -- a grant pushed for an earlier request (given up on, or expired) is not this one's
    redis.call('DEL', base .. ':n:' .. o)
  elseif redis.call('PEXPIRE', w, wlease) == 0 then   -- still queued but counted dead: alive again
    redis.call('SET', w, request(mode, ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6]), 'PX', wlease)
  end
else
  dequeue(o)
  dispatch(now, evicted)               -- leaving the head of the queue may let others in
end
return done(0, blocked_for(now))
