"""The core's single-flight (``ylock.singleflight``) across real processes on a real Redis
(the lock and the cache): a cold key read by many processes at once is computed once; a
computation that raises lets exactly one other process retry; a holder killed mid-computation
lets the next waiter compute once its lease has run out."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid

import pytest

import ylock
from tests.fencing import workers
from ylock import singleflight

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

READERS = 6


def run_readers(redis_server, group, tmp_path, fail_first: bool) -> tuple[list[str], list[str]]:
    prefix, key = f"sf{uuid.uuid4().hex[:8]}:", "report:2026-11"
    count_file = str(tmp_path / "computed")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Barrier(READERS)
    with ctx.Pool(READERS) as pool:
        pending = [pool.apply_async(workers.cold_reader, (redis_server.url, group, prefix, key, count_file,
                                                          fail_first, READERS, start)) for _ in range(READERS)]
        results = [p.get(120) for p in pending]
    return results, workers.calls(count_file)


def test_a_cold_key_read_by_many_processes_is_computed_once(redis_server, group, tmp_path):
    results, computed = run_readers(redis_server, group, tmp_path, fail_first=False)
    assert len(computed) == 1, f"computed {len(computed)} times by {computed}"
    assert results == [f"value computed by {computed[0]}"] * READERS


def test_a_computation_that_raises_lets_exactly_one_other_process_retry(redis_server, group, tmp_path):
    results, computed = run_readers(redis_server, group, tmp_path, fail_first=True)
    assert len(computed) == 2, f"computed {len(computed)} times by {computed}"
    assert results.count("error: the first computation fails") == 1
    assert sorted(results)[1:] == [f"value computed by {computed[1]}"] * (READERS - 1)


def test_a_holder_killed_while_computing_lets_the_next_waiter_compute(redis_server, group):
    prefix, key = f"sf{uuid.uuid4().hex[:8]}:", "dashboard"
    ctx = multiprocessing.get_context("spawn")
    end, child = ctx.Pipe()
    holder = ctx.Process(target=workers.dying_holder, args=(redis_server.url, group, prefix, key, child))
    holder.start()
    engine = ylock.engine_from_url(redis_server.url)
    try:
        assert end.poll(60) and end.recv() == "computing"
        lock = ylock.Lock(engine, group, singleflight.lock_name(key), lease=5)
        cache = workers.RedisCache(redis_server.url, prefix)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(
            singleflight.get_or_set(cache, key, lambda: "computed by the waiter", lock=lock, lock_timeout=30)))
        waiter.start()
        deadline = time.monotonic() + 30
        while not any(i.waiters for i in engine.describe(group)):        # the waiter is queued
            assert time.monotonic() < deadline, "the waiter never queued for the key's lock"
            time.sleep(0.01)
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        waiter.join(30)
        took = time.monotonic() - killed
        assert got == ["computed by the waiter"]
        assert cache.get(key) == "computed by the waiter"
        assert took < 1.0 + 3.0, f"the waiter computed {took:.1f}s after the holder died (lease 1 s)"
    finally:
        holder.kill()
        holder.join()
        engine.close()
