"""One watchdog thread per process renews every hold, in batches.

Each hold that an engine must keep alive (``engine.needs_renewal``) gets an entry with a
due time. The thread sleeps until the earliest due time, then takes every entry of the
same engine that is due within the next sixth of its lease, and hands them to
``engine.renew()`` in one call (which pipelines them). Renewed entries become due again
together, so holds taken at different moments coalesce into a few batches per renewal
period (the effect of the seed's timing wheel, without the wheel).

An entry is renewed every ``lease / 3``. The first renewal of a hold comes sooner (after
a third of the waiter lease): a hold granted to a waiter by a releasing process starts
with the waiter's short lease, so that a waiter that died unnoticed blocks nobody for long.

A renewal that finds another owner marks the hold lost at once. A renewal that cannot
reach the server is retried; once a whole lease has gone by since the last confirmed
renewal the server may have expired the hold, so it is marked lost too.

After ``fork()`` the child has no watchdog thread and no entries: it inherits no holds.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ylock import events
from ylock.engines.base import RenewItem

if TYPE_CHECKING:
    from ylock.engines.base import Engine
    from ylock.lock import Hold

logger = logging.getLogger("ylock.watchdog")

#: With no hold to renew, the thread still wakes every IDLE_TICK s, for IDLE_TICKING s
#: after a hold to renew was last added, then sleeps until one is.
IDLE_TICK = 0.25
IDLE_TICKING = 30.0


class _Entry:
    __slots__ = ("hold", "item", "due", "confirmed")

    def __init__(self, hold: Hold, item: RenewItem, due: float, confirmed: float) -> None:
        self.hold = hold
        self.item = item
        self.due = due
        self.confirmed = confirmed  # monotonic time the server last confirmed the lease


class Watchdog:
    """The process's renewal thread and registry of live holds (see module docstring)."""

    def __init__(self) -> None:
        self._reset()
        #: Called with (engine, number of items, seconds) after every renew batch; tests
        #: and benchmarks count round trips with it.
        self.on_batch: Callable[[Engine, int, float], None] | None = None

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._entries: dict[tuple[object, ...], _Entry] = {}
        self._holds: dict[int, Hold] = {}   # every live hold, renewed or not
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake_at = float("inf")  # when the thread means to wake up next
        self._added_at = 0.0          # when a hold was last added

    # -- registry --------------------------------------------------------------------

    def add(self, hold: Hold, mode: str, first_renewal: float) -> None:
        """Track ``hold`` in ``mode``; renew it if its engine needs renewal."""
        now = time.monotonic()
        with self._cond:
            self._holds[id(hold)] = hold
            if not hold.engine.needs_renewal:
                return
            self._added_at = now
            item = RenewItem(hold.group, hold.name, hold.owner, mode, hold.lease)
            due = now + min(first_renewal, hold.lease / 3)
            self._entries[(id(hold), mode)] = _Entry(hold, item, due, now)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ylock-watchdog", daemon=True)
                self._thread.start()
            # Waking the thread costs a context switch (and the GIL) on the lock path: do
            # it only if it would otherwise sleep past this hold's first renewal.
            if due < self._wake_at:
                self._wake_at = due
                self._cond.notify()

    def remove(self, hold: Hold, mode: str) -> None:
        """Stop renewing ``hold`` in ``mode``; forget it once it holds no mode."""
        with self._cond:
            self._entries.pop((id(hold), mode), None)
            if not hold.writes and not hold.reads:
                self._holds.pop(id(hold), None)

    def holds(self) -> list[Hold]:
        """Return this process's live holds."""
        with self._cond:
            return list(self._holds.values())

    def mark_lost(self, engine: Engine, group: str | None = None, name: str | None = None,
                  owner: str | None = None, detail: str = "") -> int:
        """Mark every matching hold of ``engine`` lost (e.g. a ZooKeeper session expired);
        return how many."""
        with self._cond:
            victims = [h for h in self._holds.values() if h.engine is engine
                       and (group is None or h.group == group) and (name is None or h.name == name)
                       and (owner is None or h.owner == owner) and not h.lost]
            for hold in victims:
                for mode in ("write", "read"):
                    self._entries.pop((id(hold), mode), None)
        for hold in victims:
            hold.mark_lost(detail)
        return len(victims)

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batches = self._next_batches()
            if batches is None:
                return
            for engine, entries in batches.items():
                self._renew(engine, entries)

    def _next_batches(self) -> dict[Engine, list[_Entry]] | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                now = time.monotonic()
                if not self._entries:
                    # Nothing to renew: tick slowly for a while rather than sleep for good.
                    # A hold's first renewal is due a third of a second or more after it
                    # was taken, so add() need not wake a ticking thread (a wake-up costs
                    # the lock path a context switch and the GIL: ~40 us per acquisition).
                    if now - self._added_at < IDLE_TICKING:
                        self._wake_at = now + IDLE_TICK
                        self._cond.wait(IDLE_TICK)
                    else:
                        self._wake_at = float("inf")
                        self._cond.wait()
                    continue
                earliest = min(e.due for e in self._entries.values())
                if earliest > now:
                    self._wake_at = earliest
                    self._cond.wait(earliest - now)
                    continue
                self._wake_at = now
                batches: dict[Engine, list[_Entry]] = {}
                for entry in self._entries.values():
                    if entry.due <= now + entry.item.lease / 6:
                        batches.setdefault(entry.hold.engine, []).append(entry)
                return batches

    def _renew(self, engine: Engine, entries: list[_Entry]) -> None:
        started = time.monotonic()
        try:
            results: list[bool | None] = engine.renew([e.item for e in entries])
        except Exception:  # noqa: BLE001 - the watchdog must outlive any engine error
            logger.warning("ylock: renewing %d holds on %r failed", len(entries), engine, exc_info=True)
            results = [None] * len(entries)
        now = time.monotonic()
        if self.on_batch is not None:
            self.on_batch(engine, len(entries), now - started)
        lost: list[tuple[_Entry, str]] = []
        renewed: list[_Entry] = []
        with self._cond:
            for entry, result in zip(entries, results):
                key = (id(entry.hold), entry.item.mode)
                if self._entries.get(key) is not entry:
                    continue  # released while we were renewing
                if result:
                    entry.confirmed = started
                    entry.due = started + entry.item.lease / 3
                    renewed.append(entry)
                elif result is False:
                    del self._entries[key]
                    lost.append((entry, "renewal found another owner or no lock"))
                elif now - entry.confirmed >= entry.item.lease:
                    del self._entries[key]
                    lost.append((entry, "server unreachable for a whole lease"))
                else:
                    entry.due = now + min(1.0, entry.item.lease / 10)
        for entry, why in lost:
            entry.hold.mark_lost(why)
        if events.listening():
            for entry in renewed:
                h = entry.hold
                events.publish(events.RENEWED, h.group, h.name, engine.scheme, entry.item.mode,
                               owner=h.owner, token=h.token)

    def _after_fork(self) -> None:
        # The parent's thread does not exist here, and its lock may have been held at
        # the moment of fork(): start over with fresh state.
        self._reset()


WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=WATCHDOG._after_fork)
