"""Code run in child processes (spawned, so each is a fresh interpreter)."""
from __future__ import annotations

import os
import time
from typing import Any

import redis

import ylock


def counter(url: str, group: str, iterations: int, use_lock: bool, fair: bool = True,
            start: Any = None) -> dict[str, Any]:
    """Increment a Redis counter non-atomically (GET, pause, SET), inside the lock or not;
    with ``start`` (a barrier), every process begins at once."""
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "counter", fair=fair, lease=5)
    client = redis.Redis.from_url(url)
    client.ping()
    if start is not None:
        start.wait(60)
    tokens = []
    for _ in range(iterations):
        if use_lock:
            lock.lock(timeout=30)
        try:
            value = int(client.get(f"{group}:counter") or 0)
            time.sleep(0.0005)              # widen the race window a lock must close
            client.set(f"{group}:counter", value + 1)
            if use_lock:
                tokens.append(lock.token)
        finally:
            if use_lock:
                lock.unlock()
    return {"pid": os.getpid(), "tokens": tokens}



def wait_in_queue(url: str, group: str, conn: Any) -> None:
    """Queue for the write lock (it is held elsewhere) and never get it: we get killed."""
    engine = ylock.engine_from_url(url)
    conn.send(("owner", ylock.current_owner()))
    ylock.Lock(engine, group, "n", polling=ylock.Polling.constant(0.2)).lock(timeout=60)
    conn.send(("acquired", None))
