-- permits.lua: a semaphore's machinery (spliced into the semaphore scripts at --@permits).
-- A semaphore's keys are a lock's keys under its own base "<prefix>:{<group>:<name>}:p"
-- (same hash tag: same Cluster slot as the lock of that name, but other keys): its fence
-- is its x (never a writer in it), its holders the s zset (owner -> lease deadline) with
-- their tokens in t, its queue q with the waiters' requests in w, and c (KEYS[8]) the number
-- of permits last asked for; the owner's notify list is KEYS[9] (each semaphore script
-- sets K.c and K.n first).

-- Grant permits to the live waiters at the head of the queue while permits are free; each
-- gets its token pushed to the list it waits on (and the short lease until it renews).
local function dispatch_permits(now, permits, evicted)
  local free = permits - redis.call('ZCARD', K.s)
  while free > 0 do
    local head, v = live_head(evicted, now)
    if not head then return end
    local _, _, lease, _, wlease, _, ctx, hub = parse_meta(v)
    redis.call('LPOP', K.q)
    redis.call('HDEL', K.w, head)
    local tok = grant_read(head, math.min(lease, wlease), now, nil, ctx)
    notify(head, fmt(tok), wlease, hub)
    free = free - 1
  end
end

-- Remember the permit count for describe() (and releases that do not say it).
local function remember_permits(permits, lease)
  redis.call('SET', K.c, permits, 'PX', lease)
end
