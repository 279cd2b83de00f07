-- common.lua: the prelude of every ylock script (not a script of its own). The keys come
-- first; the helpers between --@grants and --@functions are spliced in at a script's
-- --@grants line (else first), those after --@functions at its --@common line (after its
-- fast path), and the queue machinery of queue.lua at its --@queue line.
--
-- KEYS[1] of every script is the lock's "x" key, "<prefix>:{<group>:<name>}:x"; the other
-- keys of the lock share its {hash tag}, so they live in the same Cluster slot:
--   x  exclusive owner and its token: string "owner|token", PX = its lease
--   s  shared owners: zset owner -> lease deadline (ms, Redis time); key PX = latest deadline
--   q  waiter queue: list of owners, FIFO
--   t  tokens of the shared owners: hash owner -> fencing token
--   f  fence: the last token issued; PX = the retention period from the last token
--   <base>:w:<owner>  a waiter's liveness and request:
--                     "mode|lease_ms|since_ms|waiter_lease_ms|fair|<context JSON>",
--                     PX = waiter lease, refreshed by every poll (one GET tells the releaser
--                     whether the head of the queue is alive, what it asked for and what it
--                     is doing: describe() reads a waiter's description here, and a grant
--                     turns it into the holder's h key without reading anything else)
--   <base>:n:<owner>  notify list: the waiter blocks on it (BLPOP); a grant pushes the token
--   <base>:h:<owner>  a holder's description for describe(): "<since ms>|<context JSON>"
--                     (what its owner is doing), PX = its hold's lease, renewed with it
-- Time always comes from Redis (TIME), never from a client clock. __RETENTION_MS__ and
-- __BARGE_MS__ are replaced by the engine's settings when the script is loaded.

-- (a string: a number passed to redis.call is converted with sprintf each time, which costs
-- the server more than the command it is an argument of)
local RETENTION = '__RETENTION_MS__'
local BARGE = __BARGE_MS__
local base = string.sub(KEYS[1], 1, -3)
local K = {x = KEYS[1], s = base .. ':s', q = base .. ':q', t = base .. ':t', f = base .. ':f', base = base}

--@grants (the helpers that grants need, spliced at a script's --@grants line, else right here:
-- a script that can answer before it grants anything, as an uncontended release, answers above
-- it; defining a function costs the server a fraction of a microsecond: ten of them with the
-- keys above cost 6 µs per call, measured against 5 µs for a script that only returns)

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
-- one: a grant formats its token twice (the fence and x), and string.format costs the
-- server about as much as a command (4 µs measured on the benchmark machine).
local function fmt(n)
  if n ~= FMT_N then FMT_N, FMT_S = n, string.format('%.0f', n) end
  return FMT_S
end

-- Tokens: at least the server clock in microseconds and above the last one issued here,
-- max(fence + 1, TIME in µs); ``count`` tokens at once for a run of readers (the fence
-- becomes the last of them). The clock floor is what makes tokens rise across a failover:
-- a promoted replica that never saw the old master's last fence, or a resumed old master,
-- still issues tokens above every one given before, provided the two servers' clocks agree
-- within the failover time (the old master's last token is at most its clock at the
-- crash, the promoted one's clock then has run for at least the failure detection time)
-- and at most one token per µs per lock name is issued (a faster run puts the fence ahead
-- of the clock by the excess). The fence key only guards against a clock stepping back
-- and a run above one token per µs, so it lives a short retention from its last token.
-- The fence is set to the clock's tokens and read in the same command (SET ... GET); only
-- when it was at or ahead of the clock is it set again, above its old value.
-- Returns the first of the new tokens.
local function next_token(count)
  count = count or 1
  local first = now_us()
  local fence = tonumber(redis.call('SET', K.f, fmt(first + count - 1), 'PX', RETENTION, 'GET') or false)
  if fence and fence >= first then
    first = fence + 1
    redis.call('SET', K.f, fmt(first + count - 1), 'PX', RETENTION)
  end
  return first
end

-- Describe o (a new holder) for describe(): since now, doing ctx, for ttl ms.
local function note(o, ctx, ttl)
  redis.call('SET', base .. ':h:' .. o, fmt(clock()) .. '|' .. ctx, 'PX', ttl)
end

-- The same for a holder granted with what it said in hand (on a fast path, or from its
-- request by granted_note): one that says nothing gets no note, since describe() takes when it was granted
-- from its token (the server clock in µs at the grant), and the command is a sixth of
-- the uncontended acquisition's server time.
local function fast_note(o, ctx, ttl)
  if ctx ~= '' then note(o, ctx, ttl) end
end

-- A waiter's request (see parse_meta): mode, the lease and waiter lease it asked for
-- (ms, as sent), since now, fair ("1"/"0"), what it is doing. It carries the waiter's
-- description, so queueing writes no h key and a poll refreshes one key.
local function request(mode, lease, now, wlease, fair, ctx)
  return mode .. '|' .. lease .. '|' .. fmt(now) .. '|' .. wlease .. '|' .. fair .. '|' .. ctx
end

-- Make o the writer for lease ms, keeping tok if given (a re-grant); return the token.
local function grant_write(o, lease, tok)
  tok = tok or next_token()
  redis.call('SET', K.x, o .. '|' .. fmt(tok), 'PX', lease)
  return tok
end

--@functions (a script's fast path runs above this line: defining the helpers below costs
-- the server about a microsecond per call, so scripts splice them in at their --@common line)

-- A waiter's request from its w key's value: mode, lease, since, waiter lease, fair, and
-- what it is doing (nil from a request written without it, by a script of an older
-- version, whose waiter's description is still in its h key).
local function parse_meta(v)
  if not v then return nil end
  local mode, lease, since, wlease, fair, rest = string.match(v, '^(%a+)|(%d+)|(%d+)|(%d+)|([01])(.*)$')
  local ctx = nil
  if rest and rest ~= '' then
    if string.sub(rest, 1, 1) ~= '|' then return nil end
    ctx = string.sub(rest, 2)
  end
  return mode, tonumber(lease), tonumber(since), tonumber(wlease), fair == '1', ctx
end

-- Keep the shared owners' key until the latest reader deadline.
local function extend_shared(now)
  local last = redis.call('ZRANGE', K.s, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', K.s, math.max(1, tonumber(last[2]) - now)) end
end

-- A waiter granted the lock by another owner: its description (from its request, as for
-- a holder granted on a fast path, or from an h key a script of an older version wrote)
-- says since when it holds, and lives as long as the grant.
local function granted_note(o, ttl, ctx)
  if ctx then return fast_note(o, ctx, ttl) end
  local h = base .. ':h:' .. o
  local v = redis.call('GET', h)
  if v then redis.call('SET', h, fmt(clock()) .. string.sub(v, (string.find(v, '|', 1, true))), 'PX', ttl) end
end

-- Push a token (or 'wake') to o's notify list, on which it blocks.
local function notify(o, value, ttl)
  local n = base .. ':n:' .. o
  if value == 'wake' and redis.call('LLEN', n) > 0 then return end
  redis.call('RPUSH', n, value)
  redis.call('PEXPIRE', n, ttl)
end

-- The exclusive owner and its token, or nil.
local function writer_of()
  local v = redis.call('GET', K.x)
  if not v then return nil, nil end
  local o, tok = string.match(v, '^(.*)|(%d+)$')
  return o, tonumber(tok)
end

-- What the holders said they are doing (their notes), for a waiter whose try asked for them
-- (its fourth flag: it traces its wait, and links to the holders' spans without a request
-- of its own): {owner, "<since ms>|<context>", ...}, holders without a note left out.
local function holder_notes(now)
  local notes = {}
  local holders = redis.call('ZRANGEBYSCORE', K.s, '(' .. now, '+inf')
  local w = writer_of()
  if w then table.insert(holders, w) end
  for _, h in ipairs(holders) do
    local v = redis.call('GET', base .. ':h:' .. h)
    if v then table.insert(notes, h); table.insert(notes, v) end
  end
  return notes
end

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

