"""Faults on a real MariaDB: processes that die or freeze past their lease inside the lock;
a holder's session killed with ``KILL``; a server paused or down. Every test checks
exclusion with the journal of holds (the fenced register beside the unfenced counter) or
that every call ends within its bound, and notes the figures it measured. The racing
counter and the server restart are test_sql.py's, run on both SQL engines."""
from __future__ import annotations

import threading
import time

import pytest

import ylock
from tests.faults import SLACK, hold_until_lost, holder_process, take, timed
from tests.helpers import Runner, expect_event, wait_until, waiters
from ylock import events

pytestmark = pytest.mark.slow


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
