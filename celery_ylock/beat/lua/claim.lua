-- Claim one run of a schedule entry before it is sent (celery_ylock.beat): the check that a
-- leader paused past its lease cannot pass, made in the same round trip as the record.
--
-- KEYS[1]  the state hash: <prefix>:beat:{<group>:<name>} (see lead.lua)
-- ARGV[1]  the claiming term's fencing token (decimal)
-- ARGV[2]  the entry's field: "e:<entry name>"
-- ARGV[3]  the record the claimer last saw for the entry ("" for none)
-- ARGV[4]  the new record (JSON: when it ran, run count, token, sender)
--
-- Returns {1} (recorded: send it); {0, fence} when the fence is not the token (a newer term
-- began, or the state was reset: the claimer must start its term again before sending);
-- {2, current record or ""} when the entry's record is not the one the claimer saw.

local fence = redis.call('HGET', KEYS[1], 'fence') or '0'
if fence ~= ARGV[1] then
  return {0, fence}
end
local current = redis.call('HGET', KEYS[1], ARGV[2]) or ''
if current ~= ARGV[3] then
  return {2, current}
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[4])
return {1}
