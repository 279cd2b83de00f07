-- commit: the fenced write of a request's response. Refused when a holder with a newer
-- token has begun or written: a request paused past its lease (while a retry ran) never
-- overwrites the retry's record.
-- KEYS[1]  the record (see begin.lua)
-- ARGV[1]  this holder's fencing token (decimal)
-- ARGV[2]  the request's fingerprint
-- ARGV[3]  the response, encoded (ylock.idempotency.records.StoredResponse.encode)
-- ARGV[4]  time to live in milliseconds
-- Returns 1 when written, 0 when refused.
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local t = redis.call('HGET', KEYS[1], 't')
if t and newer(t, ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
