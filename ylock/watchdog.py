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

A crowd of holds is renewed in batches spread over that window: a batch takes everything
due, but no more than :data:`SPREAD` renewals of the holds only nearly due; the rest wait
for their own due time (:meth:`~ylock.holds.HoldTable.due`). So 20,000 holds taken in a burst
are renewed as a stream of pipelines of 2,000, not one burst of 20,000 every period.

A renewal that finds another owner marks the hold lost at once. A renewal that cannot
reach the server is retried, the last time before the hold's lease may run out on the
server (its first lease, the waiter's, counted from when the call that granted it was
sent; later ones from when the last confirmed renewal was sent); from that moment the
hold is lost: the thread marks it then, and ``lock.lost`` says so even while the thread
still waits for an answer (:meth:`~ylock.holds.HoldTable.lost_now`), before the server
can grant the lock to anyone else.

Falling behind: a renewal sent more than a sixth of its lease after it was due means the
thread does not keep up (too many holds for the process's CPU, a starved thread, a server
that answers slowly); the holds' leases then run with less margin, and past their lease
they are lost. The thread says so: a warning in the log (at most every
:data:`WARN_EVERY` seconds, with the counts since the last one) and the figures of
:meth:`Watchdog.stats` (``late``, ``lag``), which the Prometheus exporter exports as
``ylock_watchdog_late_renewals_total`` and ``ylock_watchdog_lag_seconds``.

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
from ylock.threads import start_thread

logger = logging.getLogger(__name__)

#: With nothing to renew, the thread still wakes every IDLE_TICK s, for IDLE_TICKING s
#: after a renewal was last scheduled, then sleeps until one is.
IDLE_TICK = 0.25
IDLE_TICKING = 30.0
#: The most renewals of holds not yet due that one batch takes along (see the module docstring).
SPREAD = 2000
#: Seconds between two warnings that the thread falls behind.
WARN_EVERY = 30.0


class Watchdog:
    """The process's renewal thread (see the module docstring)."""

    def __init__(self, table: HoldTable = HOLDS) -> None:
        self.table = table
        self._thread: threading.Thread | None = None
        self._start_mutex = threading.Lock()
        #: Called with (engine, number of items, seconds) after every renew batch; tests
        #: and benchmarks count round trips with it.
        self.on_batch: Callable[[Engine, int, float], None] | None = None
        self._stats = {"renewals": 0, "batches": 0, "late": 0, "lag": 0.0, "seconds": 0.0}
        self._warned_at = -WARN_EVERY
        self._late_since_warning = 0

    def ensure_running(self) -> None:
        """Start the thread unless it runs (called when a renewal is scheduled)."""
        check_fork()
        if self._thread is None:
            with self._start_mutex:
                if self._thread is None:
                    self._thread = start_thread(self._run, "ylock-watchdog")

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
                expiry = table.next_expiry()
                if expiry is not None and (earliest is None or expiry < earliest):
                    earliest = expiry
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
                return table.due(now, SPREAD), []

    def stats(self) -> dict[str, float]:
        """What the thread did in this process: ``renewals`` sent, in ``batches``, taking
        ``seconds`` in all; ``late``, how many were sent more than a sixth of their lease
        after they were due (the thread falls behind: see the module docstring), and
        ``lag``, how late (seconds) the latest batch's most overdue renewal was sent."""
        return dict(self._stats)

    def _renew(self, engine: Engine, batch: list[tuple[Hold, Renewal]]) -> None:
        started = time.monotonic()
        lag = 0.0
        late = 0
        for _, renewal in batch:
            behind = started - renewal.due
            if behind > lag:
                lag = behind
            if behind > renewal.item.lease / 6:
                late += 1
        try:
            results: list[bool | None] = engine.renew([renewal.item for _, renewal in batch])
        except Exception:  # noqa: BLE001 - the watchdog must outlive any engine error
            logger.warning("ylock: renewing %d holds on %r failed", len(batch), engine, exc_info=True)
            results = [None] * len(batch)
        took = time.monotonic() - started
        stats = self._stats
        stats["renewals"] += len(batch)
        stats["batches"] += 1
        stats["seconds"] += took
        stats["lag"] = lag
        if late:
            stats["late"] += late
            self._falling_behind(engine, batch, late, lag, took)
        if self.on_batch is not None:
            self.on_batch(engine, len(batch), took)
        renewed, lost = self.table.renewed(batch, results, started)
        for hold, why in lost:
            self.table.lose(hold, why)
        if events.listening():
            for hold, mode in renewed:
                events.publish(events.RENEWED, hold.group, hold.name, engine.scheme, mode,
                               owner=hold.owner, token=hold.token)

    def _falling_behind(self, engine: Engine, batch: list[tuple[Hold, Renewal]], late: int, lag: float,
                        took: float) -> None:
        """Say that renewals went out late (a log line at most every WARN_EVERY seconds)."""
        self._late_since_warning += late
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY:
            return
        leases = sorted({renewal.item.lease for _, renewal in batch})
        logger.warning("ylock: the renewal thread is falling behind on %r: %d renewals went out more than a sixth "
                       "of their lease after they were due (the latest batch up to %.2f s late; leases %s s; "
                       "%d holds in it took %.2f s to renew). Holds whose lease runs out are lost: give the "
                       "process more CPU, take fewer holds per process, or longer leases.", engine,
                       self._late_since_warning, lag, "/".join(f"{lease:g}" for lease in leases[:3]), len(batch),
                       took)
        self._warned_at = now
        self._late_since_warning = 0

    def _after_fork(self) -> None:
        # The parent's thread does not exist here; the table was reset by its own hook.
        self._thread = None
        self._start_mutex = threading.Lock()
        self._stats = {"renewals": 0, "batches": 0, "late": 0, "lag": 0.0, "seconds": 0.0}


WATCHDOG = Watchdog()
after_fork(WATCHDOG._after_fork)
