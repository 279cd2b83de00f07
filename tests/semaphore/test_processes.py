"""Semaphores and all_of with real processes on real servers: never more than N holders,
no deadlock when two processes name the same locks in opposite orders."""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.semaphore import workers

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


@pytest.fixture(params=["redis", "zookeeper"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url  # type: ignore[no-any-return]
    return request.getfixturevalue("zookeeper_server").url("/sem")  # type: ignore[no-any-return]


def test_never_more_than_permits_holders_across_processes(url: str, group: str, tmp_path: Path) -> None:
    path = str(tmp_path / "inside.json")
    Path(path).write_text("{}")
    with ProcessPoolExecutor(6, mp_context=spawn) as pool:
        done = [f.result(timeout=240) for f in [pool.submit(workers.hold_permits, url, group, 3, path, 15)
                                                for _ in range(6)]]
    state = json.loads(Path(path).read_text())
    assert sum(done) == 90 and state["entries"] == 90 and state["now"] == 0
    assert state["max"] <= 3, state                    # the 4th never got in
    assert state["max"] >= 2, state                    # and permits were shared (not a plain mutex)


def test_all_of_in_opposite_orders_never_deadlocks(url: str, group: str) -> None:
    rounds = 1000
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        futures = [pool.submit(workers.opposite_orders, url, group, reverse, rounds) for reverse in (False, True)]
        assert [f.result(timeout=240) for f in futures] == [rounds, rounds]


def test_a_ticket_crosses_processes_and_keeps_token_and_exclusion(redis_server, group, tmp_path: Path) -> None:
    import ylock
    from ylock.testing.fencing import FencedRegister

    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "job", lease=2.0)
    lock.lock()
    token = lock.token
    # 20 s for the ticket to be adopted (a spawned process takes more than the 2 s lease to
    # start on a loaded machine); once adopted, the hold's own 2 s lease applies again
    ticket = lock.detach(lease=20).as_dict()
    register = str(tmp_path / "register")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        # held for longer than its lease: the adopting process's watchdog renews it
        adopted = pool.submit(workers.adopt_and_hold, redis_server.url, ticket, register, 3.0)
        wait_until(lambda: FencedRegister(register).accepted == 1, timeout=30, what="the adopter inside")
        assert ylock.Lock(engine, group, "job").try_lock(0.5) is False     # still held, by the adopter
        assert adopted.result(timeout=60) == (token, True)
    with pytest.raises(ylock.LockLost):
        ylock.Lock.adopt(engine, ticket)                                    # adopted once
    assert ylock.Lock(engine, group, "job").try_lock(1) is True


def test_a_ticket_never_adopted_frees_after_its_lease(url: str, group: str) -> None:
    import time

    import ylock

    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "job", lease=1.0)
    lock.lock()
    lock.detach()
    started = time.monotonic()
    other_engine = ylock.engine_from_url(url)
    other = ylock.Lock(other_engine, group, "job")
    assert other.try_lock(10) is True
    assert time.monotonic() - started < 1.0 + 1.5                         # the lease bounds it
    other.unlock()
    for each in (engine, other_engine):
        each.close()


def test_zookeeper_refuses_a_ticket_from_another_process(zookeeper_server, group) -> None:
    import ylock

    url = zookeeper_server.url("/tickets")
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "job")
    lock.lock()
    ticket = lock.detach()._replace(process="another-host:1:abc")
    other = ylock.engine_from_url(url)
    with pytest.raises(ylock.ConfigurationError, match="only in the process that detached it"):
        ylock.Lock.adopt(other, ticket)
    for each in (engine, other):
        each.close()
