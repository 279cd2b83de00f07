-- abort: free a key whose request stored nothing (a 5xx, an exception): delete the record
-- if it is still this holder's, in flight.
-- KEYS[1]  the record (see begin.lua)
-- ARGV[1]  this holder's fencing token (decimal)
-- Returns 1 when deleted, 0 when the record is another holder's, done, or gone.
local found = redis.call('HMGET', KEYS[1], 't', 'r')
if found[1] == ARGV[1] and not found[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
