"""Faults of ZooKeeper servers and sessions: a holder killed, a session expired, the leader
killed under load (the holds journalled: exclusion across the election), the quorum lost, a
force-release right after the acquisition. The engine's other behaviour on a real server is
in tests/zookeeper/test_engine.py."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from kazoo.client import KazooClient

import ylock
from tests.faults import workers as fault_workers
from tests.helpers import LockLoad, expect_event, wait_until
from ylock import events
from ylock.testing.zookeeper import ZooKeeperEnsemble

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


def test_killed_holder_frees_the_lock_within_the_session_timeout(zookeeper_server, group):
    url = zookeeper_server.url("/kill") + "?session_timeout=2"
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=fault_workers.hold, args=(url, group, child))
    proc.start()
    kind, token, _ = parent.recv()
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "n")
    lock.lock(timeout=20)
    elapsed = time.monotonic() - killed
    assert lock.token > token
    lock.unlock()
    engine.close()
    proc.join(5)
    assert elapsed < 2.0 * 1.5 + 1.0, elapsed         # the server expires the session (negotiated <= 2 s)


def test_expired_session_marks_holds_lost(zookeeper_server, group):
    engine = ylock.engine_from_url(zookeeper_server.url("/expire") + "?session_timeout=2")
    lock = ylock.Lock(engine, group, "n")
    lost = expect_event(events.LOST, group)
    lock.lock()
    # Expire the session from the server's side: a second client with the same session
    # id and password closes it (the kazoo test harness's trick).
    session_id, password = engine.client.client_id  # type: ignore[attr-defined]
    twin = KazooClient(hosts=zookeeper_server.hosts)
    twin._session_id, twin._session_passwd = session_id, password
    twin.start(timeout=10)
    twin.stop()
    twin.close()
    assert lost.wait(15), "session expiry was not reported"
    assert lock.lost
    with pytest.raises(ylock.LockLost):
        lock.unlock()
    other_engine = ylock.engine_from_url(zookeeper_server.url("/expire"))
    other = ylock.Lock(other_engine, group, "n")
    assert other.try_lock(10)
    other.unlock()
    assert lock.try_lock(10)                           # the engine reconnects with a new session
    lock.unlock()
    # (Engines left open would go on reconnecting, in the background of later tests, to
    # servers stopped by then.)
    for each in (engine, other_engine):
        each.close()


def test_leader_killed_under_load_nothing_hangs(group, tmp_path):
    ensemble = ZooKeeperEnsemble(3).start()
    try:
        engine = ylock.engine_from_url(ensemble.url("/leader") + "?session_timeout=4")
        locks = [ylock.Lock(engine, group, f"n{i % 2}") for i in range(3)]
        with LockLoad(locks, timeout=2, directory=tmp_path) as load:
            load.progress(20, timeout=10, what="load running")
            ensemble.leader().stop()
            load.progress(20, timeout=45, what="progress after the leader died")
            # ZooKeeper's writes go through a quorum: a new leader has every grant, so the
            # holds exclude each other across the election (a holder whose session ended is told).
            verdicts = load.stop(join=15)
        print("leader killed:", load.outcomes, verdicts)
        engine.close()
    finally:
        ensemble.stop()


def test_quorum_lost_fails_within_timeouts_and_recovers(group):
    ensemble = ZooKeeperEnsemble(3).start()
    try:
        engine = ylock.engine_from_url(ensemble.url("/quorum") + "?session_timeout=6&connect_timeout=2")
        lock = ylock.Lock(engine, group, "n")
        assert lock.try_lock(5)
        lock.unlock()
        for node in ensemble.nodes[:2]:
            node.stop()                                # 1 of 3 left: no quorum
        for _ in range(3):
            started = time.monotonic()
            try:
                got = lock.try_lock(timeout=1)
                assert got is False
            except ylock.EngineUnavailable:
                pass
            assert time.monotonic() - started < 1 + 1.5 + 0.5, "a call outlived its timeout"
        for node in ensemble.nodes[:2]:
            node.start()
        ensemble.wait_serving()
        wait_until(lambda: _try(lock), timeout=60, what="locking to work again")
        engine.close()
    finally:
        ensemble.stop()


def _try(lock: ylock.Lock) -> bool:
    try:
        if lock.try_lock(timeout=2):
            lock.unlock()
            return True
    except (ylock.EngineUnavailable, ylock.LockLost):
        return False
    return False


def test_force_release_is_seen_however_soon_it_comes(zookeeper_server, group):
    """The loss watch rides on the recipe's own children read: a force-release right after
    the acquisition, or while another client waits, is reported every time."""
    engine = ylock.engine_from_url(zookeeper_server.url("/force"))
    other = ylock.engine_from_url(zookeeper_server.url("/force"))
    for i in range(16):
        name = f"n{i}"
        lock = ylock.Lock(engine, group, name)
        lock.lock()
        waiter = None
        if i % 2:
            waiter = threading.Thread(target=_take_and_give_back, args=(other, group, name))
            waiter.start()
            wait_until(lambda n=name: any(info.waiters for info in other.describe(group) if info.name == n),
                       what="a waiter")
        assert other.force_release(group, name) is True
        wait_until(lambda lk=lock: lk.lost, what=f"iteration {i}: the force-release reported as a loss")
        with pytest.raises(ylock.LockLost):
            lock.unlock()
        if waiter is not None:
            waiter.join(10)
            assert not waiter.is_alive()
            other.force_release(group, name)      # whatever the waiter (dropped with the holder) did next
    engine.close()
    other.close()


def _take_and_give_back(engine: ylock.Engine, group: str, name: str) -> None:
    """A waiter dropped with the holder queues again and gets the lock: it gives it back (a
    hold left to the end of the session would be released at exit, after the server stopped)."""
    lock = ylock.Lock(engine, group, name)
    if lock.try_lock(5):
        lock.unlock()
