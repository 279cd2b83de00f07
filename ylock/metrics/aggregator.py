"""An in-memory, per-process summary of lock events, for ``ylock stats`` commands.

Counts every event kind per group and keeps, per group and span (``wait``, ``hold``,
``release``), the exact count, sum and maximum plus a bounded uniform sample (Vitter's
reservoir, algorithm R) from which percentiles are read. Memory is bounded by the number
of groups times the reservoir size, whatever the traffic.
"""
from __future__ import annotations

import math
import random
import threading
from collections import Counter
from typing import Any

from ylock.events import Event
from ylock.metrics.deferred import Deferred

SPANS = ("wait", "hold", "release")
PERCENTILES = (50, 90, 99)


class Reservoir:
    """A bounded uniform sample of a stream of durations, with exact count, sum and max."""

    __slots__ = ("size", "count", "total", "maximum", "sample", "_random")

    def __init__(self, size: int = 1024, rng: random.Random | None = None) -> None:
        self.size = size
        self.count = 0
        self.total = 0.0
        self.maximum = 0.0
        self.sample: list[float] = []
        self._random = rng or random.Random()

    def add(self, value: float) -> None:
        """Record one duration."""
        self.count += 1
        self.total += value
        if value > self.maximum:
            self.maximum = value
        if len(self.sample) < self.size:
            self.sample.append(value)
        else:
            slot = int(self._random.random() * self.count)   # randrange(count), 4x cheaper
            if slot < self.size:
                self.sample[slot] = value

    def percentile(self, p: float) -> float | None:
        """Return the ``p``-th percentile (nearest rank) of the sample, or None if empty."""
        return _nearest_rank(sorted(self.sample), p)

    def summary(self) -> dict[str, float | int | None]:
        """Return count, mean, max and the :data:`PERCENTILES`, in seconds."""
        ordered = sorted(self.sample)
        out: dict[str, float | int | None] = {
            "count": self.count,
            "mean": self.total / self.count if self.count else None,
            "max": self.maximum if self.count else None,
        }
        for p in PERCENTILES:
            out[f"p{p}"] = _nearest_rank(ordered, p)
        return out


def _nearest_rank(ordered: list[float], p: float) -> float | None:
    if not ordered:
        return None
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[max(0, min(len(ordered), rank) - 1)]


class Aggregator(Deferred):
    """Subscribe an instance to :mod:`ylock.events` to summarise this process's locking.

    On the lock path it only queues the event (:class:`~ylock.metrics.deferred.Deferred`);
    events are applied off it, and always before a :meth:`snapshot`.
    """

    def __init__(self, reservoir_size: int = 1024) -> None:
        super().__init__()
        self.reservoir_size = reservoir_size
        self._mutex = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}
        self._spans: dict[tuple[str, str], Reservoir] = {}

    def apply(self, events: list[Event]) -> None:
        with self._mutex:
            all_counts = self._counts
            for event in events:
                group = event.group
                counts = all_counts.get(group)
                if counts is None:
                    counts = all_counts[group] = Counter()
                counts[event.kind] += 1
                if event.wait is not None:
                    self._reservoir(group, "wait").add(event.wait)
                if event.hold is not None:
                    self._reservoir(group, "hold").add(event.hold)
                if event.release is not None:
                    self._reservoir(group, "release").add(event.release)

    def _reservoir(self, group: str, span: str) -> Reservoir:
        reservoir = self._spans.get((group, span))
        if reservoir is None:
            reservoir = self._spans[(group, span)] = Reservoir(self.reservoir_size)
        return reservoir

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Return ``{group: {"counts": {kind: n}, "wait"|"hold"|"release": summary}}``."""
        self.drain()
        with self._mutex:
            groups = sorted(self._counts)
            out: dict[str, dict[str, Any]] = {}
            for group in groups:
                entry: dict[str, Any] = {"counts": dict(sorted(self._counts[group].items()))}
                for span in SPANS:
                    reservoir = self._spans.get((group, span))
                    if reservoir is not None:
                        entry[span] = reservoir.summary()
                out[group] = entry
            return out

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._pending.clear()
        with self._mutex:
            self._counts.clear()
            self._spans.clear()

    def _after_fork(self) -> None:
        # The parent's mutex may have been held at fork(); a child starts from zero.
        super()._after_fork()
        self._mutex = threading.Lock()
        self._counts = {}
        self._spans = {}
