"""The ZooKeeper engine on a real server: processes that lose no update, storage that shrinks
back after many names, options checked. Its faults are in tests/faults/test_zookeeper*.py."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

import ylock
from tests.helpers import wait_until
from tests.zookeeper import workers

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
        # (a hang guard: the 10,000 deletes took longer than 15 s on a CI machine at load 8)
        wait_until(lambda: count() == start, timeout=90, what="lock parents reaped")
    finally:
        zk.stop()
        zk.close()
        engine.close()


def test_bad_options_are_configuration_errors_that_name_them():
    with pytest.raises(ylock.ConfigurationError, match=r"unknown ZooKeeper engine option bogus \(known: "):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x", bogus=1)
    with pytest.raises(ylock.ConfigurationError, match="unknown zookeeper URL option bogus"):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x?bogus=1")
    with pytest.raises(ylock.ConfigurationError, match="session_timeout must be a number of seconds"):
        ylock.engine_from_url("zookeeper://127.0.0.1:2181/x?session_timeout=-1")
