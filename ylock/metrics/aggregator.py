"""An in-memory, per-process summary of lock events, for ``ylock stats`` commands.

Two views of the same events, both bounded whatever the traffic:

- **since start** (:meth:`Aggregator.snapshot`): every event kind counted per group, and
  per group and span (``wait``, ``hold``, ``release``) the exact count, sum and maximum
  plus a bounded uniform sample (Vitter's reservoir, algorithm R) for percentiles. Memory:
  the number of groups times the reservoir size.
- **the last few minutes** (:meth:`Aggregator.window`), the view that every process
  publishes for the deployment's ``ylock stats`` (:mod:`ylock.metrics.shared`): the last
  :data:`WINDOW` seconds in slices of :data:`SLICE` seconds of wall-clock time (so
  between ``WINDOW - SLICE`` and ``WINDOW`` seconds of history; every process cuts the
  same slices), each slice holding per group the counts and one :class:`Histogram` per
  span. A histogram keeps count, sum and maximum exactly and the durations in
  logarithmic buckets (:data:`BUCKETS_PER_DOUBLING` per doubling, from 1 µs), so
  histograms of several slices or processes merge exactly by adding buckets, and a
  percentile read from them is the upper bound of its bucket: at most 9.1 % above the
  exact value, never above the maximum. Memory: at most ``WINDOW / SLICE + 1`` slices of
  at most :data:`MAX_GROUPS` groups (further groups count under :data:`OTHER`), each
  histogram at most :data:`MAX_BUCKET` + 1 integers.
"""
from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ylock.events import Event
from ylock.metrics.deferred import Deferred

SPANS = ("wait", "hold", "release")
PERCENTILES = (50, 90, 99)

#: Seconds of history that :meth:`Aggregator.window` covers, and the slices it is kept in.
WINDOW = 300.0
SLICE = 20.0
#: Groups per slice; the events of any further group count under :data:`OTHER`.
MAX_GROUPS = 1000
OTHER = "(other groups)"
#: Histogram buckets: bucket ``i`` holds durations in (``MIN * 2**((i-1)/B)``, ``MIN * 2**(i/B)``]
#: seconds (B = BUCKETS_PER_DOUBLING), bucket 0 everything up to MIN; the last bucket
#: (from about 12 days) everything longer.
HISTOGRAM_MIN = 1e-6
BUCKETS_PER_DOUBLING = 8
MAX_BUCKET = 320


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


