"""The PostgreSQL engine beyond the contract: the server's grant order, tokens in the
acquiring round trip, the grant that races a timeout or a cancellation, describe() and
force_release() against pg_locks, the connection bound, options, the pooler check, the
transaction scope and asyncio."""
from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ylock
from tests.helpers import Runner, expect_event, wait_until, waiters
from tests.postgres.conftest import advisory_rows, backend_of
from ylock import events
from ylock.engines.base import AcquireRequest
from ylock.engines.postgres import PostgresEngine, advisory_key
from ylock.engines.postgres.ops import Open, Query
from ylock.testing.proxy import TcpProxy
from ylock.waiting import DEFAULT_POLLING


def lock(engine: ylock.Engine, group: str, name: str = "n", **kw: Any) -> ylock.Lock:
    return ylock.Lock(engine, group, name, **kw)


def in_thread(func: Any) -> Runner:
    runner = Runner(func)
    runner.start()
    return runner


def owner_waits(engine: ylock.Engine, group: str, count: int, name: str = "n") -> None:
    wait_until(lambda: len(waiters(engine, group, name)) == count, what=f"{count} waiters queued")


# -- the server's queue ---------------------------------------------------------------------


def test_a_reader_queues_behind_a_queued_writer_on_the_server(postgres_engine, group, observer):
    """Fair: a reader that comes after a queued writer waits behind it, in the server's own
    queue (pg_locks: not granted, after the writer), and enters only after the writer."""
    reader = lock(postgres_engine, group)
    reader.rlock()
    order: list[str] = []

    def take(mode: str) -> None:
        other = lock(postgres_engine, group)
        (other.lock if mode == "write" else other.rlock)(timeout=10)
        order.append(mode)
        (other.unlock if mode == "write" else other.runlock)()
    writer = in_thread(lambda: take("write"))
    owner_waits(postgres_engine, group, 1)
    assert in_thread(lambda: lock(postgres_engine, group).try_rlock(0.2)).outcome() is False   # no barging
    late_reader = in_thread(lambda: take("read"))
    owner_waits(postgres_engine, group, 2)
    assert [w.split(":")[0] for w in waiters(postgres_engine, group, "n")] == ["write", "read"]
    key = advisory_key("ylock", "lock", group, "n")
    rows = observer.execute("SELECT mode, granted FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                            "ORDER BY granted DESC, waitstart", [key & 0xFFFFFFFF]).fetchall()
    assert rows == [("ShareLock", True), ("ExclusiveLock", False), ("ShareLock", False)]
    reader.runlock()
    writer.outcome()
    late_reader.outcome()
    assert order == ["write", "read"]


def test_queued_runs_of_readers_are_granted_together_in_fifo_order(postgres_engine, group):
    """The order PostgreSQL grants in: FIFO, each run of queued readers as one batch."""
    holder = lock(postgres_engine, group)
    holder.lock()
    log: list[str] = []
    inside = threading.Semaphore(0)
    go_on = threading.Event()

    def take(tag: str) -> None:
        other = lock(postgres_engine, group)
        write = tag.startswith("w")
        (other.lock if write else other.rlock)(timeout=20)
        log.append(tag)
        inside.release()
        go_on.wait(20)
        (other.unlock if write else other.runlock)()
    runners = []
    for i, tag in enumerate(["r1", "r2", "w3", "r4"]):
        runners.append(in_thread(lambda tag=tag: take(tag)))
        owner_waits(postgres_engine, group, i + 1)
    holder.unlock()
    inside.acquire(timeout=10)
    inside.acquire(timeout=10)
    assert sorted(log) == ["r1", "r2"]                      # both readers at once, the writer waits
    time.sleep(0.1)
    assert sorted(log) == ["r1", "r2"]
    go_on.set()
    for runner in runners:
        runner.outcome(20)
    assert log[2:] == ["w3", "r4"]


# -- tokens ------------------------------------------------------------------------------------


def test_one_round_trip_acquires_with_its_token_and_one_releases(make_engine, group):
    engine = make_engine()
    calls: list[str] = []
    do = engine._do

    def counting(op: Any) -> Any:
        if isinstance(op, (Query, Open)):           # what goes to the server (Claim is local)
            calls.append(type(op).__name__.lower())
        return do(op)
    lock(engine, group, "warm").lock()               # the connection is opened and set up here
    lock(engine, group, "warm").unlock()
    engine._do = counting
    tokens = []
    for _ in range(3):
        held = lock(engine, group)
        held.lock()
        tokens.append(held.token)
        held.unlock()
    assert calls == ["query", "query"] * 3
    assert tokens == sorted(set(tokens))


def test_a_token_is_drawn_after_the_grant(make_engine, group, observer):
    """A waiter's token comes from the sequence when it is granted, not when it asked: a
    token drawn meanwhile by someone else is lower."""
    engine = make_engine()
    holder = lock(engine, group)
    holder.lock()
    waiter = lock(engine, group)
    runner = in_thread(lambda: (waiter.lock(timeout=10), waiter.token, waiter.unlock())[1])
    owner_waits(engine, group, 1)
    (meanwhile,) = observer.execute("SELECT nextval('ylock_fence')").fetchone()  # type: ignore[misc]
    holder.unlock()
    assert runner.outcome() > meanwhile


# -- the grant that races a failure -------------------------------------------------------------


def _frozen_grant(engine: ylock.Engine, group: str, observer: psycopg.Connection[Any], fail: Any) -> Runner:
    """Queue a waiter, freeze its backend, grant it the lock (the holder releases), make
    its call fail meanwhile (``fail(waiter_runner)``), then thaw the backend."""
    holder = lock(engine, group)
    holder.lock()
    owner: list[str] = []

    def wait() -> bool:
        owner.append(ylock.current_owner())
        return lock(engine, group).try_lock(timeout=1.0)
    runner = in_thread(wait)
    owner_waits(engine, group, 1)
    pid = backend_of(observer, owner[0])
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        holder.unlock()                                   # grants the lock to the frozen backend
        wait_until(lambda: advisory_rows(observer, [pid]) == [(pid, "ExclusiveLock", True)], what="the grant")
        fail(runner)
    finally:
        os.kill(pid, signal.SIGCONT)
    return runner


def test_a_grant_racing_lock_timeout_is_given_back(postgres_engine, group, observer):
    # The frozen backend's lock_timeout fires while it holds the fresh grant: the statement
    # fails with 55P03 although the lock is held. The engine gives it back.
    runner = _frozen_grant(postgres_engine, group, observer, lambda _: time.sleep(1.3))
    assert runner.outcome() is False
    assert in_thread(lambda: lock(postgres_engine, group).try_lock()).outcome() is True
    assert advisory_rows(observer) == [] or all(r[0] != 0 for r in advisory_rows(observer))


def test_a_cancelled_asyncio_wait_gives_back_a_racing_grant(make_engine, group, observer):
    engine = make_engine()
    holding, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        holder = lock(engine, group)
        holder.lock()
        holding.set()
        let_go.wait(20)
        holder.unlock()
    holder = in_thread(hold)
    assert holding.wait(10)
    owner: list[str] = []

    async def main() -> None:
        async def wait() -> None:
            owner.append(ylock.current_owner())
            await lock(engine, group).alock(timeout=30)
        task = asyncio.create_task(wait())
        while len(await asyncio.to_thread(waiters, engine, group, "n")) < 1:
            await asyncio.sleep(0.01)
        pid = backend_of(observer, owner[0])
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            let_go.set()                                    # grants it to the frozen backend
            await asyncio.to_thread(holder.outcome)
            task.cancel()                                   # its cancel request is pending there
            await asyncio.sleep(0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert waiters(engine, group, "n") == []
    assert in_thread(lambda: lock(engine, group).try_lock()).outcome() is True


def test_a_cancelled_asyncio_wait_leaves_the_queue(postgres_engine, group):
    holder = lock(postgres_engine, group)
    holder.lock()

    async def main() -> list[str]:
        tasks = [asyncio.create_task(lock(postgres_engine, group).alock(timeout=30)) for _ in range(3)]
        while len(await asyncio.to_thread(waiters, postgres_engine, group, "n")) < 3:
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return await asyncio.to_thread(waiters, postgres_engine, group, "n")
    assert asyncio.run(main()) == []
    holder.unlock()
    assert not [i for i in postgres_engine.describe(group) if i.owners]


def test_asyncio_verbs_exclude_and_share(postgres_engine, group):
    async def main() -> tuple[int, int]:
        counter = 0
        readers_inside = 0
        most = 0

        async def write() -> None:
            nonlocal counter
            the_lock = lock(postgres_engine, group)
            await the_lock.alock(timeout=20)
            try:
                value = counter
                await asyncio.sleep(0.001)
                counter = value + 1
            finally:
                await the_lock.aunlock()

        async def read() -> None:
            nonlocal readers_inside, most
            the_lock = lock(postgres_engine, group)
            assert await the_lock.atry_rlock(20)
            readers_inside += 1
            most = max(most, readers_inside)
            await asyncio.sleep(0.05)
            readers_inside -= 1
            await the_lock.arunlock()
        await asyncio.gather(*[write() for _ in range(8)])
        await asyncio.gather(*[read() for _ in range(4)])
        return counter, most
    counter, most = asyncio.run(main())
    assert counter == 8 and most > 1


# -- describe and force_release ---------------------------------------------------------------------


def test_describe_names_what_pg_locks_shows_and_ignores_other_advisory_locks(postgres_engine, group, observer):
    observer.execute("SELECT pg_advisory_lock(4242)")     # somebody else's advisory lock
    try:
        held = lock(postgres_engine, group, "a/b".replace("/", "-") + " é")
        held.lock()
        info = [i for i in postgres_engine.describe() if i.group == group]
        assert [(i.name, i.mode, i.owners, i.token) for i in info] == \
            [("a-b é", "write", (ylock.current_owner(),), held.token)]
        held.unlock()
    finally:
        observer.execute("SELECT pg_advisory_unlock(4242)")


def test_force_release_ends_the_holders_session_and_the_queued_waiter_gets_the_lock(postgres_engine, group):
    holder = lock(postgres_engine, group, lease=0.9)
    lost = expect_event(events.LOST, group)
    holder.lock()
    token = holder.token
    got: list[float] = []

    def wait() -> int | None:
        other = lock(postgres_engine, group)
        other.lock(timeout=10)
        got.append(time.monotonic())
        result = other.token
        other.unlock()
        return result
    runner = in_thread(wait)
    owner_waits(postgres_engine, group, 1)
    forced = time.monotonic()
    assert postgres_engine.force_release(group, "n") is True
    assert runner.outcome() > token                          # the waiter got it, with a newer token
    assert got[0] - forced < 0.5
    assert lost.wait(5), "the force-released holder was not told"
    with pytest.raises(ylock.LockLost):
        holder.unlock()
    assert postgres_engine.force_release(group, "n") is False


# -- connections ------------------------------------------------------------------------------------


def test_connections_are_bounded_and_handed_over_in_order(make_engine, group, observer):
    engine = make_engine(max_connections=2)
    first, second = lock(engine, group, "a"), lock(engine, group, "b")
    first.lock()
    in_thread(second.lock).outcome()                     # held by another thread: its own connection
    started = time.monotonic()
    with pytest.raises(ylock.EngineUnavailable, match="max_connections"):
        in_thread(lambda: lock(engine, group, "c").try_lock(0.3)).outcome()
    assert 0.3 <= time.monotonic() - started < 1.0
    third = in_thread(lambda: (lock(engine, group, "c").try_lock(10), time.monotonic())[1])
    time.sleep(0.1)
    released = time.monotonic()
    first.unlock()                                       # its connection goes to the waiting owner
    assert third.outcome() - released < 0.5
    mine = observer.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s OR "
                            "application_name = 'ylock'", ["%:" + ylock.current_owner().rsplit(":", 2)[0] + "%"])
    assert mine.fetchone()[0] <= 2                       # type: ignore[index]


def test_a_stale_pooled_connection_is_replaced(make_engine, group, observer):
    engine = make_engine()
    with lock(engine, group).write(timeout=5) as first:
        before = first.token
    killed = observer.execute("SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity "
                              "WHERE application_name = 'ylock'").fetchall()
    assert killed and all(row[0] for row in killed), killed      # the pooled connection is dead
    with lock(engine, group).write(timeout=5) as second:        # ...so a new one takes the lock
        assert second.held() and second.token > before


# -- options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [("socket_timeout", "nan"), ("connect_timeout", "inf"),
                                           ("keepalive", "-inf"), ("max_connections", "0"), ("scope", "global"),
                                           ("prefix", "Bad-Name"), ("idle_connections", "-1"), ("pooler", "maybe")])
