"""Export lock events as Prometheus metrics (``prometheus-client``).

=====================================  =========  ==============================================
metric                                 type       labels
=====================================  =========  ==============================================
``ylock_events_total``                 counter    group, name, engine, mode, outcome
``ylock_wait_seconds``                 histogram  group, name, engine, mode, outcome (acquired/timed_out)
``ylock_hold_seconds``                 histogram  group, name, engine, mode
``ylock_release_seconds``              histogram  group, name, engine, mode
``ylock_exporter_dropped_total``       counter    exporter (events a full buffer dropped)
``ylock_exporter_failed_total``        counter    exporter (events in batches the sink refused)
``ylock_exporter_queued``              gauge      exporter
=====================================  =========  ==============================================

The lock path only queues the event (:mod:`ylock.metrics.deferred`); the counts are
kept in plain dicts, updated in batches off the lock path and always before a scrape, and
turned into metric families by a collector of the exporter's own. Metrics live in their
own ``CollectorRegistry`` by default (:attr:`PrometheusExporter.registry`, which the Django and Flask plugins serve at
``/metrics`` when asked); pass ``prometheus_client.REGISTRY`` to add them to an existing
endpoint instead. Multi-process servers need ``prometheus_client``'s multiprocess mode,
as for any other metric.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

from ylock.events import Event
from ylock.metrics.background import live_shippers
from ylock.metrics.deferred import Deferred
from ylock.metrics.tags import LABELS, Tagging

#: Histogram buckets in seconds: from a local round trip to a long hold.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _ShipperCollector:
    """Report the drop, failure and queue counts of this process's background exporters."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        dropped = CounterMetricFamily(f"{self.namespace}_exporter_dropped", "Events dropped: exporter buffer full",
                                      labels=["exporter"])
        failed = CounterMetricFamily(f"{self.namespace}_exporter_failed", "Events the exporter's sink refused",
                                     labels=["exporter"])
        queued = GaugeMetricFamily(f"{self.namespace}_exporter_queued", "Events waiting in the exporter buffer",
                                   labels=["exporter"])
        for shipper in live_shippers():
            stats = shipper.stats()
            dropped.add_metric([shipper.kind], stats["dropped"])
            failed.add_metric([shipper.kind], stats["failed"])
            queued.add_metric([shipper.kind], stats["queued"])
        yield dropped
        yield failed
        yield queued


class PrometheusExporter(Deferred):
    """Count events and observe spans into Prometheus metrics; subscribe it to :mod:`ylock.events`.

    The counts live in plain dicts, updated in batches off the lock path, and a collector
    of its own turns them into the metric families at scrape time (``prometheus-client``'s
    ``Counter``/``Histogram`` take a lock per update: several microseconds per event).
    """

    def __init__(self, registry: Any = None, *, namespace: str = "ylock", tagging: Tagging | None = None,
                 buckets: Sequence[float] = BUCKETS) -> None:
        from prometheus_client import CollectorRegistry

        super().__init__()
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(b != b for b in bounds):
            raise ValueError(f"buckets must be numbers, got {buckets!r}")
        self.buckets = tuple(b for b in bounds if b != float("inf"))
        self.namespace = namespace
        self.tagging = tagging or Tagging()
        self._events: dict[tuple[str, ...], int] = {}
        self._labels: dict[tuple[Any, ...], tuple[str, ...]] = {}   # event[:5] -> label values
        # span -> labels -> [count per bucket (the last one: above every bound)..., sum]
        self._spans: dict[str, dict[tuple[str, ...], list[float]]] = {"wait": {}, "hold": {}, "release": {}}
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry.register(_Collector(self))
        self.registry.register(_ShipperCollector(namespace))

    def __repr__(self) -> str:
        return f"<PrometheusExporter namespace={self.namespace}>"

    def apply(self, events: list[Event]) -> None:
        counts, labels_of, buckets = self._events, self.tagging.labels, self.buckets
        waits, holds, releases = self._spans["wait"], self._spans["hold"], self._spans["release"]
        width = len(buckets) + 2
        cache = self._labels
        for event in events:
            raw = event[:5]                  # kind, group, name, engine, mode
            labels = cache.get(raw)
            if labels is None:
                labels = cache[raw] = labels_of(event)
            counts[labels] = counts.get(labels, 0) + 1
            for table, value, key in ((waits, event.wait, labels), (holds, event.hold, labels[:4]),
                                      (releases, event.release, labels[:4])):
                if value is not None:
                    row = table.get(key)
                    if row is None:
                        row = table[key] = [0.0] * width
                    row[bisect.bisect_left(buckets, value)] += 1
                    row[-1] += value

    def families(self) -> list[Any]:
        """Return the metric families of what was recorded (every pending event applied)."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        self.drain()
        with self._drain_mutex:     # no batch is being applied while we read
            events = dict(self._events)
            spans = {span: {k: list(v) for k, v in rows.items()} for span, rows in self._spans.items()}
        ns = self.namespace
        counter = CounterMetricFamily(f"{ns}_events", "Lock events by outcome (acquired, timed_out, released, "
                                      "renewed, lost, waiter_evicted)", labels=LABELS)
        for labels, value in sorted(events.items()):
            counter.add_metric(labels, value)
        out: list[Any] = [counter]
        bounds = [floatToGoString(b) for b in self.buckets] + ["+Inf"]
        for span, doc, labelnames in (
                ("wait", "Seconds from a lock call to its outcome (acquired or timed_out)", LABELS),
                ("hold", "Seconds from first acquisition to final release", LABELS[:4]),
                ("release", "Seconds a final release call took", LABELS[:4])):
            family = HistogramMetricFamily(f"{ns}_{span}_seconds", doc, labels=labelnames)
            for labels, row in sorted(spans[span].items()):
                cumulative, running = [], 0.0
                for bound, count in zip(bounds, row[:-1]):
                    running += count
                    cumulative.append((bound, running))
                family.add_metric(list(labels), cumulative, row[-1])
            out.append(family)
        return out

    def expose(self) -> tuple[bytes, str]:
        """Return the text exposition of :attr:`registry` and its content type (for a ``/metrics`` view)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Collector:
    """Hands the exporter's families to its registry at scrape time."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = exporter

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        return iter(self.exporter.families())
