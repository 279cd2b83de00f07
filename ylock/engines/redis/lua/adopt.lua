-- adopt.lua: hand a hold from one owner to another, keeping its token and its lease left
-- (a ticket made by detach() is adopted by another thread or process).
-- KEYS[1] = the x key of the lock, or of the semaphore (see common.lua, sem_acquire.lua)
-- ARGV[1] old owner  ARGV[2] new owner  ARGV[3] mode: "write" | "read" | "permit"  ARGV[4] token
-- Returns 1 if the old owner still held it with that token (now the new owner does), else 0
-- (the hold was lost, or the ticket adopted already).
local old, new, mode, tok = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if mode == 'write' then
  if redis.call('GET', K.x) ~= old .. '|' .. tok then return 0 end
  redis.call('SET', K.x, new .. '|' .. tok, 'KEEPTTL')
  -- A read the old owner holds too is one it does not know of (a downgrade whose answer never
  -- came: detach refuses a hold in both modes): it goes, or it would read beside the new writer.
  if redis.call('ZREM', K.s, old) == 1 then redis.call('HDEL', K.t, old) end
  if redis.call('EXISTS', base .. ':h:' .. old) == 1 then
    redis.call('RENAME', base .. ':h:' .. old, base .. ':h:' .. new)
  end
  return 1
end
local deadline = redis.call('ZSCORE', K.s, old)
if not deadline or tonumber(deadline) <= clock() or redis.call('HGET', K.t, old) ~= tok then return 0 end
redis.call('ZREM', K.s, old)
redis.call('ZADD', K.s, deadline, new)
redis.call('HDEL', K.t, old)
redis.call('HSET', K.t, new, tok)
if redis.call('EXISTS', base .. ':h:' .. old) == 1 then
  redis.call('RENAME', base .. ':h:' .. old, base .. ':h:' .. new)
end
return 1
