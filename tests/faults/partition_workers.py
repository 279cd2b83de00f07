"""The waiter of the ZooKeeper partition tests, in a process of its own (spawned): it times its
grant with ``time.monotonic()``, CLOCK_MONOTONIC on Linux, one clock for every process of the
machine, so its record compares with the test process's."""
from __future__ import annotations

from typing import Any

import ylock
from tests.faults.workers import Checkers, write_inside


def queue_then_hold(url: str, group: str, name: str, checkers: Checkers, conn: Any) -> None:
    """Wait for ``group``/``name`` on ``url`` (up to a minute), write three times inside, release
    it, and send the record of the hold (or the error that ended the wait)."""
    engine = ylock.engine_from_url(url)
    try:
        lock = ylock.Lock(engine, group, name)
        lock.lock(timeout=60)
        conn.send(("record", write_inside(lock, "W", checkers, writes=3)))
    except Exception as exc:  # noqa: BLE001 - the test reports it
        conn.send(("error", repr(exc)))
    finally:
        engine.close()
