"""The contract every engine keeps, run against each engine in CONTRACT_ENGINES.

Threads stand in for separate owners here (each thread is its own owner); the
cross-process suite (test_processes.py) repeats the essentials with real processes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

import ylock
from tests.helpers import AsyncVerbs, Runner, collect, expect_event, wait_until, waiters
from ylock import events

VERBS = {"mode": "sync"}


@pytest.fixture(autouse=True, params=["sync", "async"])
def verbs(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every contract test runs twice: through the blocking verbs and through their asyncio
    twins (alock, aunlock, ...; see tests.helpers.AsyncVerbs)."""
    VERBS["mode"] = request.param
    yield request.param
    VERBS["mode"] = "sync"


def make(engine: ylock.Engine, group: str, name: str = "n", **kw: object) -> ylock.Lock:
    lock = ylock.Lock(engine, group, name, **kw)  # type: ignore[arg-type]
    return AsyncVerbs(lock) if VERBS["mode"] == "async" else lock  # type: ignore[return-value]


def other_thread(func):  # noqa: ANN001, ANN201
    runner = Runner(func)
    runner.start()
    return runner.outcome()


# -- basics --------------------------------------------------------------------------------


def test_lock_unlock_and_held(engine, group):
    lock = make(engine, group)
    assert not lock.held() and lock.token is None
    lock.lock()
    assert lock.held() and lock.held("write") and not lock.held("read")
    assert isinstance(lock.token, int)
    assert other_thread(lambda: make(engine, group).try_lock()) is False
    lock.unlock()
    assert not lock.held()
    assert other_thread(lambda: (make(engine, group).try_lock(), make(engine, group).unlock())[0]) is True


def test_reentrant_write_counts_locally(engine, group):
    lock = make(engine, group)
    with lock:
        token = lock.token
        with lock.write(timeout=1):
            with lock:
                assert lock.token == token
        assert lock.held()
        assert other_thread(lambda: make(engine, group).try_lock(0.05)) is False
    assert not lock.held()
    assert other_thread(lambda: make(engine, group).try_rlock()) is True


def test_readers_share_and_exclude_writers(engine, group):
    lock = make(engine, group)
    lock.rlock()
    try:
        def reader() -> bool:
            other = make(engine, group)
            got = other.try_rlock(1)
            if got:
                other.runlock()
            return got
        assert other_thread(reader) is True
        assert other_thread(lambda: make(engine, group).try_lock(0.05)) is False
    finally:
        lock.runlock()
    assert other_thread(lambda: make(engine, group).try_lock()) is True


def test_writer_excludes_readers(engine, group):
    lock = make(engine, group)
    with lock.write():
        assert other_thread(lambda: make(engine, group).try_rlock(0.05)) is False


def test_downgrade_write_to_read(engine, group):
    lock = make(engine, group)
    lock.lock()
    token = lock.token
    lock.rlock()                       # a writer may take the read lock
    lock.unlock()                      # now only a reader
    assert lock.held("read") and not lock.held("write") and lock.token == token

    def read_too() -> bool:
        other = make(engine, group)
        ok = other.try_rlock(1)
        if ok:
            other.runlock()
        return ok
    assert other_thread(read_too) is True                                  # shared now, on every engine
    assert other_thread(lambda: make(engine, group).try_lock(0.05)) is False
    lock.runlock()
    assert not lock.held()


def test_downgrade_admits_queued_readers_and_no_writer(engine, group):
    """Write→read downgrade (Java's ReentrantReadWriteLock, Curator's InterProcessReadWriteLock):
    the reader queued behind the holder gets in while the holder still reads; the writer
    queued behind that reader waits for every reader, and never slips in between the write
    release and the read hold (CURATOR-621)."""
    holder = make(engine, group)
    holder.lock()
    log: list[str] = []
    reader_in, reader_go = threading.Event(), threading.Event()

    def reader() -> None:
        lock = make(engine, group)
        lock.rlock(timeout=20)
        log.append("reader in")
        reader_in.set()
        reader_go.wait(20)
        log.append("reader out")
        lock.runlock()

    def writer() -> None:
        lock = make(engine, group)
        lock.lock(timeout=20)
        log.append("writer in")
        lock.unlock()
    r = Runner(reader)
    r.start()
    wait_until(lambda: len(waiters(engine, group, "n")) == 1, what="the reader queued")
    w = Runner(writer)
    w.start()
    listed: list[list[str]] = [[]]            # what describe() listed last (a failure says it)

    def both_queued() -> bool:
        listed[0] = waiters(engine, group, "n")
        return len(listed[0]) == 2
    try:
        wait_until(both_queued, what="the writer queued behind it")
    except AssertionError as exc:
        writer_state = "still running" if w.is_alive() else f"ended: {w.error!r}"
        raise AssertionError(f"{exc}; describe() last listed {listed[0]}; the writer's thread {writer_state}") from None
    holder.rlock()
    holder.unlock()                                   # downgraded: holds read only
    assert reader_in.wait(10), "the queued reader did not get in after the downgrade"
    info = next(i for i in engine.describe(group) if i.name == "n")
    assert info.mode == "read" and len(info.owners) == 2 and [x.split(":")[0] for x in info.waiters] == ["write"]
    log.append("holder out")
    holder.runlock()
    assert waiters(engine, group, "n") == ["write:" + info.waiters[0].split(":", 1)[1]]   # still waiting
    reader_go.set()
    r.outcome()
    w.outcome()
    assert log == ["reader in", "holder out", "reader out", "writer in"]


