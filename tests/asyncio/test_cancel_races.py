"""Cancellations that race the lock's own awaits: 40 tasks wait for a held lock and are
cancelled, at once or one by one at random moments, 20 rounds each. On Python < 3.12 a
layer below ylock (asyncio.wait_for, which redis-py's asyncio sends use) drops a
cancellation that lands as the awaited call completes; ylock must notice it anyway. Every
task ends cancelled at once, and none is left waiting or holding."""
from __future__ import annotations

import asyncio
import random
import time

import pytest

import ylock

pytestmark = pytest.mark.timeout(120)

WAITERS = 40
ROUNDS = 20


def queue_of(observer: ylock.Engine, group: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(owners, waiters) of the lock."""
    info = observer.describe_lock(group, "n")
    return ((), ()) if info is None else (info.owners, info.waiters)


@pytest.mark.parametrize("cancels", ["at once", "at random moments"])
def test_cancelled_waiters_never_wait_on_or_hold(redis_server, group, cancels):
    engine = ylock.engine_from_url(redis_server.url)
    observer = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "n")
    rng = random.Random(11)

    async def rounds() -> list[str]:
        problems = []
        for n in range(ROUNDS):
            tasks = [asyncio.create_task(lock.alock(timeout=30)) for _ in range(WAITERS)]
            deadline = time.monotonic() + 20
            seen: set[str] = set()      # each seen queued once (a late poll leaves the queue a moment)
            while len(seen) < WAITERS:
                assert time.monotonic() < deadline, "the waiters never queued"
                seen.update((await asyncio.to_thread(queue_of, observer, group))[1])
                await asyncio.sleep(0.005)
            for task in tasks:
                task.cancel()
                if cancels == "at random moments":
                    await asyncio.sleep(rng.random() * 0.005)
            done, pending = await asyncio.wait(tasks, timeout=2)
            owners, waiting = await asyncio.to_thread(queue_of, observer, group)
            outcomes = sorted({"cancelled" if t.cancelled() else repr(t.exception()) for t in done})
            if pending or waiting or outcomes != ["cancelled"] or len(owners) != 1:
                problems.append(f"round {n}: {len(pending)} tasks went on waiting, outcomes {outcomes}, "
                                f"{len(waiting)} still queued, holders {owners}")
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return problems

    lock.lock()                 # held by this thread: the tasks (other owners) queue behind it
    try:
        problems = asyncio.run(rounds())
        assert queue_of(observer, group)[0] == (ylock.owner.current_owner(),)
    finally:
        lock.unlock()
        engine.close()
    assert not problems, problems
    assert queue_of(observer, group) == ((), ())
    observer.close()
