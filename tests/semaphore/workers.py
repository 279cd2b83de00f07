"""Code run in child processes (spawned) by the semaphore and all_of tests."""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ylock


@contextmanager
def _locked(path: str) -> Iterator[dict[str, Any]]:
    with open(path + ".lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            state = json.loads(Path(path).read_text() or "{}")
            yield state
            Path(path).write_text(json.dumps(state))
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def inside(path: str, delta: int, owner: str) -> None:
    """Count holders inside the semaphore (a file every process shares, under flock)."""
    with _locked(path) as state:
        now = state.get("now", 0) + delta
        state["now"] = now
        state["max"] = max(state.get("max", 0), now)
        if delta > 0:
            state["entries"] = state.get("entries", 0) + 1
            state.setdefault("owners", [])
            if owner not in state["owners"]:
                state["owners"].append(owner)


def hold_permits(url: str, group: str, permits: int, path: str, rounds: int) -> int:
    sem = ylock.Semaphore(ylock.engine_from_url(url), group, "s", permits=permits)
    owner = f"{os.getpid()}"
    for _ in range(rounds):
        with sem.hold(timeout=60):
            inside(path, +1, owner)
            time.sleep(0.002)          # the work inside: long enough for holders to overlap
            inside(path, -1, owner)
    return rounds


def opposite_orders(url: str, group: str, reverse: bool, rounds: int) -> int:
    engine = ylock.engine_from_url(url)
    a, b = ylock.Lock(engine, group, "a"), ylock.Lock(engine, group, "b")
    guards = [a.write, b.write]
    if reverse:
        guards.reverse()
    done = 0
    for _ in range(rounds):
        with ylock.all_of(guards[0](), guards[1](), timeout=30):
            done += 1
    return done


def adopt_and_hold(url: str, ticket: dict[str, Any], register: str, hold_for: float) -> tuple[int, bool]:
    """Adopt a ticket in this process, write to the fenced register with its token, keep it
    ``hold_for`` seconds (renewed by this process's watchdog), release."""
    from ylock.testing.fencing import FencedRegister

    lock = ylock.Lock.adopt(ylock.engine_from_url(url), ticket)
    accepted = FencedRegister(register).increment(lock.token)  # type: ignore[arg-type]
    time.sleep(hold_for)
    token = lock.token
    lost = lock.lost
    lock.unlock()
    return token, accepted and not lost  # type: ignore[return-value]