def test_upgrade_is_refused_at_once(engine, group):
    lock = make(engine, group)
    with lock.read():
        started = time.monotonic()
        with pytest.raises(ylock.LockUpgradeError) as info:
            lock.lock(timeout=5)
        assert time.monotonic() - started < 0.5
        assert group in str(info.value)
        with pytest.raises(ylock.LockUpgradeError):
            lock.try_lock()
        assert lock.held("read")


# -- ownership errors ------------------------------------------------------------------------


def test_unlock_without_hold_raises_not_owned(engine, group):
    lock = make(engine, group)
    with pytest.raises(ylock.LockNotOwned) as info:
        lock.unlock()
    assert f"{group}/n" in str(info.value)
    with pytest.raises(ylock.LockNotOwned):
        lock.runlock()
    with lock.write():
        with pytest.raises(ylock.LockNotOwned):
            lock.runlock()                      # holds write, not read


def test_another_thread_cannot_release(engine, group):
    lock = make(engine, group)
    with lock:
        with pytest.raises(ylock.LockNotOwned):
            other_thread(lambda: make(engine, group).unlock())
        assert lock.held()


def test_owner_scope_moves_between_threads(engine, group):
    lock = make(engine, group)
    with ylock.owner_scope():
        lock.lock()
        assert other_thread_with_context(lambda: lock.held()) is True
        other_thread_with_context(lock.unlock)
        assert not lock.held()


def other_thread_with_context(func):  # noqa: ANN001, ANN201
    import contextvars
    ctx = contextvars.copy_context()
    return other_thread(lambda: ctx.run(func))


# -- the engine level -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["write", "read"])
def test_a_release_by_a_former_owner_leaves_the_new_owner_alone(engine, group, mode):
    """An owner whose hold vanished (force-released, or its lease ran out) releases: the
    engine answers False and the lock's new owner keeps it (a release script that deleted
    whatever holds the lock would pass every test that only looks at the releaser)."""
    from ylock.engines.base import AcquireRequest, RenewItem

    # No watchdog renews these raw grants: a waiter lease of 6 s (3 x the longest poll) keeps
    # the new owner's first lease from running out on a loaded machine before it is checked.
    first = AcquireRequest(group, "n", "former-owner", mode, True, 30.0, time.monotonic() + 5,
                           ylock.Polling(maximum=2.0))
    token = engine.acquire(first)
    assert isinstance(token, int)
    assert engine.force_release(group, "n") is True
    second = first._replace(owner="new-owner", deadline=time.monotonic() + 5)
    assert engine.acquire(second) > token
    assert engine.release(group, "n", "former-owner", mode) is False
    info = next(i for i in engine.describe(group) if i.name == "n")
    assert info.owners == ("new-owner",) and info.mode == mode
    # The new owner still holds it, on every engine (renewed or session-bound): a writer waits.
    third = first._replace(owner="third-owner", mode="write", deadline=time.monotonic() + 0.2)
    assert engine.acquire(third) is None
    if engine.needs_renewal:
        assert engine.renew([RenewItem(group, "n", "new-owner", mode, 30.0)]) == [True]
    assert engine.release(group, "n", "new-owner", mode) is True
    assert not [i for i in engine.describe(group) if i.owners]


# -- timeouts ----------------------------------------------------------------------------------


def test_timeouts_are_honoured_from_both_sides(engine, group):
    holder = make(engine, group)
    holder.lock()
    try:
        def attempt() -> tuple[bool, float]:
            started = time.monotonic()
            got = make(engine, group).try_lock(timeout=0.3)
            return got, time.monotonic() - started
        got, elapsed = other_thread(attempt)
        assert got is False
        assert 0.3 <= elapsed < 1.3

        def blocking() -> None:
            make(engine, group).lock(timeout=0.2)
        with pytest.raises(ylock.LockTimeout) as info:
            other_thread(blocking)
        assert isinstance(info.value, TimeoutError)
        assert waiters(engine, group, "n") == []          # the timed-out waiter left the queue
    finally:
        holder.unlock()


