-- sem_release.lua: give back one owner's permit, then hand free permits to the queue.
-- KEYS[1] = the semaphore's x key (see sem_acquire.lua)
-- ARGV[1] owner
-- Returns 1 if the owner still held a permit (else 0: its lease had run out), bare when
-- nobody waited, else {that, evicted...}.
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
    redis.call('DEL', base .. ':h:' .. o, base .. ':c')           -- idle: nothing left
  else
    redis.call('DEL', base .. ':h:' .. o)
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
  redis.call('DEL', base .. ':h:' .. o)
  if tonumber(deadline) > now then held = 1 end
end
expire_readers(now)
extend_shared(now)
local evicted = {}
dispatch_permits(now, tonumber(redis.call('GET', base .. ':c') or '1'), evicted)
if redis.call('EXISTS', K.s, K.q) == 0 then redis.call('DEL', base .. ':c') end   -- idle: nothing left
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
