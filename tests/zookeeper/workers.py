"""Code run in child processes (spawned)."""
from __future__ import annotations

import time
from pathlib import Path

import ylock


def counter(url: str, group: str, path: str, iterations: int) -> list[int]:
    """Increment a number in a file non-atomically (read, pause, write) inside the lock."""
    lock = ylock.Lock(ylock.engine_from_url(url), group, "counter")
    tokens = []
    for _ in range(iterations):
        with lock.write(timeout=60):
            value = int(Path(path).read_text() or 0)
            time.sleep(0.001)
            Path(path).write_text(str(value + 1))
            tokens.append(lock.token)
    return tokens  # type: ignore[return-value]