def test_bad_timeouts_and_names_are_value_errors(engine, group):
    for bad_group in ("", 7, "a" * 65, "a/b", "a:b", "{x}"):
        with pytest.raises(ValueError) as info:
            ylock.Lock(engine, bad_group, "n")          # type: ignore[arg-type]
        assert "group" in str(info.value)
    for bad_name in ("", None, "x" * 201, "a/b", "a\nb", ".."):
        with pytest.raises(ValueError) as info:
            ylock.Lock(engine, group, bad_name)         # type: ignore[arg-type]
        assert "name" in str(info.value)
    lock = make(engine, group)
    for bad in (-1, "1", True, float("nan")):
        with pytest.raises(ValueError) as info:
            lock.try_lock(bad)                          # type: ignore[arg-type]
        assert "timeout" in str(info.value)
    with pytest.raises(ValueError, match="lease"):
        ylock.Lock(engine, group, "n", lease=0)
    with pytest.raises(ValueError, match="lock name"):
        ylock.Locks(engine, group).lock("")


# -- fairness ------------------------------------------------------------------------------------


def test_fair_reader_does_not_barge_past_queued_writer(engine, group):
    reader = make(engine, group)
    reader.rlock()
    writer = Runner(lambda: make(engine, group).lock(timeout=10) or "writer-got-it")
    writer.start()
    wait_until(lambda: any(w.startswith("write:") for w in waiters(engine, group, "n")), what="queued writer")
    assert other_thread(lambda: make(engine, group).try_rlock(0.1)) is False
    reader.runlock()
    assert writer.outcome() == "writer-got-it"


def test_waiters_are_served_fifo(engine, group):
    holder = make(engine, group)
    holder.lock()
    order: list[int] = []
    release = threading.Event()
    runners = []
    for i in range(5):
        def work(i: int = i) -> None:
            lock = make(engine, group)
            lock.lock(timeout=20)
            order.append(i)
            lock.unlock()
        runner = Runner(work)
        runner.start()
        runners.append(runner)
        wait_until(lambda i=i: len(waiters(engine, group, "n")) == i + 1, what=f"waiter {i} queued")
    release.set()
    holder.unlock()
    for runner in runners:
        runner.outcome(20)
    assert order == [0, 1, 2, 3, 4]


def test_queued_readers_enter_together(engine, group):
    writer = make(engine, group)
    writer.lock()
    inside = threading.Barrier(4, timeout=10)   # 3 readers + this thread meet inside
    done = threading.Event()
    runners = []
    for i in range(3):
        def read() -> None:
            lock = make(engine, group)
            with lock.read(timeout=10):
                inside.wait()
                done.wait(10)
        runner = Runner(read)
        runner.start()
        runners.append(runner)
        wait_until(lambda i=i: len(waiters(engine, group, "n")) == i + 1, what="reader queued")
    writer.unlock()
    try:
        inside.wait()             # all three readers hold the lock at the same time
        info = engine.describe_lock(group, "n")
        assert info is not None and info.mode == "read" and len(info.owners) == 3, info
        assert ylock.current_owner() not in info.owners and not info.waiters
    finally:
        done.set()
    for runner in runners:
        runner.outcome()


def test_non_fair_lock_works_and_grants(engine, group):
    lock = make(engine, group, fair=False)
    with lock:
        assert other_thread(lambda: make(engine, group, fair=False).try_lock(0.05)) is False
    assert other_thread(lambda: make(engine, group, fair=False).try_lock()) is True


# -- fencing ---------------------------------------------------------------------------------------


