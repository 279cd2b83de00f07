"""The ZooKeeper engine against real servers: processes, session loss, leader and quorum
loss, and storage that shrinks back."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

import ylock
from tests.helpers import LockLoad, expect_event, wait_until
from tests.zookeeper import workers
from ylock import events
from ylock.testing.zookeeper import ZooKeeperEnsemble

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


def test_processes_lose_no_update(zookeeper_server, group, tmp_path):
    path = tmp_path / "counter"
    path.write_text("0")
    url = zookeeper_server.url("/procs")
    with ProcessPoolExecutor(3, mp_context=spawn) as pool:
        results = [f.result(timeout=120) for f in [pool.submit(workers.counter, url, group, str(path), 25)
                                                   for _ in range(3)]]
    assert int(path.read_text()) == 75
    tokens = sorted(t for r in results for t in r)
    assert len(set(tokens)) == 75                      # czxid tokens: one per hold, all distinct


def test_killed_holder_frees_the_lock_within_the_session_timeout(zookeeper_server, group):
    url = zookeeper_server.url("/kill") + "?session_timeout=2"
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=workers.hold, args=(url, group, child))
    proc.start()
    kind, token = parent.recv()
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    lock = ylock.Lock(ylock.engine_from_url(url), group, "n")
    lock.lock(timeout=20)
    elapsed = time.monotonic() - killed
    assert lock.token > token
    lock.unlock()
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
    other = ylock.Lock(ylock.engine_from_url(zookeeper_server.url("/expire")), group, "n")
    assert other.try_lock(10)
    other.unlock()
    assert lock.try_lock(10)                           # the engine reconnects with a new session
    lock.unlock()


def test_storage_shrinks_back_after_many_names(zookeeper_server, group):
    engine = ylock.engine_from_url(zookeeper_server.url("/storage") + "?idle=0.5")
    zk = KazooClient(hosts=zookeeper_server.hosts)
    zk.start(timeout=10)
    try:
        def count() -> int:
            total, stack = 0, ["/storage"]     # this test's chroot (other tests tidy theirs)
            while stack:
                node = stack.pop()
                try:
                    children = zk.get_children(node)
                except NoNodeError:               # deleted by the reaper while we walk
                    continue
                total += len(children)
                stack.extend(f"{node}/{c}" for c in children)
            return total
        engine.ping()                                  # creates the chroot and root
        start = count()
        assert start == 1                              # /storage/ylock
        locks = ylock.Locks(engine, group)
        for i in range(10_000):
            with locks.write(f"user-{i}"):
                pass
        # kazoo leaves every lock's parent znode behind; the engine's reaper deletes those
        # that stayed unused for the idle period (it was already at work during the loop).
        wait_until(lambda: count() == start, timeout=15, what="lock parents reaped")
    finally:
        zk.stop()
        zk.close()
        engine.close()


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


def _take_and_give_back(engine: ylock.Engine, group: str, name: str) -> None:
    """A waiter dropped with the holder queues again and gets the lock: it gives it back (a
    hold left to the end of the session would be released at exit, after the server stopped)."""
    lock = ylock.Lock(engine, group, name)
    if lock.try_lock(5):
        lock.unlock()


def test_bad_options_are_configuration_errors_that_name_them():
    with pytest.raises(ylock.ConfigurationError, match=r"unknown ZooKeeper engine option bogus \(known: "):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x", bogus=1)
    with pytest.raises(ylock.ConfigurationError, match="unknown zookeeper URL option bogus"):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x?bogus=1")
    with pytest.raises(ylock.ConfigurationError, match="session_timeout must be a number of seconds"):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x?session_timeout=-1")
