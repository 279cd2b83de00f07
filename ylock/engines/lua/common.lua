-- common.lua: helpers prepended to every ylock script (not a script of its own).
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

-- Tokens: one more than the last, and never below the server clock in microseconds, so
-- they keep increasing even after the fence key expired (unless the clock steps back by
-- more than the retention period).
local function next_token(now_us)
  local last = tonumber(redis.call('GET', K.f) or '0')
  local tok = math.max(last + 1, now_us)
  redis.call('SET', K.f, fmt(tok), 'PX', RETENTION)
  return tok
end

local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- Forget readers whose lease ran out (their tokens too).
local function expire_readers(now)
  local dead = redis.call('ZRANGEBYSCORE', K.s, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', K.s, '-inf', now)
    redis.call('HDEL', K.t, unpack(dead))
  end
end

local function extend_shared(now)
  local last = redis.call('ZRANGE', K.s, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', K.s, math.max(1, tonumber(last[2]) - now)) end
end

local function meta(o)
  local v = redis.call('HGET', K.m, o)
  if not v then return nil end
  local mode, lease, since, wlease, fair = string.match(v, '^(%a+)|(%d+)|(%d+)|(%d+)|(%d)$')
  return mode, tonumber(lease), tonumber(since), tonumber(wlease), fair == '1'
end

local function dequeue(o)
  redis.call('LREM', K.q, 1, o)
  redis.call('HDEL', K.m, o)
  redis.call('DEL', base .. ':w:' .. o, base .. ':n:' .. o)
end

-- Make o the writer for lease ms, keeping tok if given (a re-grant); return the token.
local function grant_write(o, lease, now_us, tok)
  tok = tok or next_token(now_us)
  redis.call('SET', K.x, o .. '|' .. fmt(tok), 'PX', lease)
  return tok
end

-- Make o a reader for lease ms; a writer downgrading passes its own token.
local function grant_read(o, lease, now, now_us, tok)
  tok = tok or tonumber(redis.call('HGET', K.t, o) or false) or next_token(now_us)
  redis.call('ZADD', K.s, now + lease, o)
  extend_shared(now)
  redis.call('HSET', K.t, o, fmt(tok))
  extend(K.t, lease)
  return tok
end

local function notify(o, value, ttl)
  local n = base .. ':n:' .. o
  if value == 'wake' and redis.call('LLEN', n) > 0 then return end
  redis.call('RPUSH', n, value)
  redis.call('PEXPIRE', n, ttl)
end

-- Drop waiters at the head of the queue whose liveness key expired; return the live head.
local function live_head(evicted)
  while true do
    local head = redis.call('LINDEX', K.q, 0)
    if not head then return nil end
    if redis.call('EXISTS', base .. ':w:' .. head) == 1 then return head end
    redis.call('LPOP', K.q)
    redis.call('HDEL', K.m, head)
    redis.call('DEL', base .. ':n:' .. head)
    table.insert(evicted, head)
  end
end

-- Hand the lock on from the head of the queue. A fair head is granted the lock right
-- here (with its short waiter lease, until its watchdog renews it) and gets its token
-- pushed; a run of readers is granted together. A non-fair head is only woken.
local function dispatch(now, now_us, evicted)
  if redis.call('EXISTS', K.x) == 1 then return end
  local granted = 0
  while granted < 1000 do
    local head = live_head(evicted)
    if not head then return end
    local mode, lease, since, wlease, fair = meta(head)
    if not mode then redis.call('LPOP', K.q) else
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
      local tok
      if mode == 'write' then
        tok = grant_write(head, math.min(lease, wlease), now_us)
      else
        tok = grant_read(head, math.min(lease, wlease), now, now_us)
      end
      redis.call('LPOP', K.q)
      redis.call('HDEL', K.m, head)
      notify(head, fmt(tok), wlease)
      if mode == 'write' then return end
      granted = granted + 1
    end
  end
end

-- Fair: a writer enters a free lock only at the head of the queue; a reader enters a
-- lock without a writer if every waiter ahead of it is a reader. Non-fair: anyone enters
-- a compatible lock unless the head has waited past the barge window, or (for a reader)
-- the head is a writer. (The same rule as ylock.engines.local.may_enter.)
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
      if meta(a) ~= 'read' then return false end
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
