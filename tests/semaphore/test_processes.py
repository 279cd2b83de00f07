"""Semaphores and all_of with real processes on real servers: never more than N holders,
no deadlock when two processes name the same locks in opposite orders."""
from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

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
