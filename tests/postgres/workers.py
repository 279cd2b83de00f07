"""Code run in spawned child processes (each a fresh interpreter) by the fault tests."""
from __future__ import annotations

from typing import Any

import ylock
from ylock.testing.fencing import UnfencedCounter


def counter(url: str, group: str, path: str, iterations: int, use_lock: bool, start: Any) -> list[int]:
    """Increment the unfenced counter (read, pause, write) ``iterations`` times, inside the
    write lock or not; all processes start at once. Return the tokens of the holds."""
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "counter", lease=5)
    count = UnfencedCounter(path, pause=0.001)
    engine.ping()
    start.wait(60)
    tokens = []
    for _ in range(iterations):
        if use_lock:
            lock.lock(timeout=30)
            tokens.append(lock.token)
        try:
            count.increment()
        finally:
            if use_lock:
                lock.unlock()
    engine.close()
    return tokens



def wait_forever(url: str, group: str, conn: Any) -> None:
    """Queue for the write lock (held elsewhere) with no timeout: the test kills us."""
    engine = ylock.engine_from_url(url)
    conn.send(("queued", ylock.current_owner()))
    ylock.Lock(engine, group, "n").lock()
