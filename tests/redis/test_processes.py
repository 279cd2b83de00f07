"""Cross-process guarantees on a real redis-server: the no-lost-update counter, and the
faults a holder or waiter process can suffer (SIGKILL, SIGSTOP, fork)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
import redis

import ylock
from tests.faults import workers as fault_workers
from tests.helpers import wait_until, waiters
from tests.redis import workers

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


def run_counter(url: str, group: str, processes: int, iterations: int, use_lock: bool, fair: bool = True) -> int:
    with spawn.Manager() as manager, ProcessPoolExecutor(processes, mp_context=spawn) as pool:
        start = manager.Barrier(processes)          # all begin together: the race is real
        futures = [pool.submit(workers.counter, url, group, iterations, use_lock, fair, start)
                   for _ in range(processes)]
        results = [f.result(timeout=120) for f in futures]
    if use_lock:
        tokens = sorted(t for r in results for t in r["tokens"])
        assert len(set(tokens)) == len(tokens) == processes * iterations   # every hold had its own token
    return int(redis.Redis.from_url(url).get(f"{group}:counter") or 0)


@pytest.mark.parametrize("fair", [True, False])
def test_processes_lose_no_update_inside_the_lock(redis_server, group, fair):
    assert run_counter(redis_server.url, group, 4, 40, use_lock=True, fair=fair) == 160


def test_control_without_the_lock_loses_updates(redis_server, group):
    # Proves the counter can catch a broken lock: the same work without it loses updates.
    assert run_counter(redis_server.url, group, 4, 40, use_lock=False) < 160


def test_killed_holder_frees_the_lock_within_its_lease(redis_server, group):
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=fault_workers.hold, args=(redis_server.url, group, child, 1.0))
    proc.start()
    assert parent.recv()[0] == "acquired"
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "n", polling=ylock.Polling.constant(0.1))
    lock.lock(timeout=10)
    elapsed = time.monotonic() - killed
    lock.unlock()
    proc.join(5)
    assert elapsed <= 1.0 + 0.1 + 0.4, elapsed          # lease + one poll + scheduling slack


def test_killed_head_waiter_is_evicted_within_the_waiter_lease(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    holder = ylock.Lock(engine, group, "n")
    holder.lock()
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=workers.wait_in_queue, args=(redis_server.url, group, child))
    proc.start()
    dead_owner = parent.recv()[1]
    wait_until(lambda: waiters(engine, group, "n") == [f"write:{dead_owner}"], what="child queued")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(5)
    got = threading.Event()

    def next_waiter() -> None:
        lock = ylock.Lock(engine, group, "n", polling=ylock.Polling.constant(0.1))
        lock.lock(timeout=20)
        got.set()
        lock.unlock()
    thread = threading.Thread(target=next_waiter, daemon=True)
    thread.start()
    wait_until(lambda: len(waiters(engine, group, "n")) == 2, what="second waiter queued")
    released = time.monotonic()
    holder.unlock()
    assert got.wait(10)
    elapsed = time.monotonic() - released
    thread.join(5)
    # The dead head's liveness key (or a grant made to it) outlives it by at most its
    # waiter lease (1 s: three 0.2 s polls, and never under a second); then the next
    # poll (0.1 s) takes the lock.
    assert elapsed <= 1.0 + 0.1 + 0.5, elapsed


def test_paused_holder_loses_the_lock_and_is_fenced(redis_server, group):
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=fault_workers.hold, args=(redis_server.url, group, child, 1.0))
    proc.start()
    kind, stale_token, _ = parent.recv()
    assert kind == "acquired"
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        engine = ylock.engine_from_url(redis_server.url)
        lock = ylock.Lock(engine, group, "n")
        lock.lock(timeout=10)                      # possible only once the paused lease ran out
        new_token = lock.token
        lock.unlock()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert new_token is not None and new_token > stale_token
    # The resumed holder's watchdog finds another owner (or no lock) and flags the loss.
    deadline = time.monotonic() + 10
    while True:
        parent.send("status")
        if parent.recv() == ("status", True):
            break
        assert time.monotonic() < deadline, "the paused holder never saw lock.lost"
        time.sleep(0.05)
    parent.send("unlock")
    kind, message = parent.recv()
    assert kind == "lost" and group in message
    proc.join(5)


def test_fork_while_holding_child_holds_nothing(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "n")
    lock.lock()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        status = 1
        try:
            child_lock = ylock.Lock(engine, group, "n")
            other = ylock.Lock(engine, group, "child-own")
            ok = (not child_lock.held() and child_lock.token is None
                  and child_lock.try_lock(0.1) is False            # the parent still holds it
                  and other.try_lock(2) and other.held())
            other.unlock()
            status = 0 if ok else 2
        finally:
            os.write(write_end, bytes([status]))
            os._exit(0)
    os.close(write_end)
    result = os.read(read_end, 1)
    os.waitpid(pid, 0)
    assert result == bytes([0])
    assert lock.held() and not lock.lost
    lock.unlock()


def test_no_keys_remain_but_fences_after_release(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    locks = ylock.Locks(engine, group)
    for i in range(20):
        with locks.write(f"user-{i}"):
            pass
        with locks.read(f"user-{i}"):
            pass
    client = redis.Redis.from_url(redis_server.url)
    keys = sorted(k.decode() for k in client.scan_iter(match=f"ylock:{{{group}:*"))
    assert len(keys) == 20 and all(k.endswith(":x") and client.get(k).endswith(b"|0|0|") for k in keys), keys[:5]
    assert all(0 < client.pttl(k) <= 86400 * 1000 for k in keys)   # fences are bounded in time
    assert not client.exists(f"ylock:i:{group}")                   # nothing listed