def test_bad_options_are_refused_by_name(option, value):
    with pytest.raises(ylock.ConfigurationError, match=option):
        ylock.engine_from_url(f"postgresql://u@127.0.0.1:1/db?{option}={value}")


def test_unknown_options_are_named_and_libpq_options_pass():
    with pytest.raises(ylock.ConfigurationError, match="nosuchoption"):
        ylock.engine_from_url("postgresql://u@127.0.0.1:1/db?nosuchoption=1")
    engine = ylock.engine_from_url("postgres://u:secret@127.0.0.1:1/db?sslmode=disable&scope=transaction",
                                   max_connections=3)
    assert isinstance(engine, PostgresEngine) and engine.scope == "transaction" and engine.max_connections == 3
    assert "secret" not in repr(engine) and "sslmode=disable" in engine.conninfo.decode()


def test_an_unreachable_server_is_engine_unavailable_within_connect_timeout():
    engine = ylock.engine_from_url("postgresql://u@127.0.0.1:1/db?connect_timeout=1")
    started = time.monotonic()
    with pytest.raises(ylock.EngineUnavailable) as info:
        lock(engine, "g").try_lock(5)
    assert time.monotonic() - started < 1.5
    assert isinstance(info.value.__cause__, Exception)


# -- poolers ----------------------------------------------------------------------------------------------