def test_fencing_tokens_strictly_increase(engine, group):
    tokens = []
    for i in range(4):
        def take(mode: str = "write" if i % 2 else "read") -> int:
            lock = make(engine, group)
            guard = lock.write() if mode == "write" else lock.read()
            with guard:
                return lock.token  # type: ignore[return-value]
        tokens.append(other_thread(take))
    holder = make(engine, group)
    with holder:
        tokens.append(holder.token)
    engine.force_release(group, "n")
    with holder.write():
        tokens.append(holder.token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


# -- leases, loss, inspection ------------------------------------------------------------------------


def test_lease_is_renewed_while_held(engine, group):
    # Renewed by the watchdog, or kept alive by the engine's session (ZooKeeper).
    # A 1.5 s lease is renewed every 0.5 s: a renewal thread late by up to 1 s (a loaded
    # machine; CI once saw a 0.5 s lease lapse on Cluster at load 3-4) does not lose it.
    lock = make(engine, group, lease=1.5)
    with lock:
        time.sleep(4.5)        # the subject of the test: three leases go by
        assert not lock.lost
        assert other_thread(lambda: make(engine, group).try_lock()) is False
    assert not lock.held()


def test_force_release_makes_the_holder_lost(engine, group):
    lock = make(engine, group, lease=0.9)
    lost = expect_event(events.LOST, group)
    lock.lock()
    assert engine.force_release(group, "n") is True
    assert other_thread(lambda: make(engine, group).try_lock(5)) is True   # someone else took it
    assert lost.wait(10), "the watchdog did not report the loss"
    assert lock.lost and lock.held()
    with pytest.raises(ylock.LockLost) as info:
        lock.unlock()
    assert f"{group}/n" in str(info.value)
    assert not lock.held()


def test_describe_shows_holders_waiters_and_tokens(engine, group):
    lock = make(engine, group)
    lock.lock()
    try:
        waiter = Runner(lambda: make(engine, group).rlock(timeout=10))
        waiter.start()
        wait_until(lambda: waiters(engine, group, "n"), what="waiter")
        infos = [i for i in engine.describe(group) if i.name == "n"]
        assert len(infos) == 1
        info = infos[0]
        assert (info.group, info.name, info.kind, info.mode) == (group, "n", "lock", "write")
        assert info.owners == (ylock.current_owner(),)
        assert isinstance(info.token, int) and info.token == lock.token
        assert len(info.waiters) == 1 and info.waiters[0].startswith("read:")
        assert info.waiters[0] != "read:" + ylock.current_owner()          # the waiter's own owner id
        assert info.permits is None                                        # a semaphore's only
        # A lease that runs out says how long it has left; a session-bound hold has no ttl.
        if engine.needs_renewal:
            assert info.ttl is None or 0 < info.ttl <= lock.lease, info.ttl
        else:
            assert info.ttl is None, info.ttl
        one = engine.describe_lock(group, "n")                             # the one-lock answer agrees
        assert one is not None and dataclasses.replace(one, ttl=None) == dataclasses.replace(info, ttl=None)
        assert list(engine.describe(group="nothing-here")) == []
    finally:
        lock.unlock()
    waiter.outcome()


def test_events_carry_wait_and_hold_spans(engine, group):
    lock = make(engine, group)
    with collect() as seen:
        with lock:
            with lock:
                time.sleep(0.05)
        assert lock.try_lock() is True
        lock.unlock()
    # A renewal may land inside a hold on a slow run (the first one is due a third of the
    # waiter lease after the grant): it is not what this test is about.
    kinds = [e.kind for e in seen if e.group == group and e.kind != "renewed"]
    assert kinds == ["acquired", "released", "acquired", "released"]
    released = [e for e in seen if e.kind == "released"][0]
    assert released.hold is not None and released.hold >= 0.05      # reentry did not cut it
    assert released.engine == engine.scheme and released.mode == "write"


# -- concurrency -------------------------------------------------------------------------------------


def test_threads_lose_no_update(engine, group):
    counter = [0]
    lock = make(engine, group)

    def work() -> None:
        for _ in range(25):
            with lock:
                value = counter[0]
                time.sleep(0)            # invite a switch inside the critical section
                counter[0] = value + 1
    runners = [Runner(work) for _ in range(6)]
    for r in runners:
        r.start()
    for r in runners:
        r.outcome(60)
    assert counter[0] == 150


def test_locks_family_and_decorators(engine, group):
    locks = ylock.Locks(engine, group)
    locks.lock("user-1")
    assert locks.held("user-1") and not locks.held("user-2")
    assert locks["user-1"].held("write")
    assert other_thread(lambda: locks.try_lock("user-2")) is True       # other names are independent
    locks.unlock("user-1")
    with locks.read("user-1", timeout=1):
        assert locks.held("user-1", "read")

    @locks["job"].write(timeout=1)
    def job() -> str | None:
        return locks.token("job") and "ran"
    assert job() == "ran" and not locks.held("job")

    @locks["job"].read(timeout=1)
    async def ajob() -> bool:
        await asyncio.sleep(0)
        return True
    assert asyncio.run(ajob()) is True
    assert other_thread(lambda: locks.try_lock("job")) is True


def test_asyncio_tasks_are_owners(engine, group):
    lock = make(engine, group)
    inside: list[str] = []

    @lock.write(timeout=10)
    async def critical(tag: str) -> None:
        inside.append(f"+{tag}")
        await asyncio.sleep(0.05)          # the other task must not get in meanwhile
        inside.append(f"-{tag}")

    @lock.write(timeout=1)
    async def outer() -> bool:
        async with lock.write(timeout=1):  # the same task re-enters: no deadlock
            return True

    async def main() -> bool:
        await asyncio.gather(critical("a"), critical("b"))
        return await outer()
    assert asyncio.run(main()) is True
    assert inside in (["+a", "-a", "+b", "-b"], ["+b", "-b", "+a", "-a"])
    assert other_thread(lambda: make(engine, group).try_lock()) is True
