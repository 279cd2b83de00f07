"""Faults on a real MariaDB: processes that race, die or freeze past their lease inside the
lock; a holder's session killed with ``KILL``; a server restarted, paused or down. Every test
checks exclusion with the journal of holds (the fenced register beside the unfenced counter)
or that every call ends within its bound, and notes the figures it measured."""
from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

import ylock
from tests.faults import SLACK, hold_until_lost, holder_process, take, timed
from tests.helpers import Runner, expect_event, wait_until, waiters
from tests.postgres import workers
from ylock import events
from ylock.testing.fencing import UnfencedCounter
from ylock.testing.mariadb import MariaDBServer

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def own_mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB of this module's own (its tests restart and pause it); each test leaves it
    running and unfrozen."""
    server = MariaDBServer().start()
    try:
        yield server
    finally:
        server.cleanup()


def run_counter(url: str, group: str, path: str, processes: int, iterations: int, use_lock: bool) -> list[int]:
    with spawn.Manager() as manager, ProcessPoolExecutor(processes, mp_context=spawn) as pool:
        start = manager.Barrier(processes)
        futures = [pool.submit(workers.counter, url, group, path, iterations, use_lock, start)
                   for _ in range(processes)]
        return [t for f in futures for t in f.result(timeout=120)]


def test_processes_lose_no_update(mariadb_server, group, tmp_path):
    path = str(tmp_path / "counter.json")
    tokens = run_counter(mariadb_server.url, group, path, 4, 25, use_lock=True)
    counter = UnfencedCounter(path)
    assert counter.increments == 100 and counter.lost == 0 and counter.value == 100
    assert len(set(tokens)) == 100                       # every hold had its own token
    control = str(tmp_path / "control.json")             # the same work unlocked loses updates
    run_counter(mariadb_server.url, group, control, 4, 25, use_lock=False)
    assert UnfencedCounter(control).lost > 0


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_holder_killed_or_paused_past_its_lease_is_replaced_and_fenced_off(mariadb_server, engines, group,
                                                                            journal, figures, how):
    """A holder process dies (SIGKILL: its connection closes, the server drops its locks at
    once) or freezes (SIGSTOP: the server ends its idle session after its lease, wait_timeout
    1 s) inside the lock; a waiter takes over; the frozen one, resumed, is told it lost the
    lock and its stale writes are rejected by the fenced register."""
    engine = engines(mariadb_server.url)
    with ylock.Lock(engine, group, "warm").write(timeout=5):
        pass                                             # the successor's connection is open already
    successor = ylock.Lock(engine, group, "n")
    with holder_process(mariadb_server.url, group, 1.0, journal, how) as holder:
        record = take(successor, journal, "successor", timeout=15)
        freed = record.granted - holder.stopped
        assert record.token > holder.record.token
    verdict = journal.check()
    figures(f"holder {how}ed (lease 1 s): lock taken over after {freed:.3f} s; {verdict}")
    if how == "SIGKILL":
        assert freed < 1.0
    else:
        assert 0.8 <= freed < 3.0 and verdict.lost == 1 and verdict.caught >= 1


def test_a_holder_whose_session_is_killed_is_told_and_replaced(mariadb_server, engines, group, journal, figures):
    """``KILL <id>`` of the holder's session (an operator, force_release): the next waiter gets
    the lock at once; the holder learns it at its next heartbeat (lease 1.5 s: within 0.5 s)."""
    engine = engines(mariadb_server.url)
    lost = expect_event(events.LOST, group)
    inside = threading.Event()
    holder = Runner(lambda: hold_until_lost(ylock.Lock(engine, group, "n", lease=1.5), journal, inside))
    holder.start()
    assert inside.wait(10)
    waiter = Runner(lambda: take(ylock.Lock(engine, group, "n"), journal, "waiter"))
    waiter.start()
    wait_until(lambda: len(waiters(engine, group, "n")) == 1, what="a queued waiter")
    (conn,), = mariadb_server.query(
        "SELECT DISTINCT conn FROM ylock_holds WHERE grp = %s AND IS_USED_LOCK(mark) IS NOT NULL", [group])
    mariadb_server.query(f"KILL {int(conn)}")
    killed = time.monotonic()
    record = waiter.outcome(15)
    assert lost.wait(5), "the holder was not told"
    told = time.monotonic() - killed
    holder.outcome(15)
    verdict = journal.check()
    figures(f"holder's session KILLed: waiter in after {record.granted - killed:.3f} s, holder told within "
            f"{told:.2f} s; {verdict}")
    assert record.granted - killed < 1.0 and verdict.lost == 1


def test_a_server_restart_loses_holds_tokens_rise_and_the_engine_recovers(own_mariadb, engines, group, figures):
    engine = engines(own_mariadb.url)
    lost = expect_event(events.LOST, group)
    holder = ylock.Lock(engine, group, "n", lease=1.5)
    holder.lock()
    before = holder.token
    with ylock.Lock(engine, group, "pooled").write(timeout=5):
        pass                                              # leaves an idle connection in the pool
    restarted = time.monotonic()
    own_mariadb.restart()                                 # SIGKILL: a crash of the server
    assert lost.wait(10), "the restart did not make the hold lost"
    figures(f"server killed and restarted: holder told lost after {time.monotonic() - restarted:.2f} s")
    with pytest.raises(ylock.LockLost):
        holder.unlock()
    again = ylock.Lock(engine, group, "n")
    assert again.try_lock(5)                              # stale pooled connections are replaced
    assert again.token is not None and before is not None
    assert again.token > before                           # the AUTO_INCREMENT survived the crash
    again.unlock()


def test_a_paused_or_stopped_server_bounds_every_call(own_mariadb, engines, group, figures):
    engine = engines(own_mariadb.url + "?socket_timeout=0.5&connect_timeout=0.5&idle_connections=4")
    lock = ylock.Lock(engine, group, "n")
    assert lock.try_lock(5)
    lock.unlock()
    own_mariadb.pause()
    try:
        for timeout in (0.0, 0.5):
            call = timed(ylock.Lock(engine, group, "n").try_lock, timeout)
            assert isinstance(call.error, ylock.EngineUnavailable), call
            call.within(0, timeout + 0.5 + 0.5 + SLACK, "try_lock on a paused server")   # + socket + connect
        fresh = engines(own_mariadb.url + "?connect_timeout=0.5")
        call = timed(ylock.Lock(fresh, group, "m").try_lock, 0.2)
        assert isinstance(call.error, ylock.EngineUnavailable) and "answer" in str(call.error), call
        call.within(0, 0.5 + SLACK, "connecting to a paused server")
        figures(f"paused server: a fresh connection gave up after {call.elapsed:.2f} s (connect_timeout 0.5 s)")
    finally:
        own_mariadb.resume()
    assert ylock.Lock(engine, group, "n").try_lock(5)
    own_mariadb.stop()
    try:
        down = engines(own_mariadb.url + "?connect_timeout=0.5")
        call = timed(ylock.Lock(down, group, "n").try_lock, 1)
        assert isinstance(call.error, ylock.EngineUnavailable) and "unavailable" in str(call.error), call
        assert own_mariadb.password not in str(call.error) and own_mariadb.password not in repr(down)
        call.within(0, 0.5 + SLACK, "connecting to a stopped server")
    finally:
        own_mariadb.restart()
