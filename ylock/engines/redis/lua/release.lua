-- release.lua: release one owner's hold in one mode, then hand the lock to the queue.
-- KEYS[1] = the lock's x key (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read"
-- Returns 1 if the owner still held it (else 0: its lease had run out) when nothing more
-- was to be done or a fair writer was handed the lock, else {that, evicted...}.
local o, mode = ARGV[1], ARGV[2]
local held = 0
local v, mine, there
if mode == 'write' then
  v = redis.call('GET', K.x)
  mine = v and string.match(v, '^(.*)|%d+$') == o
  -- Nobody reads and nobody waits (the uncontended case, one command to tell): our note
  -- and x go, if still ours; nothing else is to be done (and nothing below is defined).
  there = redis.call('EXISTS', K.s, K.q)
  if there == 0 then
    if mine then
      redis.call('DEL', K.x, base .. ':h:' .. o)
      return 1
    end
    return 0
  end
end

--@grants
--@common

if mode == 'write' then
  if mine then held = 1 end
  -- Fast handoff: the head of the queue is a live fair writer and no reader holds (a
  -- writer that downgraded still reads): the lock goes to it here, with its waiter
  -- lease until its watchdog renews it, and its token is pushed to the list it blocks on.
  local ours = held == 1 or not v          -- the lock is free once we are done
  local head = ours and redis.call('LPOP', K.q)
  -- Whether any reader holds: it decides both whether our note goes (a writer that
  -- downgraded still reads) and whether a writer at the head may take over. Told by the
  -- EXISTS above: both keys, or one of them, the queue if the LPOP found a head.
  local readers
  if there == 2 then readers = true
  elseif ours then readers = not head
  else readers = redis.call('EXISTS', K.s) == 1 end
  local gone = {}                           -- keys to delete, in one DEL at the end
  if held == 1 and not (readers and redis.call('ZSCORE', K.s, o)) then
    table.insert(gone, base .. ':h:' .. o)
  end
  if ours and not head then                 -- nobody waits
    if held == 1 then table.insert(gone, K.x) end
    if #gone > 0 then redis.call('DEL', unpack(gone)) end
    return held
  end
  if head then
    local request = redis.call('GET', base .. ':w:' .. head)
    local hmode, hlease, _, hwlease, hfair, hctx = parse_meta(request)
    if hmode == 'write' and hfair and not readers then
      local ttl = math.min(hlease, hwlease)
      local tok = grant_write(head, ttl)   -- replaces ours
      table.insert(gone, base .. ':w:' .. head)
      redis.call('DEL', unpack(gone))
      notify(head, fmt(tok), hwlease)
      granted_note(head, ttl, hctx)
      return held
    end
    redis.call('LPUSH', K.q, head)          -- back to the head: the general path below decides
  end
  if held == 1 then table.insert(gone, K.x) end
  if #gone > 0 then redis.call('DEL', unpack(gone)) end
end

if mode == 'read' then
  local deadline = redis.call('ZSCORE', K.s, o)
  if deadline then
    redis.call('ZREM', K.s, o)
    redis.call('HDEL', K.t, o)
    local wv = redis.call('GET', K.x)
    if not (wv and string.match(wv, '^(.*)|%d+$') == o) then        -- unless it still writes
      redis.call('DEL', base .. ':h:' .. o)
    end
    local now = clock()
    if tonumber(deadline) > now then held = 1 end
    extend_shared(now)
  end
  if redis.call('LLEN', K.q) == 0 then return held end
end

--@queue

local now = clock()
expire_readers(now)
local evicted = {}
dispatch(now, evicted, mode == 'write' and held == 1)   -- we just deleted x
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
