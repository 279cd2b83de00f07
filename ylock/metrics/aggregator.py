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
            slot = self._random.randrange(self.count)
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


class Aggregator:
    """Subscribe an instance to :mod:`ylock.events` to summarise this process's locking.

    Calling it is the subscriber: it takes one short mutex, so it is cheap on the lock path.
    """

    def __init__(self, reservoir_size: int = 1024) -> None:
        self.reservoir_size = reservoir_size
        self._mutex = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}
        self._spans: dict[tuple[str, str], Reservoir] = {}

    def __call__(self, event: Event) -> None:
        with self._mutex:
            counts = self._counts.get(event.group)
            if counts is None:
                counts = self._counts[event.group] = Counter()
            counts[event.kind] += 1
            for span in SPANS:
                value = getattr(event, span)
                if value is not None:
                    key = (event.group, span)
                    reservoir = self._spans.get(key)
                    if reservoir is None:
                        reservoir = self._spans[key] = Reservoir(self.reservoir_size)
                    reservoir.add(value)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Return ``{group: {"counts": {kind: n}, "wait"|"hold"|"release": summary}}``."""
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
        with self._mutex:
            self._counts.clear()
            self._spans.clear()

    def _after_fork(self) -> None:
        # The parent's mutex may have been held at fork(); a child starts from zero.
        self._mutex = threading.Lock()
        self._counts = {}
        self._spans = {}
