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

Updating a counter or a histogram is an in-memory operation, so this exporter is called
directly on the lock path. Metrics live in their own ``CollectorRegistry`` by default
(:attr:`PrometheusExporter.registry`, which the Django and Flask plugins serve at
``/metrics`` when asked); pass ``prometheus_client.REGISTRY`` to add them to an existing
endpoint instead. Multi-process servers need ``prometheus_client``'s multiprocess mode,
as for any other metric.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ylock.events import Event
from ylock.metrics.background import live_shippers
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


class PrometheusExporter:
    """Count events and observe spans into Prometheus metrics; subscribe it to :mod:`ylock.events`."""

    def __init__(self, registry: Any = None, *, namespace: str = "ylock", tagging: Tagging | None = None,
                 buckets: Sequence[float] = BUCKETS) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.namespace = namespace
        self.tagging = tagging or Tagging()
        span_labels = ("group", "name", "engine", "mode")
        self.events = Counter("events", "Lock events by outcome (acquired, timed_out, released, renewed, lost, "
                              "waiter_evicted)", LABELS, namespace=namespace, registry=self.registry)
        self.wait = Histogram("wait_seconds", "Seconds from a lock call to its outcome (acquired or timed_out)",
                              LABELS, namespace=namespace, registry=self.registry, buckets=buckets)
        self.hold = Histogram("hold_seconds", "Seconds from first acquisition to final release",
                              span_labels, namespace=namespace, registry=self.registry, buckets=buckets)
        self.release = Histogram("release_seconds", "Seconds a final release call took",
                                 span_labels, namespace=namespace, registry=self.registry, buckets=buckets)
        self.registry.register(_ShipperCollector(namespace))

    def __repr__(self) -> str:
        return f"<PrometheusExporter namespace={self.namespace}>"

    def __call__(self, event: Event) -> None:
        labels = self.tagging.labels(event)
        self.events.labels(*labels).inc()
        if event.wait is not None:
            self.wait.labels(*labels).observe(event.wait)
        if event.hold is not None:
            self.hold.labels(*labels[:4]).observe(event.hold)
        if event.release is not None:
            self.release.labels(*labels[:4]).observe(event.release)

    def expose(self) -> tuple[bytes, str]:
        """Return the text exposition of :attr:`registry` and its content type (for a ``/metrics`` view)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
