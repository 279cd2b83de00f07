"""More threads (or greenlets) of one process waiting for one lock than the connection pool
holds (redis-py 8's default: 100): waiters take at most half the pool (beyond that they
share one blocking pop), a call that finds the lock path's connections busy waits for one,
and the holder's renewals and release always find one. On a real redis-server."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

import ylock
from tests.helpers import waiters

pytestmark = pytest.mark.timeout(120)

THREADS = 300


def blocked_clients(admin: redis.Redis, name: str) -> int:
    """How many connections named ``name`` are blocked in a command (BLPOP) on the server."""
    return sum(1 for c in admin.client_list() if c.get("name") == name and "b" in c.get("flags", ""))


@pytest.mark.parametrize("max_connections", [None, 10])
def test_more_waiting_threads_than_the_pool_holds_all_get_the_lock(redis_server, group, max_connections):
    name = f"waiters{uuid.uuid4().hex[:8]}"
    query = f"client_name={name}" + ("" if max_connections is None else f"&max_connections={max_connections}")
    pool = max_connections or 100                          # redis-py 8's default
    engine = ylock.engine_from_url(f"{redis_server.url}?{query}")
    admin = redis.Redis.from_url(redis_server.url)
    # Renewed while they wait, every lease / 3; 4 s, so that a renewal thread starved for a
    # second by 300 starting threads on a loaded machine does not lose it (the test is about
    # the renewals finding a connection, watched for 3 s below).
    lease = 4.0
    holder = ylock.Lock(engine, group, "n", lease=lease)
    errors: list[BaseException] = []
    inside = [0]
    most_inside = [0]
    got: list[int] = []
    start = threading.Barrier(THREADS + 1)

    def wait() -> None:
        lock = ylock.Lock(engine, group, "n")
        start.wait()
        try:
            lock.lock(timeout=60)
        except BaseException as exc:  # noqa: BLE001 - every failure is counted
            errors.append(exc)
            return
        try:
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
            got.append(lock.token or 0)
            inside[0] -= 1
        finally:
            try:
                lock.unlock()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    holder.lock()
    acquired_at = time.monotonic()
    threads = [threading.Thread(target=wait) for _ in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        start.wait()
        queued_at = time.monotonic()
        deadline = queued_at + 60
        # Each thread seen queued once: on a loaded machine a waiter whose poll comes late drops
        # out of the queue for a moment and queues again, so all are not always there at once.
        seen: set[str] = set()
        while len(seen) < THREADS and not errors:
            assert time.monotonic() < deadline, f"only {len(seen)} seen queued"
            seen.update(waiters(engine, group, "n"))
            time.sleep(0.05)
        assert not errors, f"{len(errors)} waiters failed, e.g. {errors[0]!r}"
        # The holder's renewals find a connection: watched for 3 s, and past its first lease
        # (held then only if renewed; the release below raises LockLost had one failed).
        until = max(queued_at + 3.0, acquired_at + lease + 0.5)
        while time.monotonic() < until:
            assert holder.held() and not holder.lost
            # Waiters hold at most half the pool: the rest wait in one BLPOP (the notify hub).
            blocked = blocked_clients(admin, name)
            assert blocked <= pool // 2 + 1, f"{blocked} connections blocked in a pop while {THREADS} threads wait"
            time.sleep(0.05)
    finally:
        released = time.monotonic()
        holder.unlock()                                      # raises LockLost had a renewal failed
        for thread in threads:
            thread.join(90)
    took = time.monotonic() - released
    assert not errors, f"{len(errors)} of {THREADS} waiters failed, e.g. {errors[0]!r}"
    assert len(got) == THREADS and most_inside[0] == 1
    assert sorted(got) == got and len(set(got)) == THREADS, "the tokens must increase hold after hold"
    assert took < 30, f"{THREADS} handoffs took {took:.1f}s"
    assert engine.describe_lock(group, "n") is None
    engine.close()
    admin.close()


GEVENT_WAITERS = Path(__file__).with_name("gevent_waiters.py")


def test_more_waiting_greenlets_than_the_pool_holds_all_get_the_lock(redis_server, group):
    """The same under gevent (gunicorn's gevent workers): 300 greenlets of one process, the
    default pool. In a process of its own: gevent patches the standard library."""
    root = str(Path(__file__).parents[2])           # this checkout's ylock, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(GEVENT_WAITERS), redis_server.url, group, str(THREADS)],
                          capture_output=True, text=True, timeout=90, cwd=root, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[-1] == f"{THREADS}/{THREADS}", done.stdout + done.stderr
