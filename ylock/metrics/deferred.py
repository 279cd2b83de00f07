"""In-memory exporters off the lock path: events appended to a deque, applied in batches.

The aggregator and the Prometheus exporter do in-memory work per event (a counter, a
histogram bucket, a reservoir slot), but even that costs several microseconds per event
in Python: about a sixth of an uncontended Redis acquire+release. So on the lock path a
:class:`Deferred` subscriber only appends the event to a ``collections.deque`` (atomic
under the GIL, no lock, no thread wake-up), and applies what is pending:

- in batches, from one process-wide pump thread that wakes every :data:`PERIOD` seconds
  (never per event);
- before every read (``snapshot()``, a Prometheus scrape), so readers always see every
  event published before the read;
- inline on the lock path when :data:`LIMIT` events are pending (the pump is starved), so
  memory stays bounded without dropping anything;
- at exit (``atexit``), so a worker that a server recycles or stops leaves nothing pending
  (the Prometheus exporter's multiprocess files then hold every event the worker saw).

Fork safety: a child starts with nothing pending and no pump thread; the pump starts
again on the child's first event.
"""
from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable

from ylock.events import Event
from ylock.owner import after_fork as _after_fork
from ylock.threads import start_thread

logger = logging.getLogger(__name__)

#: Seconds between two passes of the pump thread.
PERIOD = 0.05
#: Events per :meth:`Deferred.apply` call.
BATCH = 1000
#: Pending events per subscriber above which the lock path applies them itself.
LIMIT = 50_000


class Deferred:
    """Base class: subscribe an instance; subclasses implement :meth:`apply` (one event)."""

    def __init__(self) -> None:
        self._pending: collections.deque[Event] = collections.deque()
        self._drain_mutex = threading.Lock()
        _live.add(self)

    def apply(self, events: list[Event]) -> None:
        """Record a batch of events, oldest first (runs off the lock path, one batch at a time)."""
        raise NotImplementedError

    # -- the lock path -----------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        pending = self._pending
        pending.append(event)
        if _pump is None:
            _start_pump()
        if len(pending) > LIMIT:
            self.drain()

    # -- off it --------------------------------------------------------------------------

    def tick(self) -> None:
        """Run on every pass of the pump: apply what is pending (subclasses may add periodic work)."""
        if self._pending:
            self.drain()

    def drain(self) -> None:
        """Apply every pending event now."""
        with self._drain_mutex:
            pending = self._pending
            pop = pending.popleft
            while pending:
                batch = [pop() for _ in range(min(len(pending), BATCH))]
                try:
                    self.apply(batch)
                except Exception:  # noqa: BLE001 - observation never breaks anything
                    logger.exception("ylock metrics: %r failed on %d events", self, len(batch))

    def _after_fork(self) -> None:
        self._pending = collections.deque()
        self._drain_mutex = threading.Lock()


_live: weakref.WeakSet[Deferred] = weakref.WeakSet()
_pump: threading.Thread | None = None
_pump_mutex = threading.Lock()


def _start_pump() -> None:
    global _pump
    with _pump_mutex:
        if _pump is None:
            _pump = start_thread(_run_pump, "ylock-metrics-pump")


def _run_pump(sleep: Callable[[float], None] = time.sleep) -> None:
    while True:
        sleep(PERIOD)
        for subscriber in list(_live):
            try:
                subscriber.tick()
            except Exception:  # noqa: BLE001 - the pump must outlive any subscriber's bug
                logger.exception("ylock metrics: %r failed", subscriber)


def drain_all() -> None:
    """Apply every pending event of every deferred subscriber now."""
    for subscriber in list(_live):
        subscriber.drain()


def _after_fork_in_child() -> None:
    global _pump, _pump_mutex
    _pump = None
    _pump_mutex = threading.Lock()
    for subscriber in list(_live):
        subscriber._after_fork()


_after_fork(_after_fork_in_child)   # os.fork() and forks made from C (uWSGI)
atexit.register(drain_all)
