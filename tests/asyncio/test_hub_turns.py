"""The asyncio notify hub (``ylock.engines.redis.hubs.NotifyHub``) while the tasks of one
loop take turns on a fair lock: the grants come to the hub's own list, so a task that waits
again needs no wake-up, and the hub blocks on one key however many tasks wait. The turns
stay fair and exclusive."""
from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio

import ylock
from ylock.testing.redis import RedisServer

TASKS = 8
TURNS = 40


def test_tasks_taking_turns_send_no_wake_ups_and_one_blpop_per_handoff(group):
    with RedisServer() as server:
        engine = ylock.engine_from_url(server.url)
        admin = redis.Redis.from_url(server.url)
        inside: list[int] = []
        order: list[int] = []

        async def worker(lock: ylock.Lock, me: int) -> None:
            for _ in range(TURNS):
                await lock.alock(timeout=30)
                inside.append(me)
                assert len(inside) == 1            # exclusive
                order.append(me)
                await asyncio.sleep(0)             # the others queue meanwhile
                inside.pop()
                await lock.aunlock()

        async def main() -> None:
            lock = ylock.Lock(engine, group, "turns", fair=True)
            await lock.alock()
            await lock.aunlock()
            admin.config_resetstat()
            await asyncio.gather(*(worker(lock, me) for me in range(TASKS)))

        try:
            asyncio.run(main())
            stats = admin.info("commandstats")
        finally:
            engine.close()
    acquisitions = TASKS * TURNS
    assert len(order) == acquisitions
    wake_ups = stats.get("cmdstat_lpush", {}).get("calls", 0)
    blpops = stats.get("cmdstat_blpop", {}).get("calls", 0)
    # Each task's first wait may wake the hub once; later waits find their key watched.
    assert wake_ups <= 2 * TASKS, f"{wake_ups} wake-ups for {acquisitions} acquisitions"
    assert blpops <= acquisitions + 2 * TASKS, f"{blpops} BLPOPs for {acquisitions} acquisitions"
    # Fair: once all queue, nobody takes two turns while another waits (FIFO hand-offs).
    steady = order[TASKS:-TASKS]
    assert all(a != b for a, b in zip(steady, steady[1:])), order


def test_a_value_popped_between_two_waits_of_a_task_makes_its_next_wait_a_wake_up():
    from ylock.engines.redis.calls import AsyncDirectCalls
    from ylock.engines.redis.hubs import NotifyHub

    async def main(server: RedisServer) -> tuple[object, object, float]:
        pool = redis.asyncio.ConnectionPool.from_url(server.url)
        calls = AsyncDirectCalls(pool)
        hub = NotifyHub(pool, calls, "ylock:hub:test")
        other = asyncio.create_task(hub.wait("ylock-test-a", 30))    # keeps the hub blocking
        first = await hub.wait("ylock-test-b", 0.2)                   # nothing yet: times out
        # a grant for b, pushed as a release pushes it (to the hub's list), between b's waits: popped
        await calls("RPUSH", "ylock:hub:test", "ylock-test-b|granted", end=time.monotonic() + 2)
        for _ in range(500):
            if "ylock-test-b" in hub._early:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        second = await hub.wait("ylock-test-b", 5)
        elapsed = time.monotonic() - started
        other.cancel()
        await asyncio.gather(other, return_exceptions=True)
        await hub.aclose()
        await pool.disconnect()
        return first, second, elapsed

    with RedisServer() as server:
        first, second, elapsed = asyncio.run(main(server))
    assert first is None
    # Not the value (it may be a grant that the task's try took already), a wake-up: the
    # task tries again at once rather than wait out its timeout.
    assert second == ("ylock-test-b", b"wake")
    assert elapsed < 1.0, elapsed


def test_a_grant_left_in_the_hub_for_an_earlier_acquisition_never_passes_for_a_later_one(group):
    """A release pushes a waiter's grant to its loop's hub list; when the waiter's own poll
    took the grant first (or it gave up), that push stays in the list, which no script can
    clear, until the hub pops it, maybe when the same owner (a task looping over one lock)
    waits for the lock again. Untagged, it was handed over as the new acquisition's grant:
    a second holder with an old token (a clean-clone CI run lost a hold that way). Here two
    such pushes, untagged and tagged with the earlier acquisition's request, wait in the
    hub's list while a writer holds: the later acquisition of the same owner times out."""
    with RedisServer() as server:
        engine = ylock.engine_from_url(server.url)
        admin = redis.Redis.from_url(server.url)
        holder = ylock.Lock(engine, group, "n")
        holder.lock()
        held = holder.token
        owner = f"{group}-worker"

        async def waits() -> tuple[bool, int]:
            with ylock.owner_scope(owner):
                lock = ylock.Lock(engine, group, "n")
                earlier = await lock.atry_lock(0.2)          # queued, waited through the hub
                hub = engine._async[asyncio.get_running_loop()].hub
                assert hub is not None
                notify = f"{engine._keys_of(group, 'n', 'write')[0][:-2]}:n:{owner}"
                admin.rpush(hub.hub_key, f"{notify}|{held}", f"{notify}.1|{held}")
                later = await lock.atry_lock(1.0)
                if later:
                    await lock.aunlock()
                return earlier or later, int(admin.llen(hub.hub_key))

        async def takes() -> int | None:
            with ylock.owner_scope(owner):
                lock = ylock.Lock(engine, group, "n")
                assert await lock.atry_lock(5.0)
                token = lock.token
                await lock.aunlock()
                return token

        try:
            taken, left = asyncio.run(waits())
            holder.unlock()
            assert not taken, "a grant pushed for an earlier acquisition was taken for a later one"
            assert left == 0, "the hub did not pop the pushes (the control)"
            token = asyncio.run(takes())
            assert token is not None and held is not None and token > held
        finally:
            engine.close()