def test_the_pooler_check_sees_a_proxy_and_no_transaction_pooling(make_engine, postgres_server):
    assert make_engine().detect_pooler() is None
    with TcpProxy(postgres_server.port) as proxy:
        url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        found = make_engine(url).detect_pooler()
        assert found is not None and "proxy" in found and "pooler=session" in found
        assert make_engine(url + "?pooler=session").detect_pooler() is None
        assert make_engine(url + "?scope=transaction").detect_pooler() is None


# -- transaction scope ----------------------------------------------------------------------------------


def test_transaction_scope_holds_a_transaction_and_commit_releases(make_engine, group, observer):
    engine = make_engine(scope="transaction")
    held = lock(engine, group)
    held.lock()
    pid = backend_of(observer, ylock.current_owner())
    state, = observer.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()  # type: ignore[misc]
    assert state == "idle in transaction"
    assert in_thread(lambda: lock(engine, group).try_rlock(0.1)).outcome() is False
    assert [i.owners for i in engine.describe(group)] == [(ylock.current_owner(),)]
    held.unlock()
    assert advisory_rows(observer, [pid]) == []
    state, = observer.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()  # type: ignore[misc]
    assert state == "idle"
    assert in_thread(lambda: lock(engine, group).try_lock()).outcome() is True


def test_transaction_scope_downgrade_stays_exclusive_until_the_read_is_released(make_engine, group):
    engine = make_engine(scope="transaction")
    held = lock(engine, group)
    held.lock()
    held.rlock()
    held.unlock()
    assert held.held("read")
    assert in_thread(lambda: lock(engine, group).try_rlock(0.1)).outcome() is False
    held.runlock()
    assert in_thread(lambda: lock(engine, group).try_rlock()).outcome() is True


