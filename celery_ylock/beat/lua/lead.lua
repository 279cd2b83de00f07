-- Start a leader's term over the schedule state of one beat lock (celery_ylock.beat).
--
-- KEYS[1]  the state hash: <prefix>:beat:{<group>:<name>}
-- ARGV[1]  the new term's fencing token (decimal, no leading zeros)
-- ARGV[2]  the new term's description (JSON: owner, token, since)
--
-- The hash holds "fence" (the newest term's token), "terms" (how many terms began),
-- "leader" (the newest term's description) and one "e:<entry>" field per schedule entry
-- (the JSON record of its last run).
--
-- Returns {1, previous leader or "", terms, field, value, field, value ...} (the entries'
-- records) once the fence is the token: a term whose token is at least the fence takes it
-- (a term re-reading its own state counts no new term); {0, fence} when a newer term holds
-- the fence (the caller lost its lock and must not send).

local function newer(a, b)      -- decimal strings: is a > b? (tokens pass 2^53: not numbers)
  if #a ~= #b then return #a > #b end
  return a > b
end

local fence = redis.call('HGET', KEYS[1], 'fence') or '0'
local token = ARGV[1]
if newer(fence, token) then
  return {0, fence}
end
local previous = redis.call('HGET', KEYS[1], 'leader') or ''
if token ~= fence then
  redis.call('HSET', KEYS[1], 'fence', token, 'leader', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'terms', 1)
end
local out = {1, previous, tonumber(redis.call('HGET', KEYS[1], 'terms') or '0')}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'e:' then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
