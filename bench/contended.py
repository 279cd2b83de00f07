"""Contended handoff: worker processes take one lock in turn and bump a non-atomic Redis
counter (GET, then SET) inside it, logging when they asked, got and gave back the lock."""
from __future__ import annotations

import statistics
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import redis

from bench import peers
from bench.common import spawn
from ylock.testing.zookeeper import four_letter


def _pair(lib: str, redis_url: str, zk_hosts: str, name: str) -> tuple[Any, Any, Any]:
    client = redis.Redis.from_url(redis_url)
    if lib == "ylock redis (notify)":
        return (*peers.ylock_pair(peers.ylock_engine(redis_url), name), None)
    if lib == "ylock redis (polling only)":
        return (*peers.ylock_pair(peers.ylock_engine(redis_url + "?notify=false"), name), None)
    if lib == "ylock zookeeper":
        return (*peers.ylock_pair(peers.ylock_engine(f"zookeeper://{zk_hosts}/bench"), name), None)
    if lib == "fair-handoff floor (ticket lock)":
        return (*peers.ticket_lock(client, name), None)
    if lib == "hand-written SET NX":
        return (*peers.hand_written(client, name), None)
    if lib == "redis-py Lock":
        return (*peers.redis_py(client, name), None)
    if lib == "python-redis-lock":
        return (*peers.python_redis_lock(client, name), None)
    if lib == "sherlock":
        return (*peers.sherlock_lock(client, name), None)
    if lib == "pottery Redlock":
        return (*peers.pottery_redlock(client, name), None)
    if lib == "tooz redis":
        coordinator = peers.tooz_coordinator(redis_url.replace("redis://", "redis://", 1))
        return (*peers.tooz_pair(coordinator, name), coordinator)
    if lib == "kazoo Lock":
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=zk_hosts + "/bench")
        zk.start()
        return (*peers.kazoo_pair(zk, name, "lock"), zk)
    if lib == "no lock (control)":
        return (lambda: None), (lambda: None), None
    raise ValueError(lib)


def worker(lib: str, redis_url: str, zk_hosts: str, name: str, start_at: float, duration: float,
           max_ops: int, procs: int = 0) -> list[tuple[int, int, int]]:
    """Run in a spawned process; return (asked, got, released) ns timestamps per acquisition.
    With ``procs``, start when all ``procs`` workers are ready (the last one to get ready
    releases the others, through Redis: on a loaded machine a spawned process can take
    longer to start than any fixed lead time), else at ``start_at``."""
    counter = redis.Redis.from_url(redis_url)
    try:
        acquire, release, keep = _pair(lib, redis_url, zk_hosts, name)
    except BaseException:
        if procs:       # let the others go rather than wait for a worker that will never come
            counter.rpush(f"go:{name}", *["go"] * procs)
        raise
    key = f"counter:{name}"
    log: list[tuple[int, int, int]] = []
    if procs:
        if counter.incr(f"ready:{name}") == procs:
            counter.rpush(f"go:{name}", *["go"] * procs)
        # its own client: redis-py's default 5 s socket timeout would cut a long BLPOP short
        # (16 processes spawning on a loaded machine take longer than that)
        with redis.Redis.from_url(redis_url, socket_timeout=330) as barrier:
            if barrier.blpop([f"go:{name}"], 300) is None:
                raise TimeoutError(f"not all {procs} workers were ready within 300 s")
        start_at = time.time()
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + duration
    while time.time() < end and len(log) < max_ops:
        asked = time.time_ns()
        acquire()
        got = time.time_ns()
        value = int(counter.get(key) or 0)
        counter.set(key, value + 1)
        released = time.time_ns()
        release()
        log.append((asked, got, released))
    del keep
    return log


def analyse(logs: list[list[tuple[int, int, int]]], counter: int) -> dict[str, Any]:
    """Turn the workers' logs into the table's numbers."""
    events = sorted((got, rel, asked, proc) for proc, log in enumerate(logs) for asked, got, rel in log)
    total = len(events)
    gaps, cross_waits = [], []
    same = 0
    for prev, cur in zip(events, events[1:]):
        gaps.append((cur[0] - prev[1]) / 1e6)
        if cur[3] == prev[3]:
            same += 1
        else:
            cross_waits.append((cur[0] - cur[2]) / 1e6)
    span = (events[-1][1] - events[0][0]) / 1e9 if total > 1 else 1.0
    counts = [len(log) for log in logs]

    def pct(values: list[float], p: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]
    return {
        "acquisitions": total,
        "acq_per_s": total / span if span > 0 else 0.0,
        "lost_updates": total - counter,
        "gap_p50_ms": statistics.median(gaps) if gaps else None,
        "gap_p99_ms": pct(gaps, 0.99),
        "self_reacquire": same / max(1, total - 1),
        "cross_wait_p50_ms": pct(cross_waits, 0.5),
        "cross_wait_p99_ms": pct(cross_waits, 0.99),
        "cross_wait_max_ms": max(cross_waits) if cross_waits else None,
        "fairness_max_min": (max(counts) / min(counts)) if counts and min(counts) > 0 else float("inf"),
    }


def contended_run(lib: str, redis_url: str, zk_hosts: str, procs: int, duration: float, client: redis.Redis,
                  zk_port: int | None = None) -> dict[str, Any]:
    """Run ``procs`` processes of :func:`bench.worker` on one lock of ``lib`` for
    ``duration`` seconds; return :func:`bench.analyse`'s row with the Redis commands
    (INFO commandstats, minus the counter's GET and SET) and, with ``zk_port``, the ZooKeeper
    requests per acquisition. The processes inherit this one's CPU affinity."""
    name = uuid.uuid4().hex[:10]
    before = client.info("commandstats")
    zk_before = zk_received(zk_port) if zk_port else 0
    with ProcessPoolExecutor(procs, mp_context=spawn) as pool:
        futures = [pool.submit(worker, lib, redis_url, zk_hosts, name, 0.0, duration, 200_000, procs)
                   for _ in range(procs)]
        logs = [f.result(timeout=300) for f in futures]
    counter = int(client.get(f"counter:{name}") or 0)
    row = analyse(logs, counter)
    after = client.info("commandstats")
    calls = sum(after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after
                if not k.startswith(("cmdstat_info", "cmdstat_config")))
    # minus the counter's own GET and SET
    row["redis_cmds_per_acq"] = calls / max(1, row["acquisitions"]) - 2
    if zk_port:
        row["zk_requests_per_acq"] = (zk_received(zk_port) - zk_before) / max(1, row["acquisitions"])
    return row


def zk_received(port: int) -> int:
    """The requests the ZooKeeper server on ``port`` received so far (``srvr``)."""
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Received:"):
            return int(line.split(":")[1])
    return 0