def test_transaction_scope_timeouts_and_semaphores(make_engine, group):
    engine = make_engine(scope="transaction")
    held = lock(engine, group)
    held.lock()
    started = time.monotonic()
    assert in_thread(lambda: lock(engine, group).try_lock(0.3)).outcome() is False
    assert 0.3 <= time.monotonic() - started < 1.3
    held.unlock()
    sem = ylock.Semaphore(engine, group, "s", permits=1)
    sem.acquire()
    waiter = in_thread(lambda: ylock.Semaphore(engine, group, "s", permits=1).try_acquire(10))
    wait_until(lambda: any(i.waiters for i in engine.describe(group) if i.kind == "semaphore"), what="a waiter")
    sem.release()
    assert waiter.outcome() is True


# -- the lease ---------------------------------------------------------------------------------------------


def test_an_owner_that_stops_renewing_loses_the_lock_on_the_server_after_its_lease(make_engine, group, figure):
    engine = make_engine()
    request = AcquireRequest(group, "n", "silent-owner", "write", True, 0.5, time.monotonic() + 5, DEFAULT_POLLING)
    assert isinstance(engine.acquire(request), int)
    taken = time.monotonic()
    other = lock(engine, group)
    assert other.try_lock(5)
    freed = time.monotonic() - taken
    other.unlock()
    figure(f"a holder that sends nothing (lease 0.5 s) lost its lock after {freed:.2f} s")
    assert 0.45 <= freed < 1.5
    assert engine.renew([ylock.RenewItem(group, "n", "silent-owner", "write", 0.5)]) == [False]
    assert engine.release(group, "n", "silent-owner", "write") is False


