-- common.lua: the prelude of every ylock script (not a script of its own). The keys come
-- first; the helpers between --@grants and --@functions are spliced in at a script's
-- --@grants line (else first), those after --@functions at its --@common line (after its
-- fast path), and the queue machinery of queue.lua at its --@queue line.
--
-- Every key a script touches is declared in KEYS (but other owners' notify lists, see
-- below), so that a Redis Cluster node whose slot is being migrated answers TRYAGAIN (some
-- of the keys here, some on the other node) or ASK (none here) instead of running a script
-- on half of a lock: a key a script did not declare is only checked when the script
-- touches it, and fails it midway ("Script attempted to access a non local key"), after
-- its earlier writes. The keys of one lock share its {hash tag}, so they live in one slot:
--   KEYS[1] x  the writer and the fence, "<token>|<deadline ms>|<ctx length>|<ctx><owner>":
--              the last token issued for this name (fencing token of the writer, if any),
--              until when the writer holds (Redis time), and what it is doing; a free
--              lock's x is its fence alone, "<token>|0|0|". PX = the writer's lease plus the
--              retention period, so the fence outlives the last hold by the retention.
--   KEYS[2] q  waiter queue: list of owners, FIFO; PX = the longest waiter lease
--   KEYS[3] w  the waiters' requests: hash owner -> "<alive until ms>|mode|lease_ms|since_ms|
--              waiter_lease_ms|fair|<hub>|<context JSON>" (every poll moves "alive until" on; a
--              waiter past it is dead, and evicted when it reaches the head of the queue);
--              an owner is in w exactly when it is in q (so "am I queued" is one field)
--   KEYS[4] s  shared owners: zset owner -> lease deadline (ms, Redis time); key PX = latest deadline
--   KEYS[5] t  the shared owners' tokens and what they are doing: hash owner -> "<token>[|<ctx>]"
--   KEYS[6] i  the index of what is held and queued (see keys.py): on one server the set
--              of the group's lock names (a semaphore's as "/<name>"), on a Cluster the
--              sorted set of "<group>/<name>" of the locks in this slot
--   KEYS[7] g  one server: the set of the groups whose index is not empty; Cluster: i again
--   KEYS[8] n  (acquire.lua) the caller's own notify list; a semaphore's scripts take
--              KEYS[8] c (the permit count last asked for) and KEYS[9] n
-- Other owners' notify lists, "<base>:n:<owner>", are not declared (a script cannot know
-- whom it will hand the lock to before it runs): pushes to them go through pcall, so one
-- that a migration moved away fails alone, and its waiter finds the grant at its next poll.
-- A waiter that waits through its event loop's notify hub (one server only) names the hub
-- in its request, "<hub id>.<tag>": its grant goes to the hub's own list, "<prefix>:hub:<hub
-- id>", as "<its notify list>.<tag>|<token>", so the hub blocks on one key however many tasks
-- wait (a BLPOP over every waiter's list would cost each handoff O(waiters)). The tag names
-- the request: a grant pushed for an earlier request of the same owner (one its poll took
-- meanwhile, or one given up) can linger in the hub's list, which no script can clear; it
-- must never pass for a grant of a later request (it did: two holders).
-- Time always comes from Redis (TIME), never from a client clock. __RETENTION_MS__,
-- __BARGE_MS__ and __INDEX__ are replaced by the engine's settings when the script is loaded.

local RETENTION = __RETENTION_MS__
local BARGE = __BARGE_MS__
local INDEX = '__INDEX__'      -- "set": one server; "zset": a Cluster (the index per slot)
local base = string.sub(KEYS[1], 1, -3)
local K = {x = KEYS[1], q = KEYS[2], w = KEYS[3], s = KEYS[4], t = KEYS[5], i = KEYS[6], g = KEYS[7], n = KEYS[8]}

--@grants (the helpers that grants need, spliced at a script's --@grants line, else right here:
-- a script that can answer before it grants anything answers above it; defining a function
-- costs the server a fraction of a microsecond)

-- The server clock in µs, read once per script call: a script runs atomically, so one TIME
-- serves every stamp and token it makes (a second call would cost a command and tell
-- nothing new; tokens issued in one call still rise through the fence).
-- It also leaves its digits as the last number formatted (see fmt): an uncontended grant's
-- token is the clock, so it is written without a string.format.
local TIME_US, FMT_N, FMT_S
local function now_us()
  if not TIME_US then
    local t = redis.call('TIME')
    local us = t[2]
    TIME_US = tonumber(t[1]) * 1000000 + tonumber(us)
    FMT_N, FMT_S = TIME_US, t[1] .. string.rep('0', 6 - #us) .. us
  end
  return TIME_US
end

local function clock() return math.floor(now_us() / 1000) end

-- A number as the integer Redis reads (tostring would give 1.7e+15), remembering the last
-- one: string.format costs the server about as much as a command.
local function fmt(n)
  if n ~= FMT_N then FMT_N, FMT_S = n, string.format('%.0f', n) end
  return FMT_S
end

-- x's record (see KEYS[1]): the token (digits), the deadline (ms), what the writer is doing
-- and the writer ('' for none), or nil when there is no x. An x written by a version before
-- the fence moved into x ("<owner>|<token>", PX = its lease) reads as that writer, holding
-- for its key's time to live.
local function x_record()
  local v = redis.call('GET', K.x)
  if not v then return nil end
  local tok, dl, n, p = string.match(v, '^(%d+)|(%d+)|(%d+)|()')
  if tok then
    n = tonumber(n)
    return tok, tonumber(dl), string.sub(v, p, p + n - 1), string.sub(v, p + n)
  end
  local o, old = string.match(v, '^(.*)|(%d+)$')
  if not o then return nil end
  return old, clock() + math.max(0, redis.call('PTTL', K.x)), '', o
end

-- The live writer (its lease not run out) and its token, or nil.
local function writer_of()
  local tok, dl, _, o = x_record()
  if tok and o ~= '' and dl > clock() then return o, tonumber(tok) end
  return nil, nil
end

-- Tokens: at least the server clock in microseconds and above the last one issued here,
-- max(fence + 1, TIME in µs); ``count`` tokens at once for a run of readers (the fence
-- becomes the last of them: see fence_to). The clock floor is what makes tokens rise across
-- a failover: a promoted replica that never saw the old master's last fence, or a resumed
-- old master, still issues tokens above every one given before, provided the two servers'
-- clocks agree within the failover time (the old master's last token is at most its clock
-- at the crash, the promoted one's clock then has run for at least the failure detection
-- time) and at most one token per µs per lock name is issued (a faster run puts the fence
-- ahead of the clock by the excess). The fence, x's token, only guards against a clock
-- stepping back and a run above one token per µs, so it lives a short retention from its
-- last hold. Returns the first of the new tokens; the caller writes x.
local function next_token()
  local first = now_us()
  local fence = tonumber((x_record()))
  if fence and fence >= first then first = fence + 1 end
  return first
end

-- x as the fence alone, at ``last`` (readers and permits were granted tokens up to it).
local function fence_to(last)
  redis.call('SET', K.x, fmt(last) .. '|0|0|', 'PX', RETENTION)
end

-- Make o the writer for lease ms, doing ctx, with token tok (a new one if nil); return it.
local function grant_write(o, lease, tok, ctx)
  tok = tok or next_token()
  redis.call('SET', K.x, fmt(tok) .. '|' .. (clock() + lease) .. '|' .. #ctx .. '|' .. ctx .. o,
             'PX', lease + RETENTION)
  return tok
end

-- The lock's entry in the index of what is held and queued, and (one server) its group.
local function index_member()
  local group, name, sem = string.match(base, '{([^:]*):(.*)}(.*)$')
  if sem ~= '' then name = '/' .. name end
  if INDEX == 'zset' then return group .. '/' .. name, group end
  return name, group
end

-- List the lock (it is held or queued now); idempotent.
local function index_add()
  local m, group = index_member()
  if INDEX == 'zset' then
    redis.call('ZADD', K.i, 0, m)
  elseif redis.call('SADD', K.i, m) == 1 then
    redis.call('SADD', K.g, group)
  end
end

-- Unlist the lock (nobody holds or waits for it any more), and its group with its last lock.
local function index_drop()
  local m, group = index_member()
  if INDEX == 'zset' then
    redis.call('ZREM', K.i, m)
  elseif redis.call('SREM', K.i, m) == 1 and redis.call('EXISTS', K.i) == 0 then
    redis.call('SREM', K.g, group)
  end
end

-- A waiter's request (see parse_meta): alive until, mode, the lease and waiter lease it asked
-- for (ms, as sent), since now, fair ("1"/"0"), the hub it waits through ('' for none: its
-- own notify list), what it is doing.
local function request(mode, lease, now, wlease, fair, ctx, hub)
  return (now + tonumber(wlease)) .. '|' .. mode .. '|' .. lease .. '|' .. now .. '|' .. wlease .. '|' ..
         fair .. '|' .. (hub or '') .. '|' .. ctx
end

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- Queue o with its request; the queue and the requests live as long as their longest waiter lease.
local function enqueue(o, req, wlease)
  redis.call('RPUSH', K.q, o)
  redis.call('HSET', K.w, o, req)
  extend(K.q, wlease)
  extend(K.w, wlease)
end

--@functions (a script's fast path runs above this line: its helpers are spliced in at
-- the script's --@common line)

-- A waiter's request from its field in w: alive until, mode, lease, since, waiter lease,
-- fair, what it is doing, and the hub it waits through; nil when unreadable.
local function parse_meta(v)
  if not v then return nil end
  local alive, mode, lease, since, wlease, fair, hub, ctx =
    string.match(v, '^(%d+)|(%a+)|(%d+)|(%d+)|(%d+)|([01])|([%w%.]*)|(.*)$')
  if not alive then return nil end
  return tonumber(alive), mode, tonumber(lease), tonumber(since), tonumber(wlease), fair == '1', ctx, hub
end

-- A live waiter's request (mode, lease, since, waiter lease, fair, ctx, hub), or nil once its
-- liveness ran out (or it is not queued).
local function meta(o, now)
  local alive, mode, lease, since, wlease, fair, ctx, hub = parse_meta(redis.call('HGET', K.w, o))
  if not alive or alive <= now then return nil end
  return mode, lease, since, wlease, fair, ctx, hub
end

-- Keep o alive in the queue until ``alive`` (ms); return false if o is not queued.
local function refresh(o, alive)
  local v = redis.call('HGET', K.w, o)
  if not v then return false end
  redis.call('HSET', K.w, o, alive .. string.sub(v, (string.find(v, '|', 1, true))))
  return true
end

-- Keep the shared owners' key until the latest reader deadline.
local function extend_shared(now)
  local last = redis.call('ZRANGE', K.s, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', K.s, math.max(1, tonumber(last[2]) - now)) end
end

-- Push a token (or 'wake') to o's notify list, on which it blocks, or to its hub's list. Another
-- owner's list is not declared (see the keys above): a push that fails (its key migrated away)
-- is dropped, and the waiter finds its grant at its next poll.
local function notify(o, value, ttl, hub)
  local n = base .. ':n:' .. o
  if hub and hub ~= '' then
    local id, tag = string.match(hub, '^(%w+)%.?(%w*)$')
    local list = string.sub(base, 1, (string.find(base, ':{', 1, true)) - 1) .. ':hub:' .. id
    if tag ~= '' then n = n .. '.' .. tag end
    if type(redis.pcall('RPUSH', list, n .. '|' .. value)) == 'number' then redis.pcall('PEXPIRE', list, ttl) end
    return
  end
  if value == 'wake' then
    local len = redis.pcall('LLEN', n)
    if type(len) ~= 'number' or len > 0 then return end
  end
  if type(redis.pcall('RPUSH', n, value)) == 'number' then redis.pcall('PEXPIRE', n, ttl) end
end

-- Forget o's notify list (a dead waiter evicted): best effort, as notify.
local function forget_notify(o)
  redis.pcall('DEL', base .. ':n:' .. o)
end

-- Whether nobody holds the lock and nobody waits for it (so it leaves the index).
local function idle()
  return redis.call('EXISTS', K.q, K.s) == 0 and not writer_of()
end

-- What the holders said they are doing, for a waiter whose try asked (its fourth flag: it
-- traces its wait, and links to the holders' spans without a request of its own):
-- {owner, "<since ms>|<context>", ...} (since: from the token, the server clock in µs at the
-- grant), holders that said nothing left out.
local function holder_notes(now)
  local notes = {}
  local tok, dl, wctx, writer = x_record()
  if tok and writer ~= '' and dl > now and wctx ~= '' then
    table.insert(notes, writer)
    table.insert(notes, fmt(math.floor(tonumber(tok) / 1000)) .. '|' .. wctx)
  end
  for _, h in ipairs(redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf')) do
    local htok, said = string.match(redis.call('HGET', K.t, h) or '', '^(%d+)|(.+)$')
    if said then
      table.insert(notes, h)
      table.insert(notes, fmt(math.floor(tonumber(htok) / 1000)) .. '|' .. said)
    end
  end
  return notes
end