class Histogram:
    """Durations in logarithmic buckets with exact count, sum and max: mergeable exactly
    (add the buckets), percentiles within one bucket's width (9.1 %) above the truth."""

    __slots__ = ("count", "total", "maximum", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.maximum = 0.0
        self.buckets: dict[int, int] = {}

    @staticmethod
    def bucket(value: float) -> int:
        """Return the index of the bucket that holds ``value`` seconds."""
        if value <= HISTOGRAM_MIN:
            return 0
        return min(MAX_BUCKET, math.ceil(math.log2(value / HISTOGRAM_MIN) * BUCKETS_PER_DOUBLING))

    @staticmethod
    def upper_bound(index: int) -> float:
        """Return the largest duration that bucket ``index`` holds."""
        return float(HISTOGRAM_MIN * 2 ** (index / BUCKETS_PER_DOUBLING))

    def add(self, value: float) -> None:
        """Record one duration."""
        self.count += 1
        self.total += value
        if value > self.maximum:
            self.maximum = value
        index = self.bucket(value)
        self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s durations to this histogram."""
        self.count += other.count
        self.total += other.total
        self.maximum = max(self.maximum, other.maximum)
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n

    def percentile(self, p: float) -> float | None:
        """Return the ``p``-th percentile (nearest rank): the upper bound of the bucket that
        holds it, capped at the exact maximum; None if empty."""
        total = sum(self.buckets.values())
        if not total:
            return None
        rank = max(1, math.ceil(p / 100 * total))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return self.maximum if index == MAX_BUCKET else min(self.upper_bound(index), self.maximum)
        return self.maximum

    def summary(self) -> dict[str, float | int | None]:
        """Return count, sum, mean, max and the :data:`PERCENTILES` (approximate), in seconds."""
        out: dict[str, float | int | None] = {
            "count": self.count,
            "sum": self.total,
            "mean": self.total / self.count if self.count else None,
            "max": self.maximum if self.count else None,
        }
        for p in PERCENTILES:
            out[f"p{p}"] = self.percentile(p)
        return out

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form that :meth:`from_dict` reads back."""
        return {"count": self.count, "sum": self.total, "max": self.maximum,
                "buckets": {str(i): n for i, n in sorted(self.buckets.items())}}

    @classmethod
    def from_dict(cls, data: Any) -> Histogram:
        """Return the histogram that :meth:`as_dict` described; raise ValueError if ``data``
        is not such a description (it comes from another process)."""
        if not isinstance(data, dict) or not isinstance(data.get("buckets"), dict):
            raise ValueError(f"not a histogram: {data!r:.80}")
        histogram = cls()
        histogram.count = _whole(data.get("count"))
        histogram.total = _finite(data.get("sum"))
        histogram.maximum = _finite(data.get("max"))
        for index, n in data["buckets"].items():
            i = int(index)
            if not 0 <= i <= MAX_BUCKET:
                raise ValueError(f"histogram bucket {index!r} out of range")
            histogram.buckets[i] = histogram.buckets.get(i, 0) + _whole(n)
        return histogram


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a count, got {value!r:.40}")
    return value


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a duration, got {value!r:.40}")
    return float(value)


class _Slice:
    """One group's events within one slice of the window."""

    __slots__ = ("counts", "spans", "schemes")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.spans: dict[str, Histogram] = {}
        self.schemes: set[str] = set()


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
        #: slice number (``int(timestamp // SLICE)``) -> group -> that group's events
        self._slices: dict[int, dict[str, _Slice]] = {}
        #: Called (off the lock path) after each batch of events is applied; the
        #: statistics publisher starts itself with it (:mod:`ylock.metrics.shared`).
        self.after_apply: Callable[[], None] | None = None

    def apply(self, events: list[Event]) -> None:
        with self._mutex:
            all_counts = self._counts
            slices = self._slices
            current = math.floor(time.time() / SLICE)
            for event in events:
                group = event.group
                counts = all_counts.get(group)
                if counts is None:
                    counts = all_counts[group] = Counter()
                counts[event.kind] += 1
                number = math.floor(event.timestamp / SLICE) if event.timestamp else current
                groups = slices.get(number)
                if groups is None:
                    groups = slices[number] = {}
                part = groups.get(group)
                if part is None:
                    if len(groups) >= MAX_GROUPS:
                        group = OTHER
                    part = groups.get(group)
                    if part is None:
                        part = groups[group] = _Slice()
                part.counts[event.kind] += 1
                part.schemes.add(event.engine)
                for span, value in (("wait", event.wait), ("hold", event.hold), ("release", event.release)):
                    if value is not None:
                        self._reservoir(event.group, span).add(value)
                        histogram = part.spans.get(span)
                        if histogram is None:
                            histogram = part.spans[span] = Histogram()
                        histogram.add(value)
            self._prune(current)
        hook = self.after_apply
        if hook is not None:
            hook()

    def _prune(self, current: int) -> None:
        # Keep the slices of the window; a slice from the future (the clock stepped back)
        # goes too, so that their number stays bounded whatever the clock does.
        oldest = current - math.ceil(WINDOW / SLICE)
        for number in [n for n in self._slices if not oldest <= n <= current]:
            del self._slices[number]

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

    def window(self) -> dict[str, Any]:
        """Return the last :data:`WINDOW` seconds, mergeable with other processes' windows::

            {"window": 300.0, "since": <epoch seconds of the oldest slice>, "schemes": ["redis"],
             "groups": {group: {"counts": {kind: n}, "schemes": [...],
                                "wait"|"hold"|"release": Histogram.as_dict()}}}
        """
        self.drain()
        with self._mutex:
            current = math.floor(time.time() / SLICE)
            self._prune(current)
            merged: dict[str, _Slice] = {}
            for number in sorted(self._slices):
                for group, part in self._slices[number].items():
                    into = merged.get(group)
                    if into is None:
                        into = merged[group] = _Slice()
                    into.counts.update(part.counts)
                    into.schemes |= part.schemes
                    for span, histogram in part.spans.items():
                        into.spans.setdefault(span, Histogram()).merge(histogram)
            since = min(self._slices, default=current) * SLICE
        groups: dict[str, Any] = {}
        for group in sorted(merged):
            part = merged[group]
            entry: dict[str, Any] = {"counts": dict(sorted(part.counts.items())), "schemes": sorted(part.schemes)}
            for span in SPANS:
                if span in part.spans:
                    entry[span] = part.spans[span].as_dict()
            groups[group] = entry
        return {"window": WINDOW, "since": since,
                "schemes": sorted({e for part in merged.values() for e in part.schemes}), "groups": groups}

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self._pending.clear()
        with self._mutex:
            self._counts.clear()
            self._spans.clear()
            self._slices.clear()

    def _after_fork(self) -> None:
        # The parent's mutex may have been held at fork(); a child starts from zero.
        super()._after_fork()
        self._mutex = threading.Lock()
        self._counts = {}
        self._spans = {}
        self._slices = {}