def test_heartbeats_keep_a_short_lease_and_cost_one_wait_for_many_holds(make_engine, group):
    engine = make_engine(max_connections=40)
    # 1.5 s (heartbeats every 0.5 s), held for three leases: a heartbeat thread late by up to
    # a second on a loaded machine (30 backends being forked meanwhile) keeps every hold.
    locks = ylock.Locks(engine, group, lease=1.5)
    names = [f"h{i}" for i in range(30)]
    runners = [in_thread(lambda n=n: (locks.lock(n), time.sleep(4.5), locks[n].lost, locks.unlock(n))[2])
               for n in names]
    assert [r.outcome(15) for r in runners] == [False] * 30
    items = []
    for n in names[:5]:
        request = AcquireRequest(group, n, "o-" + n, "write", True, 5.0, time.monotonic() + 5, DEFAULT_POLLING)
        engine.acquire(request)
        items.append(ylock.RenewItem(group, n, "o-" + n, "write", 5.0))
    started = time.monotonic()
    assert engine.renew(items) == [True] * 5
    assert time.monotonic() - started < 2.0
    for item in items:
        assert engine.release(group, item.name, item.owner, "write") is True


def test_keys_are_stable_and_signed():
    key = advisory_key("ylock", "lock", "g", "n")
    assert key == advisory_key("ylock", "lock", "g", "n") != advisory_key("other", "lock", "g", "n")
    assert -2**63 <= key < 2**63 and not math.isnan(key)


@settings(max_examples=int(os.environ.get("YLOCK_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          derandomize=not os.environ.get("YLOCK_HYPOTHESIS_RANDOM"))
@given(option=st.sampled_from(["socket_timeout", "connect_timeout", "keepalive", "max_connections",
                               "idle_connections", "scope", "prefix", "pooler", "sslmode", "port"]),
       value=st.one_of(st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "", "abc", "1e-9", "0.5",
                                        "999999999999", "session", "transaction", "disable"]), st.text(max_size=8)))
def test_url_options_are_engines_or_configuration_errors(option: str, value: str) -> None:
    from urllib.parse import quote

    try:
        engine = ylock.engine_from_url(f"postgresql://u@127.0.0.1:1/db?{option}={quote(value)}")
    except ylock.ConfigurationError as exc:
        assert option in str(exc) or "URL" in str(exc), exc
        return
    assert isinstance(engine, PostgresEngine)
