-- acquire.lua: try to acquire; otherwise join (or stay in) the queue, or leave it.
-- KEYS: x q w s t i g n (see common.lua; n is the owner's own notify list)
-- ARGV[1] owner   ARGV[2] mode: "write" | "read"
-- ARGV[3] flags: three or four characters "1"/"0": fair, stay (wait in the queue if not acquired;
--         "0" is the last try: leave the queue), queued (the owner may be in the queue),
--         holders (a reply that queues ends with the holders' notes, see holder_notes)
-- ARGV[4] lease ms   ARGV[5] waiter lease ms   ARGV[6] what the owner is doing (JSON, or "")
-- ARGV[7] the notify hub the owner waits through ("": its own notify list; see common.lua)
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
local queued = string.sub(ARGV[3], 3, 3) == '1'

-- Fast path for a writer: nobody holds, nobody waits.
if mode == 'write' and not queued and redis.call('EXISTS', K.q, K.s) == 0 then
  local fence, dl, _, writer = x_record()
  if not fence or writer == '' or dl <= clock() then
    index_add()
    local tok = now_us()
    if fence and tonumber(fence) >= tok then tok = tonumber(fence) + 1 end
    return grant_write(o, lease, tok, ARGV[6])
  end
end

local fair = string.sub(ARGV[3], 1, 1) == '1'
local stay = string.sub(ARGV[3], 2, 2) == '1'
-- A fair writer asking while another writer holds can neither enter nor be granted:
-- it only joins the queue (the holder's release evicts dead waiters and hands on).
if mode == 'write' and not queued and fair and stay then
  local tok, dl, wctx, writer = x_record()
  local now = clock()
  if writer and writer ~= '' and writer ~= o and dl > now then
    -- A new request of this owner: one it gave up on (its answer never came) neither keeps
    -- its place in the queue nor leaves a grant in its notify list for this one to take.
    if redis.call('HDEL', K.w, o) == 1 then redis.call('LREM', K.q, 1, o) end
    redis.call('DEL', K.n)
    enqueue(o, request('write', ARGV[4], now, ARGV[5], '1', ARGV[6], ARGV[7]), wlease)
    if string.sub(ARGV[3], 4, 4) ~= '1' then return {0, dl - now} end
    return {0, dl - now, wctx ~= '' and {writer, fmt(math.floor(tonumber(tok) / 1000)) .. '|' .. wctx} or {}}
  end
end

--@common
--@queue

local now = clock()
local writer, wtok = writer_of()

-- A new request finding a read of its own (granted to a request whose answer never came)
-- takes it with a new token: every first acquisition's token is above all issued before.
local function fresh_read()
  if queued or writer then return nil end
  local tok = next_token()
  fence_to(tok)
  return tok
end

-- Fast path for a reader: no writer holds and nobody waits.
if mode == 'read' and not writer and not queued and redis.call('LLEN', K.q) == 0 then
  index_add()
  return {1, grant_read(o, lease, now, fresh_read(), ARGV[6])}
end

-- A new request (not queued as far as the owner knows): a request it gave up on (its answer
-- never came) neither keeps its place ahead of those who asked since nor leaves a grant in
-- its notify list for this one to take (a stale read grant taken as a write grant).
if not queued then dequeue(o) end

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
-- finding a grant (one of a request whose answer never came) takes it with a new token.
if mode == 'write' and writer == o then
  dequeue(o)
  return done(1, grant_write(o, lease, queued and wtok or nil, ARGV[6]))
end
if mode == 'read' and redis.call('ZSCORE', K.s, o) then
  dequeue(o)
  return done(1, grant_read(o, lease, now, fresh_read(), ARGV[6]))
end
-- A writer downgrading: it may always read, with its own token (and, if it says nothing
-- now, what it said as the writer).
if mode == 'read' and writer == o then
  local _, _, said = x_record()
  return done(1, grant_read(o, lease, now, wtok, ARGV[6] ~= '' and ARGV[6] or said))
end

if not busy then live_head(evicted, now) end
if not busy and may_enter(writer, o, mode, fair, now) then
  if queued then dequeue(o) end
  index_add()
  local tok
  if mode == 'write' then tok = grant_write(o, lease, nil, ARGV[6]) else
    tok = grant_read(o, lease, now, nil, ARGV[6])
    dispatch(now, evicted)             -- the readers queued behind may enter with us
  end
  return done(1, tok)
end

if stay then
  -- The request carries the waiter's description (describe() reads it there) and its
  -- liveness, so a poll refreshes one field.
  if not (queued and refresh(o, now + wlease)) then
    index_add()                        -- a lock with a queue is listed
    redis.call('DEL', K.n)             -- a grant pushed for an earlier request is not this one's
    enqueue(o, request(mode, ARGV[4], now, ARGV[5], string.sub(ARGV[3], 1, 1), ARGV[6], ARGV[7]), wlease)
  else
    extend(K.q, wlease)
    extend(K.w, wlease)
  end
else
  dequeue(o)
  dispatch(now, evicted)               -- leaving the head of the queue may let others in
  if idle() then index_drop() end
end
return done(0, blocked_for(now))
