-- begin: a request holding its key's lock (with fencing token ARGV[1]) marks the record in
-- flight, unless the key is done already or a newer holder has begun.
-- KEYS[1]  the record (a hash: t = token, f = fingerprint, r = the stored response once done)
-- ARGV[1]  this holder's fencing token (decimal)
-- ARGV[2]  the request's fingerprint
-- ARGV[3]  time to live in milliseconds
-- Returns {} when the record now says "in flight for ARGV[1]" (run the view), else the
-- record found, as {t, f, r or false}: done (replay it, or 422) or begun by a newer token
-- (this holder has lost its lock).
local function newer(a, b)          -- decimal strings without leading zeros, any length
  if #a ~= #b then return #a > #b end
  return a > b
end
local found = redis.call('HMGET', KEYS[1], 't', 'f', 'r')
if found[1] and (found[3] or newer(found[1], ARGV[1])) then
  return {found[1], found[2], found[3]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {}
