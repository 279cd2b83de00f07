-- adopt.lua: hand a hold from one owner to another, keeping its token, its lease left and
-- what it said it is doing (a ticket made by detach() is adopted by another thread or process).
-- KEYS: mode "write": x s t of the lock; "read" and "permit": s t of the lock, or of the semaphore
-- ARGV[1] old owner  ARGV[2] new owner  ARGV[3] mode: "write" | "read" | "permit"  ARGV[4] token
-- Returns 1 if the old owner still held it with that token (now the new owner does), else 0
-- (the hold was lost, or the ticket adopted already).
--@common
local old, new, mode, tok = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if mode == 'write' then
  local fence, dl, ctx, writer = x_record()
  if writer ~= old or fence ~= tok or dl <= clock() then return 0 end
  redis.call('SET', K.x, fence .. '|' .. dl .. '|' .. #ctx .. '|' .. ctx .. new, 'KEEPTTL')
  -- A read the old owner holds too is one it does not know of (a downgrade whose answer never
  -- came: detach refuses a hold in both modes): it goes, or it would read beside the new writer.
  if redis.call('ZREM', KEYS[2], old) == 1 then redis.call('HDEL', KEYS[3], old) end
  return 1
end
K.s, K.t = KEYS[1], KEYS[2]
local deadline = redis.call('ZSCORE', K.s, old)
local v = redis.call('HGET', K.t, old)
if not deadline or tonumber(deadline) <= clock() or not v or string.match(v, '^%d+') ~= tok then return 0 end
redis.call('ZREM', K.s, old)
redis.call('ZADD', K.s, deadline, new)
redis.call('HDEL', K.t, old)
redis.call('HSET', K.t, new, v)
return 1
