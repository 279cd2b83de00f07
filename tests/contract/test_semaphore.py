"""The semaphore's contract, on every engine of the contract suite (threads stand in for
owners here; tests/semaphore repeats the essentials with processes)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import ylock
from tests.contract import other, sem
from tests.helpers import Runner, collect, expect_event, wait_until
from ylock import events


def waiting(engine: ylock.Engine, group: str, name: str = "s") -> list[str]:
    for info in engine.describe(group):
        if info.kind == "semaphore" and info.name == name:
            return list(info.waiters)
    return []


def test_at_most_permits_owners_hold_at_once(engine, group):
    first = sem(engine, group)
    first.acquire()
    assert first.held() and isinstance(first.token, int)
    second_token = other(lambda: (s := sem(engine, group), s.try_acquire(), s.token)[2])
    assert isinstance(second_token, int) and second_token > first.token
    assert other(lambda: sem(engine, group).try_acquire(0.1)) is False          # the third waits
    first.release()
    assert other(lambda: sem(engine, group).try_acquire(2)) is True
    assert not first.held() and first.token is None


def test_reentry_takes_no_second_permit(engine, group):
    one = sem(engine, group, permits=1)
    with one:
        token = one.token
        with one.hold(timeout=1):
            assert one.token == token
        assert one.held()
        assert other(lambda: sem(engine, group, permits=1).try_acquire(0.05)) is False
    assert other(lambda: sem(engine, group, permits=1).try_acquire(1)) is True


def test_a_semaphore_and_a_lock_of_the_same_name_are_unrelated(engine, group):
    lock = ylock.Lock(engine, group, "s")
    one = sem(engine, group, permits=1)
    with lock.write(timeout=1), one.hold(timeout=1):
        assert lock.held() and one.held()
        assert lock.token != one.token
    kinds = {i.kind for i in engine.describe(group)}
    assert kinds <= {"lock", "semaphore"}


def test_release_without_a_permit_is_not_owned(engine, group):
    with pytest.raises(ylock.LockNotOwned, match="a permit"):
        sem(engine, group).release()


def test_waiters_are_served_in_order(engine, group):
    holder = sem(engine, group, permits=1)
    holder.acquire()
    order: list[int] = []

    def wait(i: int) -> None:
        s = sem(engine, group, permits=1)
        s.acquire(timeout=20)
        order.append(i)
        s.release()
    runners = []
    for i in range(4):
        runner = Runner(lambda i=i: wait(i))
        runner.start()
        runners.append(runner)
        wait_until(lambda n=i + 1: len(waiting(engine, group)) == n, what=f"{i + 1} waiters queued")
    holder.release()
    for runner in runners:
        runner.outcome(20)
    assert order == [0, 1, 2, 3]


def test_a_release_hands_the_permit_to_the_head_waiter(engine, group):
    holder = sem(engine, group, permits=1)
    holder.acquire()
    got = threading.Event()

    def wait() -> float:
        s = sem(engine, group, permits=1)
        s.acquire(timeout=10)
        got.set()
        took = time.monotonic()
        s.release()
        return took
    runner = Runner(wait)
    runner.start()
    wait_until(lambda: len(waiting(engine, group)) == 1, what="a waiter")
    released = time.monotonic()
    holder.release()
    assert got.wait(5)
    assert runner.outcome() - released < 0.5        # handed over, not found at a later poll


def test_describe_shows_holders_waiters_and_permits(engine, group):
    a, b = sem(engine, group), sem(engine, group)
    a.acquire()
    b_owner: list[str] = []

    def take_b() -> None:
        b.acquire()
        b_owner.append(ylock.current_owner())
        done.wait(10)
        b.release()
    done = threading.Event()
    holder_b = Runner(take_b)
    holder_b.start()
    wait_until(lambda: b_owner, what="the second holder")
    waiter = Runner(lambda: sem(engine, group).try_acquire(10))
    waiter.start()
    wait_until(lambda: len(waiting(engine, group)) == 1, what="a waiter")
    info = next(i for i in engine.describe(group) if i.kind == "semaphore")
    assert info.name == "s" and info.permits == 2 and info.mode == "permit"
    assert set(info.owners) == {ylock.current_owner(), b_owner[0]}
    assert len(info.waiters) == 1 and info.waiters[0].startswith("permit:")
    assert info.as_dict()["kind"] == "semaphore"
    a.release()
    assert waiter.outcome() is True
    done.set()
    holder_b.outcome()


def test_more_permits_admit_waiters_at_once_fewer_admit_none_new(engine, group):
    one = sem(engine, group, permits=1)
    one.acquire()
    assert other(lambda: sem(engine, group, permits=2).try_acquire(1)) is True      # a larger count admits
    # Now two hold. With the count back at 1 nobody new gets in until both have left.
    assert other(lambda: sem(engine, group, permits=1).try_acquire(0.1)) is False
    one.release()
    assert other(lambda: sem(engine, group, permits=1).try_acquire(0.1)) is False   # one holder is left
    info = next(i for i in engine.describe(group) if i.kind == "semaphore")
    assert len(info.owners) == 1                                                     # no holder was evicted


def test_force_release_makes_the_holders_lost(engine, group):
    s = sem(engine, group, permits=1, lease=0.9)
    lost = expect_event(events.LOST, group)
    s.acquire()
    assert engine.force_release(group, "s", kind="semaphore") is True
    assert other(lambda: sem(engine, group, permits=1).try_acquire(5)) is True
    assert lost.wait(10), "the loss was not reported"
    assert s.lost
    with pytest.raises(ylock.LockLost):
        s.release()
    assert engine.force_release(group, "s") is False       # the lock of that name was never held


def test_a_vanished_holder_frees_its_permit(engine, group):
    """A holder that stops renewing (its lease runs out) or whose session ends (ZooKeeper)
    frees its permit for the others."""
    from ylock.engines.base import PERMIT, AcquireRequest
    from ylock.waiting import DEFAULT_POLLING

    if engine.needs_renewal:
        # An owner that never renews: the engine alone, no facade, no watchdog.
        request = AcquireRequest(group, "s", "gone-owner", PERMIT, True, 0.3, time.monotonic() + 5,
                                 DEFAULT_POLLING, 1)
        assert isinstance(engine.acquire(request), int)
    else:
        session = ylock.engine_from_url(engine.url)  # type: ignore[attr-defined]
        assert sem(session, group, permits=1).try_acquire(5)
        session.close()                                # its session ends: its nodes go
    started = time.monotonic()
    assert sem(engine, group, permits=1).try_acquire(5)
    assert time.monotonic() - started < 2.0


def test_async_permits_and_cancellation(engine, group):
    async def main() -> tuple[int, list[str]]:
        one = sem(engine, group, permits=1)
        await one.aacquire()
        waiters = [asyncio.create_task(sem(engine, group, permits=1).aacquire(timeout=10)) for _ in range(3)]
        await asyncio.sleep(0)
        while len(await asyncio.to_thread(waiting, engine, group)) < 3:
            await asyncio.sleep(0.01)
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await one.arelease()
        left = await asyncio.to_thread(waiting, engine, group)
        counter = 0

        async def work() -> None:
            nonlocal counter
            async with sem(engine, group, permits=1).hold(timeout=10):
                value = counter
                await asyncio.sleep(0)
                counter = value + 1
        await asyncio.gather(*[work() for _ in range(10)])
        return counter, left
    counter, left = asyncio.run(main())
    assert left == [] and counter == 10
    holders = [i for i in engine.describe(group) if i.owners]
    assert holders == []


@pytest.mark.parametrize("kind, mode", [("lock", "write"), ("lock", "read"), ("semaphore", "permit")])
def test_a_guard_holds_the_mode_it_is_given_as_data(engine, group, kind, mode):
    """``target.guard(mode)``: the one verb that takes the mode (web views, Celery, all_of)."""
    def target() -> ylock.Lock | ylock.Semaphore:
        return sem(engine, group, permits=1) if kind == "semaphore" else ylock.Lock(engine, group, "g")

    def rival() -> bool:       # another owner: a writer, or the next permit
        guard = target().guard("permit" if kind == "semaphore" else "write")
        got = guard.try_acquire(0)
        if got:
            guard.release()
        return got

    mine = target()
    guard = mine.guard(mode, timeout=1)
    assert (guard.target, guard.mode, guard.timeout) == (mine, mode, 1)
    assert guard.try_acquire() is True and mine.held() and isinstance(mine.token, int)
    assert other(rival) is False
    guard.release()
    assert not mine.held() and other(rival) is True

    async def twice() -> bool:
        got = await guard.atry_acquire()
        held = mine.held()
        await guard.arelease()
        return got and held
    assert asyncio.run(twice()) is True and not mine.held()
    with pytest.raises(ylock.ConfigurationError, match="mode"):
        mine.guard("write" if kind == "semaphore" else "permit")
# -- what holders are doing --------------------------------------------------------------------


def test_holds_say_what_their_owners_are_doing(engine, group):
    lock = ylock.Lock(engine, group, "n")
    permits = sem(engine, group, permits=2)
    before = time.time()
    with ylock.context("POST /orders/{id}", order=42):
        with lock.write(timeout=5, context={"step": "charge"}), permits.hold(timeout=5):
            infos = {i.kind: i for i in engine.describe(group)}
            me = ylock.current_owner()
            said = infos["lock"].context[me]
            assert said["what"] == "POST /orders/{id}" and said["order"] == 42 and said["step"] == "charge"
            assert said["pid"] == __import__("os").getpid() and said["host"]
            assert before - 1 <= said["since"] <= time.time() + 1
            assert infos["semaphore"].context[me]["order"] == 42
            assert "step" not in infos["semaphore"].context[me]
    with lock.write(timeout=5):
        info = next(i for i in engine.describe(group) if i.kind == "lock")
        assert set(info.context[ylock.current_owner()]) == {"host", "pid", "since"}   # nothing said
    assert not [i for i in engine.describe(group) if i.owners]



def test_a_semaphore_held_for_many_leases_is_still_described_as_one(engine, group):
    """What describe() says of a semaphore (its kind and permits) lives as long as its
    holders: a permit renewed over several of its leases keeps the semaphore a semaphore in
    ``ylock list`` and the admin page (the Redis engine kept the permit count for two leases
    from the last acquisition only, then listed a held semaphore as a lock)."""
    held = sem(engine, group, permits=3, lease=1.0)
    with collect(events.RENEWED) as renewals:
        held.acquire()
        try:
            if engine.needs_renewal:          # renewed every third of a lease: 4 s, past twice the
                wait_until(lambda: sum(e.group == group for e in renewals) >= 12, timeout=30,   # waiter lease
                           what="twelve renewals of the permit")
            info = engine.describe_lock(group, "s", kind="semaphore")
            assert info is not None and (info.kind, info.permits, info.owners) == \
                ("semaphore", 3, (ylock.current_owner(),))
            assert [i.kind for i in engine.describe(group) if i.name == "s"] == ["semaphore"]
        finally:
            held.release()
