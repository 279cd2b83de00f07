"""Ship events off the lock path: a bounded buffer drained by one background thread.

The subscriber side (:meth:`Shipper.__call__`, run synchronously inside lock calls)
appends to a bounded ``collections.deque`` and nothing else: no lock, no thread wake-up
(but one per ``batch_size`` events), no I/O, no serialisation. When the buffer is full (the sink is down or slower than
the traffic) the event is dropped and counted; the lock call never notices. One daemon thread per shipper,
started on the first event, drains the buffer in batches (when ``batch_size`` events are
waiting, and every ``flush_interval`` seconds) and hands each batch to
:meth:`Shipper.ship`; a batch that fails is logged (rate-limited) and counted, then
dropped, and the next attempt waits (``flush_interval``, doubling up to :data:`MAX_BACKOFF`
while failures go on). Memory is bounded by ``buffer_size`` queued events plus one batch in flight.

Fork safety: a child process inherits neither the thread nor the parent's queued events;
each shipper starts over empty in the child and starts its thread on its first event
(``ylock.owner.after_fork``: ``os.fork()`` and forks made from C), so pre-fork servers (gunicorn, uWSGI) work.
"""
from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from typing import Any

from ylock import options as opt
from ylock.events import Event
from ylock.owner import after_fork as _after_fork
from ylock.threads import start_thread

logger = logging.getLogger(__name__)

#: Seconds between two log lines about drops or failures of one shipper.
LOG_EVERY = 10.0
#: The longest wait between two attempts while the sink keeps failing.
MAX_BACKOFF = 10.0


class Shipper:
    """Base class: subscribe an instance to :mod:`ylock.events`; subclasses implement :meth:`ship`."""

    #: Short name for stats and logs.
    kind = "shipper"

    def __init__(self, *, buffer_size: int = 10_000, batch_size: int = 500, flush_interval: float = 1.0) -> None:
        self.buffer_size = opt.number(buffer_size, "buffer_size", minimum=1, integer=True, code=opt.E_METRICS)
        self.batch_size = opt.number(batch_size, "batch_size", minimum=1, integer=True, code=opt.E_METRICS)
        self.flush_interval = opt.seconds(flush_interval, "flush_interval", maximum=3600, code=opt.E_METRICS)
        self._start_mutex = threading.Lock()
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        self._pending: collections.deque[Event] = collections.deque()
        self._wake = threading.Event()      # set: ship now (a full batch, a flush, a close)
        self._idle = threading.Condition()  # notified when the thread has shipped all it had
        self._in_flight = 0
        self._urgent = False                # a flush or close asked: skip the backoff
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self._count_mutex = threading.Lock()
        self.shipped = 0          # events handed to the sink successfully
        self.dropped = 0          # events dropped because the buffer was full
        self.failed = 0           # events in batches the sink refused or could not take
        self.failed_batches = 0
        self.last_error: str | None = None
        self._last_log = 0.0

    # -- the lock path -------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        if self._thread is None:
            if self._closed:
                return
            self._start()
        pending = self._pending
        size = len(pending)
        if size >= self.buffer_size:
            self._drop()
            return
        pending.append(event)   # atomic under the GIL: no lock, no wake-up per event
        if size + 1 == self.batch_size:
            self._wake.set()

    def _drop(self) -> None:
        with self._count_mutex:
            self.dropped += 1
            dropped = self.dropped
            now = time.monotonic()
            log = now - self._last_log >= LOG_EVERY
            if log:
                self._last_log = now
        if log:
            logger.warning("ylock %s exporter buffer full (%d events): %d events dropped so far; "
                           "last error: %s", self.kind, self.buffer_size, dropped, self.last_error)

    def _start(self) -> None:
        with self._start_mutex:
            if self._thread is not None or self._closed:
                return
            self._thread = start_thread(self._run, f"ylock-{self.kind}-exporter")

    # -- the background thread -----------------------------------------------------------

    def ship(self, batch: list[Event]) -> None:
        """Send ``batch`` to the sink; raise on failure (the batch is then counted and dropped)."""
        raise NotImplementedError

    def _run(self) -> None:
        pending, pop = self._pending, self._pending.popleft
        backoff = 0.0
        while True:
            if backoff:     # the sink failed: wait before trying it again (a flush or close cuts it short)
                deadline = time.monotonic() + backoff
                while not (self._urgent or self._stopping) and (left := deadline - time.monotonic()) > 0:
                    self._wake.wait(left)
                    self._wake.clear()
            else:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
            self._urgent = False
            while pending:
                # in flight before it leaves the buffer: a flush never sees it in neither place
                self._in_flight = count = min(len(pending), self.batch_size)
                batch = [pop() for _ in range(count)]
                try:
                    shipped = self._ship_counted(batch)
                finally:
                    self._in_flight = 0
                if not shipped:
                    # Serialising and sending to a dead sink costs the process CPU (and the
                    # GIL) for nothing: back off, and let the buffer fill and drop meanwhile.
                    backoff = min(max(self.flush_interval, 2 * backoff), MAX_BACKOFF)
                    break
                backoff = 0.0
            with self._idle:
                self._idle.notify_all()
            if self._stopping:
                return

    def _ship_counted(self, batch: list[Event]) -> bool:
        try:
            self.ship(batch)
        except Exception as exc:  # noqa: BLE001 - a sink failure must not kill the thread
            with self._count_mutex:
                self.failed += len(batch)
                self.failed_batches += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                now = time.monotonic()
                log = now - self._last_log >= LOG_EVERY
                if log:
                    self._last_log = now
            if log:
                logger.warning("ylock %s exporter could not ship %d events (%d failed so far): %s",
                               self.kind, len(batch), self.failed, self.last_error)
            return False
        with self._count_mutex:
            self.shipped += len(batch)
        return True

    # -- control ---------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Ship what is queued now; return True if the buffer drained within ``timeout`` seconds."""
        if self._thread is None:
            return not self._pending
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._urgent = True
                self._wake.set()
                self._idle.wait(min(remaining, 0.1))
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Flush for at most ``timeout`` seconds, then stop the thread (events after this are dropped)."""
        self.flush(timeout)
        with self._start_mutex:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        """Return queued (buffered), in-flight, shipped, dropped and failed event counts and the last error."""
        with self._count_mutex:
            return {"queued": len(self._pending), "in_flight": self._in_flight, "capacity": self.buffer_size,
                    "shipped": self.shipped, "dropped": self.dropped, "failed": self.failed,
                    "failed_batches": self.failed_batches, "last_error": self.last_error}

    def _after_fork(self) -> None:
        closed = self._closed
        self._start_mutex = threading.Lock()
        self._reset()
        self._closed = closed


_live: weakref.WeakSet[Shipper] = weakref.WeakSet()


def live_shippers() -> list[Shipper]:
    """Return every shipper of this process that was not garbage-collected."""
    return list(_live)


def _after_fork_in_child() -> None:
    for shipper in list(_live):
        shipper._after_fork()


def _close_all_at_exit() -> None:
    for shipper in list(_live):
        try:
            shipper.close(timeout=2.0)
        except Exception:  # noqa: BLE001 - exiting anyway
            logger.exception("closing ylock %s exporter at exit failed", shipper.kind)


_after_fork(_after_fork_in_child)   # os.fork() and forks made from C (uWSGI)
atexit.register(_close_all_at_exit)
