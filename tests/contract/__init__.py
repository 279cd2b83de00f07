"""The contract suite: each test runs on every engine (the ``engine`` fixture, see
tests/conftest.py). What its modules share."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ylock
from tests.helpers import Runner


def sem(engine: ylock.Engine, group: str, permits: int = 2, name: str = "s", **kw: object) -> ylock.Semaphore:
    return ylock.Semaphore(engine, group, name, permits=permits, **kw)  # type: ignore[arg-type]


def other(func: Callable[[], Any]) -> Any:
    """Run ``func`` in another thread (another owner) and return its outcome."""
    runner = Runner(func)
    runner.start()
    return runner.outcome()
