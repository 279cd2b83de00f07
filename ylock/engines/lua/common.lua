-- common.lua: the prelude of every ylock script (not a script of its own). The keys come
-- first; the helpers after --@functions are spliced in at a script's --@common line (after
-- its fast path), and the queue machinery of queue.lua at its --@queue line.
--
-- KEYS[1] of every script is the lock's "x" key, "<prefix>:{<group>:<name>}:x"; the other
-- keys of the lock share its {hash tag}, so they live in the same Cluster slot:
--   x  exclusive owner and its token: string "owner|token", PX = its lease
--   s  shared owners: zset owner -> lease deadline (ms, Redis time); key PX = latest deadline
--   q  waiter queue: list of owners, FIFO
--   m  waiter metadata: hash owner -> "mode|lease_ms|since_ms|waiter_lease_ms|fair"
--   t  tokens of the shared owners: hash owner -> fencing token
--   f  fence: the last token issued, kept for the retention period
--   <base>:w:<owner>  waiter liveness: PX = waiter lease, refreshed by every poll
--   <base>:n:<owner>  notify list: the waiter blocks on it (BLPOP); a grant pushes the token
-- Time always comes from Redis (TIME), never from a client clock. __RETENTION_MS__ and
-- __BARGE_MS__ are replaced by the engine's settings when the script is loaded.

local RETENTION = __RETENTION_MS__
local BARGE = __BARGE_MS__
local base = string.sub(KEYS[1], 1, -3)
local K = {x = KEYS[1], s = base .. ':s', q = base .. ':q', m = base .. ':m', t = base .. ':t',
           f = base .. ':f', base = base}

--@functions (a script's fast path runs above this line: defining the helpers below costs
-- the server about a microsecond per call, so scripts splice them in at their --@common line)

local function clock()
  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  return sec * 1000 + math.floor(usec / 1000), sec * 1000000 + usec
end

local function fmt(n) return string.format('%.0f', n) end

-- The exclusive owner and its token, or nil.
local function writer_of()
  local v = redis.call('GET', K.x)
  if not v then return nil, nil end
  local o, tok = string.match(v, '^(.*)|(%d+)$')
  return o, tonumber(tok)
end

-- Tokens: one more than the last; when the fence key expired, the server clock in
-- microseconds (clock() is called only then), so tokens keep increasing (unless the
-- clock steps back by more than the retention period). peek_token() computes it,
-- store_token() records it (the write fast path stores only if it got the lock).
local function peek_token(now_us)
  local last = redis.call('GET', K.f)
  if last then return tonumber(last) + 1 end
  if not now_us then
    local _
    _, now_us = clock()
  end
  return now_us
end

local function store_token(tok)
  redis.call('SET', K.f, fmt(tok), 'PX', RETENTION)
end

local function next_token(now_us)
  local tok = peek_token(now_us)
  store_token(tok)
  return tok
end

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

