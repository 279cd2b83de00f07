"""Ship events off the lock path: a bounded buffer drained by one background thread.

The subscriber side (:meth:`Shipper.__call__`, run synchronously inside lock calls) does
a non-blocking put into a bounded queue and nothing else: no I/O, no serialisation, no
waiting. When the queue is full (the sink is down or slower than the traffic) the event
is dropped and counted; the lock call never notices. One daemon thread per shipper,
started on the first event, drains the queue in batches (``batch_size`` events or
``flush_interval`` seconds, whichever comes first) and hands each batch to
:meth:`Shipper.ship`; a batch that fails is logged (rate-limited) and counted, then
dropped. Memory is bounded by ``buffer_size`` queued events plus one batch in flight.

Fork safety: a child process inherits neither the thread nor the parent's queued events;
each shipper starts over empty in the child and starts its thread on its first event
(``os.register_at_fork``), so pre-fork servers (gunicorn, uWSGI) work.
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from typing import Any

from ylock.events import Event

logger = logging.getLogger("ylock.metrics")

_FLUSH = object()   # ends the batch being collected, so a flush need not wait the interval
_STOP = object()

#: Seconds between two log lines about drops or failures of one shipper.
LOG_EVERY = 10.0


class Shipper:
    """Base class: subscribe an instance to :mod:`ylock.events`; subclasses implement :meth:`ship`."""

    #: Short name for stats and logs.
    kind = "shipper"

    def __init__(self, *, buffer_size: int = 10_000, batch_size: int = 500, flush_interval: float = 1.0) -> None:
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(flush_interval, (int, float)) or not flush_interval > 0:
            raise ValueError(f"flush_interval must be a positive number of seconds, got {flush_interval!r}")
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        self.flush_interval = float(flush_interval)
        self._start_mutex = threading.Lock()
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(self.buffer_size + 2)  # +2: room for sentinels
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
        if self._queue.qsize() >= self.buffer_size:
            self._drop()
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._drop()

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
            thread = threading.Thread(target=self._run, name=f"ylock-{self.kind}-exporter", daemon=True)
            thread.start()
            self._thread = thread

    # -- the background thread -----------------------------------------------------------

    def ship(self, batch: list[Event]) -> None:
        """Send ``batch`` to the sink; raise on failure (the batch is then counted and dropped)."""
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            batch, stop, taken = self._collect()
            try:
                if batch:
                    self._ship_counted(batch)
            finally:
                for _ in range(taken):
                    self._queue.task_done()
            if stop:
                return

    def _collect(self) -> tuple[list[Event], bool, int]:
        """Wait for a batch: up to ``batch_size`` events within ``flush_interval`` of the first."""
        item = self._queue.get()
        if item is _STOP or item is _FLUSH:
            return [], item is _STOP, 1
        batch = [item]
        deadline = time.monotonic() + self.flush_interval
        while len(batch) < self.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if item is _STOP or item is _FLUSH:
                return batch, item is _STOP, len(batch) + 1
            batch.append(item)
        return batch, False, len(batch)

    def _ship_counted(self, batch: list[Event]) -> None:
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
        else:
            with self._count_mutex:
                self.shipped += len(batch)

    # -- control ---------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Ship what is queued now; return True if the buffer drained within ``timeout`` seconds."""
        if self._thread is None:
            return self._queue.unfinished_tasks == 0
        try:
            self._queue.put_nowait(_FLUSH)
        except queue.Full:
            pass  # a full buffer makes full batches: no need to cut one short
        deadline = time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                done.wait(remaining)
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Flush for at most ``timeout`` seconds, then stop the thread (events after this are dropped)."""
        self.flush(timeout)
        with self._start_mutex:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            try:
                self._queue.put_nowait(_STOP)
            except queue.Full:
                return  # daemon thread: it dies with the process
            thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        """Return queued, shipped, dropped and failed event counts and the last error."""
        with self._count_mutex:
            return {"queued": max(0, self._queue.qsize()), "capacity": self.buffer_size,
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


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
