"""One watchdog thread per process renews every hold, in batches.

The schedule lives in the :class:`~ylock.holds.HoldTable` (each mode of a hold that its
engine must keep alive carries a due time). The thread sleeps until the earliest due
time, then takes every renewal of the same engine that is due within the next sixth of
its lease, and hands them to ``engine.renew()`` in one call (which pipelines them).
Renewed entries become due again together, so holds taken at different moments coalesce
into a few batches per renewal period (the effect of the timing wheel with which the Java
ylock, the design this package follows, renews its holds, without the wheel).

A hold is renewed every ``lease / 3``. Its first renewal comes sooner (after a third of
the waiter lease): a new hold starts with the waiter's short lease on the server, so that
an acquisition whose answer never reached its owner (a timeout, a cancelled task, a
dead process) blocks nobody for long; the first renewal extends it to the full lease.

A renewal that finds another owner marks the hold lost at once. A renewal that cannot
reach the server is retried, the last time before the hold's lease may run out on the
server (its first lease, the waiter's, counted from when the call that granted it was
sent; later ones from when the last confirmed renewal was sent); from that moment the
hold is lost: the thread marks it then, and ``lock.lost`` says so even while the thread
still waits for an answer (:meth:`~ylock.holds.HoldTable.lost_now`), before the server
can grant the lock to anyone else.

After a fork the child has no watchdog thread (and no holds): it starts its own when it
first needs one (also after a fork made from C: :func:`ylock.owner.after_fork`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ylock import events
from ylock.holds import HOLDS, Engine, Hold, HoldTable, Renewal
from ylock.owner import after_fork, check_fork

logger = logging.getLogger(__name__)

#: With nothing to renew, the thread still wakes every IDLE_TICK s, for IDLE_TICKING s
#: after a renewal was last scheduled, then sleeps until one is.
IDLE_TICK = 0.25
IDLE_TICKING = 30.0


class Watchdog:
    """The process's renewal thread (see the module docstring)."""

    def __init__(self, table: HoldTable = HOLDS) -> None:
        self.table = table
        self._thread: threading.Thread | None = None
        self._start_mutex = threading.Lock()
        #: Called with (engine, number of items, seconds) after every renew batch; tests
        #: and benchmarks count round trips with it.
        self.on_batch: Callable[[Engine, int, float], None] | None = None

    def ensure_running(self) -> None:
        """Start the thread unless it runs (called when a renewal is scheduled)."""
        check_fork()
        if self._thread is None:
            with self._start_mutex:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="ylock-watchdog", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            batches, overdue = self._next_batches()
            for hold in overdue:
                self.table.lose(hold, "its lease may have run out: no renewal was confirmed in time")
            for engine, batch in batches.items():
                self._renew(engine, batch)

    def _next_batches(self) -> tuple[dict[Engine, list[tuple[Hold, Renewal]]], list[Hold]]:
        """Wait until a renewal is due; return the batches due and the holds whose lease may
        have run out meanwhile (to be marked lost)."""
        table = self.table
        with table.changed:
            while True:
                now = time.monotonic()
                overdue = table.overdue(now)
                if overdue:
                    return {}, overdue
                earliest = table.earliest_due()
                if earliest is None:
                    # Nothing to renew: tick slowly for a while rather than sleep for good.
                    # A hold's first renewal is due a third of a second or more after it
                    # was taken, so scheduling one need not wake a ticking thread (a wake-up
                    # costs the lock path a context switch and the GIL: ~40 us per acquisition).
                    if now - table.scheduled_at < IDLE_TICKING:
                        table.wake_at = now + IDLE_TICK
                        table.changed.wait(IDLE_TICK)
                    else:
                        table.wake_at = float("inf")
                        table.changed.wait()
                    continue
                if earliest > now:
                    table.wake_at = earliest
                    table.changed.wait(earliest - now)
                    continue
                table.wake_at = now
                return table.due(now), []

    def _renew(self, engine: Engine, batch: list[tuple[Hold, Renewal]]) -> None:
        started = time.monotonic()
        try:
            results: list[bool | None] = engine.renew([renewal.item for _, renewal in batch])
        except Exception:  # noqa: BLE001 - the watchdog must outlive any engine error
            logger.warning("ylock: renewing %d holds on %r failed", len(batch), engine, exc_info=True)
            results = [None] * len(batch)
        if self.on_batch is not None:
            self.on_batch(engine, len(batch), time.monotonic() - started)
        renewed, lost = self.table.renewed(batch, results, started)
        for hold, why in lost:
            self.table.lose(hold, why)
        if events.listening():
            for hold, mode in renewed:
                events.publish(events.RENEWED, hold.group, hold.name, engine.scheme, mode,
                               owner=hold.owner, token=hold.token)

    def _after_fork(self) -> None:
        # The parent's thread does not exist here; the table was reset by its own hook.
        self._thread = None
        self._start_mutex = threading.Lock()


WATCHDOG = Watchdog()
after_fork(WATCHDOG._after_fork)
