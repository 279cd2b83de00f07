"""The process's exit gives back what it still holds: :func:`release_all`, run at interpreter
exit (``atexit``) and by :mod:`ylock.sigterm` when a plain script is stopped with SIGTERM."""
from __future__ import annotations

import atexit
import logging
import time

from ylock.engines.base import WRITE
from ylock.errors import EngineUnavailable
from ylock.holds import HOLDS

__all__ = ["EXIT_BUDGET", "release_all"]

logger = logging.getLogger("ylock.lock")

#: Seconds the interpreter's exit may spend releasing what this process still holds.
EXIT_BUDGET = 3.0


def release_all(budget: float = EXIT_BUDGET) -> int:
    """Release every hold this process still has (all its owners, every mode), within
    ``budget`` seconds; return how many engine releases were made. Run at interpreter exit,
    so that a worker that exits normally (gunicorn's ``max_requests``, ``sys.exit``, the end
    of a management command) frees its locks at once instead of after their lease. A crash
    (SIGKILL) still costs the lease."""
    deadline = time.monotonic() + budget
    released = 0
    down: dict[int, int] = {}       # engines found unavailable: how many holds were left to their lease
    for hold in HOLDS.holds():
        HOLDS.remove(hold)
        for mode, _ in hold.held_modes():
            if time.monotonic() >= deadline:
                break
            if mode == WRITE:
                hold.writes = 0
            else:
                hold.reads = 0
            if id(hold.engine) in down:     # each would wait its connect timeout again: leave it
                down[id(hold.engine)] += 1
                continue
            try:
                hold.engine.release(hold.group, hold.name, hold.owner, mode)
                released += 1
            except EngineUnavailable as exc:
                down[id(hold.engine)] = 0
                logger.warning("ylock: could not release %s/%s at exit: %s", hold.group, hold.name, exc)
            except Exception as exc:  # noqa: BLE001 - at exit: its lease frees it
                logger.warning("ylock: could not release %s/%s at exit: %s", hold.group, hold.name, exc)
    skipped = sum(down.values())
    if skipped:
        logger.warning("ylock: %d more holds left to their lease at exit: their engine was unavailable", skipped)
    return released


atexit.register(release_all)
