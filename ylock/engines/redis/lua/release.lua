-- release.lua: release one owner's hold in one mode, then hand the lock to the queue.
-- KEYS: x q w s t i g (see common.lua)
-- ARGV[1] owner  ARGV[2] mode: "write" | "read"
-- Returns 1 if the owner still held it (else 0: its lease had run out) when nothing more
-- was to be done or a fair writer was handed the lock, else {that, evicted...}.
local o, mode = ARGV[1], ARGV[2]
local held = 0
local fence, live, there
if mode == 'write' then
  local dl, _, writer
  fence, dl, _, writer = x_record()
  live = fence and writer ~= '' and dl > clock()
  if live and writer == o then held = 1 end
  -- Nobody reads and nobody waits (the uncontended case, one command to tell): x becomes
  -- the fence alone if the lock was ours, and the lock leaves the index if nobody holds it.
  there = redis.call('EXISTS', K.s, K.q)
  if there == 0 then
    if held == 1 then
      redis.call('SET', K.x, fence .. '|0|0|', 'PX', RETENTION)
      index_drop()
    elseif not live then
      index_drop()
    end
    return held
  end
end

--@common
--@queue

local now = clock()
if mode == 'write' then
  -- The lock is free once we are done if it was ours, or nobody's (our lease ran out).
  local ours = held == 1 or not live
  if ours then
    -- Fast handoff: the head of the queue is a live fair writer and no reader holds (a
    -- writer that downgraded still reads): the lock goes to it here, with its waiter
    -- lease until its watchdog renews it, and its token is pushed to the list it blocks on.
    local head = redis.call('LINDEX', K.q, 0)
    if head then
      local alive, hmode, hlease, _, hwlease, hfair, hctx, hhub = parse_meta(redis.call('HGET', K.w, head))
      -- (a reader holds if both s and q exist: there counted them)
      if alive and alive > now and hmode == 'write' and hfair and there == 1 then
        local tok = grant_write(head, math.min(hlease, hwlease), nil, hctx)   -- replaces ours
        redis.call('LPOP', K.q)
        redis.call('HDEL', K.w, head)
        notify(head, fmt(tok), hwlease, hhub)
        return held
      end
    end
    if held == 1 then redis.call('SET', K.x, fence .. '|0|0|', 'PX', RETENTION) end
    if not head then                        -- nobody waits (readers hold)
      return held
    end
  end
end

if mode == 'read' then
  local deadline = redis.call('ZSCORE', K.s, o)
  if deadline then
    redis.call('ZREM', K.s, o)
    redis.call('HDEL', K.t, o)
    if tonumber(deadline) > now then held = 1 end
    extend_shared(now)
  end
  if redis.call('LLEN', K.q) == 0 then
    if idle() then index_drop() end
    return held
  end
end

expire_readers(now)
local evicted = {}
dispatch(now, evicted, mode == 'write' and (held == 1 or not live))   -- x is free: we freed it, or it was
if idle() then index_drop() end
local out = {held}
for _, e in ipairs(evicted) do table.insert(out, e) end
return out
