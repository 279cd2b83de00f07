-- sem_release.lua: give back one owner's permit, then hand free permits to the queue.
-- KEYS: x q w s t i g c of the semaphore (see sem_acquire.lua)
-- ARGV[1] owner
-- Returns 1 if the owner still held a permit (else 0: its lease had run out), bare when
-- nobody waited, else {that, evicted...}.
K.c, K.n = KEYS[8], nil
local o = ARGV[1]

-- Fast path: nobody waits, so there is nobody to hand the permit to. Returns the bare 1 or 0.
if redis.call('LLEN', K.q) == 0 then
  local held = 0
  local deadline = redis.call('ZSCORE', K.s, o)
  if deadline then
    redis.call('ZREM', K.s, o)
    redis.call('HDEL', K.t, o)
    if tonumber(deadline) > clock() then held = 1 end
  end
  if redis.call('EXISTS', K.s) == 0 then
    redis.call('DEL', K.c)           -- idle: nothing left but the fence
    index_drop()
  end
  return held
end

--@common
--@queue
--@permits
local now = clock()
local held = 0
local deadline = redis.call('ZSCORE', K.s, o)
if deadline then
  redis.call('ZREM', K.s, o)
  redis.call('HDEL', K.t, o)
  if tonumber(deadline) > now then held = 1 end
end
expire_readers(now)
extend_shared(now)
local evicted = {}
dispatch_permits(now, tonumber(redis.call('GET', K.c) or '1'), evicted)
if redis.call('EXISTS', K.s, K.q) == 0 then              -- idle: nothing left but the fence
  redis.call('DEL', K.c)
  index_drop()
end
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
