"""The deployment's statistics: every process shares its last minutes of lock activity
through the engines it locks on, so that ``ylock stats`` in any process shows them all.

Publishing (in each process whose metrics were configured with a dict: ``YLOCK['METRICS']``,
``YLOCK_METRICS`` or ``ylock.metrics.configure({...})``, unless ``STATS`` is False or
``STATS_PERIOD`` is None)::

    lock calls -> events -> Aggregator (deferred, off the lock path)
                        -> Publisher.__call__ (on the lock path: notes which engine an
                           acquisition used, a dict lookup)
    thread "ylock-stats-publisher", every STATS_PERIOD (5 s):
        Aggregator.window()  (the last 5 minutes, ylock.metrics.aggregator)
        -> JSON -> engine.publish_stats(process id, data, STATS_TTL (60 s))  for each engine used

- The thread starts with the first batch of events (so a forked worker starts its own,
  and a process that never locks publishes nothing), publishes at once, then every
  period; a window with no events is not published (the last copy expires after the TTL).
- It runs off the lock path; an engine that fails or hangs delays only this thread (each
  engine's calls are bounded by its own timeouts) and is logged at most once a minute.
- Fork-safe: the child forgets the parent's thread, engines and process id.

Reading (:func:`read`, what the ``stats`` verb of every command line calls): each engine's
``read_stats()``, one copy per process (the newest, when several engines hold one), and
:func:`merge`: per group, the counts summed, the spans' histograms merged exactly (count,
sum and maximum are exact; percentiles are the upper bound of a logarithmic bucket, at most
9.1 % above the exact value, whatever the number of processes).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ylock import events
from ylock.engines.base import Engine
from ylock.errors import EngineUnavailable
from ylock.holds import HOLDS
from ylock.metrics.aggregator import SPANS, WINDOW, Aggregator, Histogram
from ylock.metrics.background import live_shippers
from ylock.owner import after_fork as _after_fork
from ylock.owner import new_owner
from ylock.threads import start_thread

logger = logging.getLogger(__name__)

#: Seconds between two publications, and how long a publication lives on the server.
PERIOD = 5.0
TTL = 60.0
#: Version of the published JSON.
FORMAT = 1
#: Seconds between two log lines about failing publications.
LOG_EVERY = 60.0
#: Seconds between two searches of the hold table for an engine not seen before.
SCAN_EVERY = 1.0

#: What :func:`merge` says about its percentiles.
PERCENTILES_NOTE = ("approximate: the upper bound of a logarithmic bucket, at most 9.1% above the exact value; "
                    "count, sum, mean and max are exact")

_process: tuple[int, str] | None = None


def process_id() -> str:
    """Return this process's id (``host:pid:random``, the prefix of its lock owner ids)."""
    global _process
    pid = os.getpid()
    if _process is None or _process[0] != pid:
        _process = (pid, new_owner().rpartition(":")[0])
    return _process[1]


class Publisher:
    """Publish an :class:`Aggregator`'s window to every engine this process locked on (see
    the module docstring). One per process: ``ylock.metrics.PUBLISHER``."""

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self.period = PERIOD
        self.ttl = TTL
        self.enabled = False
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._last: weakref.ref[Engine] | None = None
        self._scanned = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._logged = 0.0
        self.published = 0        # publications that an engine took
        self.failed = 0           # publications that an engine refused or did not answer
        self.last_error: str | None = None

    # -- switching on and off (ylock.metrics.configure / shutdown) --------------------------

    def start(self, period: float = PERIOD, ttl: float = TTL) -> None:
        """Publish every ``period`` seconds, each publication living ``ttl`` seconds; the
        thread starts with the next batch of lock events."""
        self.period, self.ttl = period, ttl
        self.enabled = True
        events.subscribe(self)
        self.aggregator.after_apply = self.ensure_running

    def stop(self, timeout: float = 2.0) -> None:
        """Stop publishing (what was published expires after its ttl)."""
        self.enabled = False
        events.unsubscribe(self)
        if self.aggregator.after_apply == self.ensure_running:
            self.aggregator.after_apply = None
        with self._mutex:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._stop = threading.Event()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def ensure_running(self) -> None:
        """Start the publishing thread unless it runs (called off the lock path)."""
        if self._thread is None and self.enabled:
            with self._mutex:
                if self._thread is None and self.enabled:
                    self._thread = start_thread(self._run, "ylock-stats-publisher", (self._stop,))

    def _run(self, stop: threading.Event) -> None:
        while True:
            try:
                self.publish()
            except Exception:  # noqa: BLE001 - statistics never break anything
                logger.exception("ylock: publishing lock statistics failed")
            if stop.wait(self.period):
                return

    # -- which engines (on the lock path) ----------------------------------------------------

    def __call__(self, event: events.Event) -> None:
        # An acquisition's hold is in the hold table while its event is published (the owner
        # is this thread): find its engine there. One dict lookup for the engine seen last.
        if event.kind != events.ACQUIRED:
            return
        last = self._last
        engine = None if last is None else last()
        if engine is not None and (engine, event.group, event.name, event.owner) in HOLDS.by_key:
            return
        self._discover(event)

    def _discover(self, event: events.Event) -> None:
        tail = (event.group, event.name, event.owner)
        by_key = HOLDS.by_key
        for engine in list(self._engines):
            if (engine, *tail) in by_key or (engine, *tail, "semaphore") in by_key:
                self._last = weakref.ref(engine)
                return
        now = time.monotonic()
        if now - self._scanned < SCAN_EVERY:   # bounded work on the lock path: a new engine is
            return                             # found by a later acquisition instead
        self._scanned = now
        try:
            keys = list(by_key)
        except RuntimeError:                   # another thread changed the table meanwhile
            return
        for key in keys:
            if tuple(key[1:4]) == tail and isinstance(key[0], Engine):
                self._engines.add(key[0])
                self._last = weakref.ref(key[0])
                return

    def engines(self) -> list[Engine]:
        """Return the engines this process locked on (still alive)."""
        return list(self._engines)

    # -- publishing (the thread) -----------------------------------------------------------------

    def publish(self) -> int:
        """Publish the window to every engine used, now; return to how many it went."""
        window = self.aggregator.window()
        if not window["groups"]:
            return 0
        data = encode(window, self.period, self.ttl)
        done = 0
        for engine in self.engines():
            try:
                engine.publish_stats(process_id(), data, self.ttl)
            except Exception as exc:  # noqa: BLE001 - a failing engine never breaks anything
                self.failed += 1
                self.last_error = f"{engine.url_for_display()}: {type(exc).__name__}: {exc}"
                now = time.monotonic()
                if now - self._logged >= LOG_EVERY:
                    self._logged = now
                    logger.warning("ylock: could not publish lock statistics to %s: %s (logged once a minute)",
                                   engine.url_for_display(), exc)
            else:
                self.published += 1
                done += 1
        return done

    def _after_fork(self) -> None:
        # The child has no thread and has used no engine yet; its process id is new.
        self._reset()


