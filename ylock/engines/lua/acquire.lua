-- acquire.lua: try to acquire; otherwise join (or stay in) the queue, or leave it.
-- KEYS[1..6] = x, s, q, m, t, f (see common.lua)
-- ARGV[1] owner            ARGV[2] mode: "write" | "read"
-- ARGV[3] lease ms         ARGV[4] fair: "1" | "0"
-- ARGV[5] waiter lease ms  ARGV[6] "1": stay queued if not acquired; "0": last try, leave the queue
-- ARGV[7] fence retention ms  ARGV[8] barge window ms (non-fair)  ARGV[9] key base (for w:/n: keys)
-- Returns {1, token, evicted...} when the owner holds the lock (acquired now, granted by a
-- releaser meanwhile, or a writer downgrading), else {0, ms the holders' leases still run, evicted...}.
local K = {x = KEYS[1], s = KEYS[2], q = KEYS[3], m = KEYS[4], t = KEYS[5], f = KEYS[6], base = ARGV[9]}
local o, mode, lease, fair = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local wlease, stay, retention, barge = tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8])
local now, now_us = clock()
redis.call('ZREMRANGEBYSCORE', K.s, '-inf', now)
local evicted = {}

local function done(status, value)
  local out = {status, value}
  for _, e in ipairs(evicted) do table.insert(out, e) end
  return out
end

-- Granted by a releaser while we waited (or a writer downgrading to read).
local writer = redis.call('GET', K.x)
if (mode == 'write' and writer == o) or (mode == 'read' and redis.call('ZSCORE', K.s, o)) then
  dequeue(K, o)
  redis.call('DEL', K.base .. ':n:' .. o)
  local tok = grant(K, o, mode, lease, now, now_us, retention)
  return done(1, tok)
end
if mode == 'read' and writer == o then
  return done(1, grant(K, o, mode, lease, now, now_us, retention))
end

live_head(K, evicted)
if may_enter(K, o, mode, fair, now, barge) then
  dequeue(K, o)
  redis.call('DEL', K.base .. ':n:' .. o)
  local tok = grant(K, o, mode, lease, now, now_us, retention)
  if mode == 'read' then dispatch(K, now, now_us, retention, evicted) end
  return done(1, tok)
end

if stay then
  if not redis.call('LPOS', K.q, o) then
    redis.call('RPUSH', K.q, o)
    redis.call('HSET', K.m, o, mode .. '|' .. ARGV[3] .. '|' .. fmt(now) .. '|' .. ARGV[5] .. '|' .. ARGV[4])
  end
  redis.call('SET', K.base .. ':w:' .. o, '1', 'PX', wlease)
else
  dequeue(K, o)
  redis.call('DEL', K.base .. ':n:' .. o)
  -- leaving the head of the queue may let the next waiters in
  dispatch(K, now, now_us, retention, evicted)
end
return done(0, blocked_for(K, now))
