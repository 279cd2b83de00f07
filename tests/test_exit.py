"""A process that exits normally (``sys.exit``, the end of its script, gunicorn's graceful
restart) gives back every hold it still has, on every engine: write, read, a downgraded
hold, a semaphore permit, a hold of a thread that has ended. One killed without running its
exit hooks (``os._exit``, as after SIGKILL) still costs the lease. And an exit with holds on
an engine that no longer answers ends within the exit budget, paying that engine's timeout
once, not once per hold. Real servers, real processes."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

import ylock
from ylock.testing.redis import RedisServer

pytestmark = pytest.mark.timeout(120)

HOLDER = r"""
import os, sys, threading
import ylock

url, group, how = sys.argv[1], sys.argv[2], sys.argv[3]
engine = ylock.engine_from_url(url)
ylock.Lock(engine, group, "write", lease=60).lock()
ylock.Lock(engine, group, "read", lease=60).rlock()
down = ylock.Lock(engine, group, "downgraded", lease=60)
down.lock(); down.rlock(); down.unlock()            # holds the read lock only
ylock.Semaphore(engine, group, "permits", permits=1, lease=60).acquire()
worker = threading.Thread(target=lambda: ylock.Lock(engine, group, "thread", lease=60).lock())
worker.start(); worker.join()                       # its owner is gone; its hold is not
print("holding", flush=True)
sys.stdin.read()                                    # until the test closes our stdin
if how == "crash":
    os._exit(0)                                     # no exit hooks, as after SIGKILL
sys.exit(0)
"""

NAMES = ("write", "read", "downgraded", "thread")


def url_of(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "redis":
        return str(request.getfixturevalue("redis_server").url)
    if kind == "zookeeper":
        # A session far longer than the test: only a release frees the nodes at once.
        return str(request.getfixturevalue("zookeeper_server").url("/exit")) + "?session_timeout=60"
    return str(request.getfixturevalue("postgres_server").url)


def free(engine: ylock.Engine, group: str) -> dict[str, bool]:
    """Which of the holder's locks another process can take at once."""
    out = {name: ylock.Lock(engine, group, name).try_lock(0) for name in NAMES}
    for name, taken in out.items():
        if taken:
            ylock.Lock(engine, group, name).unlock()
    permit = ylock.Semaphore(engine, group, "permits", permits=1)
    out["permits"] = permit.try_acquire(0)
    if out["permits"]:
        permit.release()
    return out


def run_holder(url: str, group: str, how: str) -> float:
    """Start the holder, let it take its holds, then let it exit; return how long the exit took."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, group, how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()                 # type: ignore[union-attr]
        assert line == "holding\n", proc.stderr.read()  # type: ignore[union-attr]
        began = time.monotonic()
        proc.stdin.close()                            # type: ignore[union-attr]
        assert proc.wait(30) == 0, proc.stderr.read()  # type: ignore[union-attr]
        return time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind", ["redis", "zookeeper", "postgresql"])
def test_a_normal_exit_gives_back_every_hold(request: pytest.FixtureRequest, group: str, kind: str) -> None:
    url = url_of(request, kind)
    engine = ylock.engine_from_url(url)
    try:
        took = run_holder(url, group, "exit")
        assert took < 5, f"the exit took {took:.2f} s"
        assert free(engine, group) == {name: True for name in (*NAMES, "permits")}
        for name in NAMES:
            assert engine.describe_lock(group, name) is None
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["redis", "zookeeper"])
def test_an_exit_without_its_hooks_still_costs_the_lease(request: pytest.FixtureRequest, group: str,
                                                         kind: str) -> None:
    # The control of the test above: its holds outlive a process that skipped its exit hooks
    # (PostgreSQL frees a session's advisory locks with its connection either way).
    url = url_of(request, kind)
    engine = ylock.engine_from_url(url)
    try:
        run_holder(url, group, "crash")
        assert free(engine, group) == {name: False for name in (*NAMES, "permits")}
        for info in list(engine.describe(group)):
            engine.force_release(group, info.name, kind=info.kind)
        assert list(engine.describe(group)) == []
    finally:
        engine.close()


EXITER = r"""
import sys
import ylock

engine = ylock.engine_from_url(sys.argv[1])
for n in range(6):
    ylock.Lock(engine, sys.argv[2], f"n{n}", lease=60).lock()
print("holding", flush=True)
sys.stdin.read()
"""


def test_an_exit_against_a_frozen_server_pays_one_timeout_not_one_per_hold(group: str) -> None:
    with RedisServer() as server:
        url = server.url + "?socket_timeout=0.5"
        proc = subprocess.Popen([sys.executable, "-c", EXITER, url, group], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline() == "holding\n", proc.stderr.read()  # type: ignore[union-attr]
            server.pause()                            # SIGSTOP: every call waits its socket timeout
            began = time.monotonic()
            proc.stdin.close()                        # type: ignore[union-attr]
            assert proc.wait(30) == 0
            took = time.monotonic() - began
            err = proc.stderr.read()                  # type: ignore[union-attr]
        finally:
            server.resume()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Six releases at 0.5 s each would take the whole 3 s budget: one timeout, then the
    # other holds are left to their lease at once.
    assert took < 2.0, f"the exit took {took:.2f} s"
    assert err.count("could not release") == 1, err
    assert "5 more holds left to their lease at exit" in err, err