def encode(window: Mapping[str, Any], period: float, ttl: float) -> bytes:
    """Return the JSON that a process publishes: its window, who it is, when, its exporters."""
    exporters = {s.kind: s.stats() for s in live_shippers() if not s._closed}
    return json.dumps({"format": FORMAT, "process": process_id(), "pid": os.getpid(), "at": time.time(),
                       "period": period, "ttl": ttl, **window, "exporters": exporters},
                      separators=(",", ":"), default=str).encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """Return a published window, or None if ``data`` is not one this version reads."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or value.get("format") != FORMAT or not isinstance(value.get("groups"), dict) \
            or not isinstance(value.get("process"), str):
        return None
    return value


def read(targets: Sequence[tuple[str, Engine]]) -> dict[str, dict[str, Any]]:
    """Return every process's published window found on ``targets`` ((alias, engine) pairs),
    by process id: the newest copy, with ``"found_on"``: the aliases it was found on. Raise
    :class:`ylock.EngineUnavailable` if an engine cannot be reached; skip engines that keep
    no statistics and entries that do not decode."""
    found: dict[str, dict[str, Any]] = {}
    for alias, engine in targets:
        try:
            published = engine.read_stats()
        except NotImplementedError:
            continue
        except EngineUnavailable:
            raise
        for key, data in sorted(published.items()):
            window = decode(data)
            if window is None:
                logger.debug("ylock: skipping unreadable statistics %r on %s", key, alias)
                continue
            process = window["process"]
            seen = found.get(process)
            if seen is None or _at(window) > _at(seen):
                window["found_on"] = sorted({alias, *(seen["found_on"] if seen else ())})
                found[process] = window
            else:
                seen["found_on"] = sorted({alias, *seen["found_on"]})
    return found


def _at(window: Mapping[str, Any]) -> float:
    at = window.get("at")
    return float(at) if isinstance(at, (int, float)) else 0.0


def merge(windows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Merge published windows into ``{group: {"counts", "processes", "wait"|"hold"|"release":
    summary}}`` (see the module docstring for what is exact)."""
    counts: dict[str, dict[str, int]] = {}
    spans: dict[str, dict[str, Histogram]] = {}
    processes: dict[str, int] = {}
    for window in windows:
        for group, published in window["groups"].items():
            part = _group(published)
            if part is None:
                continue
            group_counts = counts.setdefault(group, {})
            for kind, n in part[0].items():
                group_counts[kind] = group_counts.get(kind, 0) + n
            group_spans = spans.setdefault(group, {})
            for span, histogram in part[1].items():
                group_spans.setdefault(span, Histogram()).merge(histogram)
            processes[group] = processes.get(group, 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for group in sorted(counts):
        entry: dict[str, Any] = {"processes": processes[group], "counts": dict(sorted(counts[group].items()))}
        for span in SPANS:
            if span in spans[group]:
                entry[span] = spans[group][span].summary()
        out[group] = entry
    return out


def _group(entry: Any) -> tuple[dict[str, int], dict[str, Histogram]] | None:
    """Return one group's (counts, histograms) from a published window, or None if malformed."""
    try:
        raw = entry["counts"]
        counts = {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}
        return counts, {span: Histogram.from_dict(entry[span]) for span in SPANS if span in entry}
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


__all__ = ["Publisher", "PERIOD", "TTL", "WINDOW", "process_id", "encode", "decode", "read", "merge",
           "PERCENTILES_NOTE"]

_live: weakref.WeakSet[Publisher] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for publisher in list(_live):
        publisher._after_fork()


_after_fork(_after_fork_in_child)   # os.fork() and forks made from C (uWSGI)
