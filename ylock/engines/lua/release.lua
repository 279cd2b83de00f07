-- release.lua: release one owner's hold in one mode, then hand the lock to the queue.
-- KEYS[1] = the lock's x key (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read"
-- Returns 1 if the owner still held it (else 0: its lease had run out) when nobody waits,
-- else {that, evicted...} after handing the lock on.
local o, mode = ARGV[1], ARGV[2]
local held = 0
if mode == 'write' then             -- fast path: writer_of() of common.lua, written out
  local v = redis.call('GET', K.x)
  if v and string.match(v, '^(.*)|%d+$') == o then
    redis.call('DEL', K.x)
    held = 1
  end
  if redis.call('LLEN', K.q) == 0 then return held end   -- nobody to hand the lock to
end

--@common

if mode == 'read' then
  local deadline = redis.call('ZSCORE', K.s, o)
  if deadline then
    redis.call('ZREM', K.s, o)
    redis.call('HDEL', K.t, o)
    local now = clock()
    if tonumber(deadline) > now then held = 1 end
    local last = redis.call('ZRANGE', K.s, -1, -1, 'WITHSCORES')
    if last[2] then redis.call('PEXPIRE', K.s, math.max(1, tonumber(last[2]) - now)) end
  end
  if redis.call('LLEN', K.q) == 0 then return held end
end

--@queue

local now, now_us = clock()
expire_readers(now)
local evicted = {}
dispatch(now, now_us, evicted, mode == 'write' and held == 1)   -- we just deleted x
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
