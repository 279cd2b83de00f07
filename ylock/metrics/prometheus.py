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
``ylock_exporter_queued``              gauge      exporter (``livesum`` across processes)
``ylock_watchdog_late_renewals_total`` counter    renewals sent over a sixth of their lease late
``ylock_watchdog_lag_seconds``         gauge      how late the latest batch went out (``max``)
=====================================  =========  ==============================================

They are ``prometheus_client``'s own ``Counter``, ``Histogram`` and ``Gauge``, so its
multiprocess mode works: with ``$PROMETHEUS_MULTIPROC_DIR`` set before the process starts,
every worker writes its values to its own files in that directory, and :meth:`PrometheusExporter.expose`
(what the Django and Flask ``/metrics`` views serve) answers with a ``MultiProcessCollector``
over the directory: the whole deployment's totals, whichever worker answers, including
workers that have exited (their counters stay in their files).

The lock path only queues the event (:mod:`ylock.metrics.deferred`); batches are applied
to the metrics off the lock path (counts summed per label set, one increment each), by
the process's pump thread every :data:`ylock.metrics.deferred.PERIOD` seconds, before
every scrape of this process, and at exit. So a scrape answered by any worker sees every
event of every worker within that period (a worker's own events at once).

Metrics live in their own ``CollectorRegistry`` by default (:attr:`PrometheusExporter.registry`);
pass ``prometheus_client.REGISTRY`` to add them to an existing endpoint instead. In
multiprocess mode serve that endpoint with a ``MultiProcessCollector`` as
``prometheus_client`` documents; ylock's values are in the files like any other metric.
For gunicorn, :func:`child_exit` (and :func:`on_starting`) are ready-made server hooks
(sync and gthread workers; gevent's need hooks that import nothing of ylock: docs/metrics.md).
"""
from __future__ import annotations

import bisect
import glob
import math
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.events import Event
from ylock.metrics.background import Shipper, live_shippers
from ylock.metrics.deferred import Deferred
from ylock.metrics.tags import LABELS, Tagging
from ylock.watchdog import WATCHDOG

#: Histogram buckets in seconds: from a local round trip to a long hold.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The environment variable of ``prometheus_client``'s multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds between two copies of the background exporters' counts into the metrics by the pump.
SHIPPER_PERIOD = 1.0
#: At most this many distinct (kind, group, name, engine, mode) are remembered with their
#: metric children; then the memory starts again (a per-user family must not grow it: its
#: names share one child each, ``name="*"``, but each name would be an entry here).
CHILDREN_CACHE = 4096


def multiprocess_dir() -> str | None:
    """Return the multiprocess directory of this process, or None in single-process mode.

    Raise ConfigurationError when ``$PROMETHEUS_MULTIPROC_DIR`` is set but is not a
    directory, or was set after ``prometheus_client`` chose single-process values (it
    decides once, when first imported): values would then never reach the files.
    """
    from prometheus_client import values

    path = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    multiprocess = bool(getattr(values.ValueClass, "_multiprocess", False))
    if not path:
        return None
    if not os.path.isdir(path):
        raise ConfigurationError(f"${MULTIPROC_ENV} must be an existing directory, got {path!r}",
                                 code=opt.E_METRICS, hint="create it (and empty it) before the server starts")
    if not multiprocess:
        raise ConfigurationError(f"${MULTIPROC_ENV} was set after prometheus_client was imported: its values "
                                 "stay in this process", code=opt.E_METRICS,
                                 hint="set it in the environment the server starts with")
    return path


class PrometheusExporter(Deferred):
    """Count events and observe spans into ``prometheus_client`` metrics; subscribe it to :mod:`ylock.events`.

    Updating a ``Counter`` or a ``Histogram`` takes a lock (and, in multiprocess mode,
    writes to a memory-mapped file): several microseconds, which the lock path must not
    pay. So the lock path only queues the event, and :meth:`apply` updates the metrics in
    batches off it, always before this process is scraped.
    """

    def __init__(self, registry: Any = None, *, namespace: str = "ylock", tagging: Tagging | None = None,
                 buckets: Sequence[float] = BUCKETS) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # Set before super().__init__() makes the pump see this exporter (its tick() reads them).
        # event[:5] -> [events counter child, label values, wait, hold, release histogram children or None]
        self._children: dict[tuple[Any, ...], list[Any]] = {}
        self._batchable: dict[Any, bool] = {}   # histogram child -> bucket values updatable per batch
        self._shipped: weakref.WeakKeyDictionary[Shipper, tuple[int, int]] = weakref.WeakKeyDictionary()
        self._shippers_at = time.monotonic()    # the pump's first copy in a second; a scrape's at once
        self._multiprocess_registry: Any = None
        super().__init__()
        bounds = sorted(float(b) for b in buckets)
        if not bounds or any(b != b for b in bounds):
            raise ValueError(f"buckets must be numbers, got {buckets!r}")
        self.buckets = tuple(b for b in bounds if b != float("inf"))
        self.namespace = namespace
        self.tagging = tagging or Tagging()
        self.tagging_key: Any = None        # what ylock.metrics.configure built the tagging from
        self.multiprocess_dir = multiprocess_dir()
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        ns = namespace
        # Registered first, so that every collection of the registry applies pending events first.
        self._flusher = _Flusher(self)
        self.registry.register(self._flusher)
        self.events = Counter(f"{ns}_events", "Lock events by outcome (acquired, timed_out, released, renewed, "
                              "lost, waiter_evicted)", LABELS, registry=self.registry)
        self.spans = {
            "wait": Histogram(f"{ns}_wait_seconds", "Seconds from a lock call to its outcome (acquired or "
                              "timed_out)", LABELS, registry=self.registry, buckets=self.buckets),
            "hold": Histogram(f"{ns}_hold_seconds", "Seconds from first acquisition to final release",
                              LABELS[:4], registry=self.registry, buckets=self.buckets),
            "release": Histogram(f"{ns}_release_seconds", "Seconds a final release call took", LABELS[:4],
                                 registry=self.registry, buckets=self.buckets),
        }
        self.dropped = Counter(f"{ns}_exporter_dropped", "Events dropped: exporter buffer full", ["exporter"],
                               registry=self.registry)
        self.failed = Counter(f"{ns}_exporter_failed", "Events the exporter's sink refused", ["exporter"],
                              registry=self.registry)
        # livesum: the deployment's queue is what live processes hold (child_exit forgets the dead).
        self.queued = Gauge(f"{ns}_exporter_queued", "Events waiting in the exporter buffer", ["exporter"],
                            registry=self.registry, multiprocess_mode="livesum")
        # The renewal thread falling behind (ylock.watchdog): copied with the shippers' counts.
        self.watchdog_late = Counter(f"{ns}_watchdog_late_renewals", "Renewals the watchdog sent more than a "
                                     "sixth of their lease after they were due (it falls behind)",
                                     registry=self.registry)
        self.watchdog_lag = Gauge(f"{ns}_watchdog_lag_seconds", "How late the watchdog's latest batch sent its "
                                  "most overdue renewal", registry=self.registry, multiprocess_mode="max")
        self._late_seen = 0

    def retag(self, tagging: Tagging) -> None:
        """Tag the events applied from now on with ``tagging`` (settings changed: the exporter,
        registered once per registry and namespace, is kept)."""
        with self._drain_mutex:
            self.tagging = tagging
            self._children = {}

    def _after_fork(self) -> None:
        super()._after_fork()
        self._shipped = weakref.WeakKeyDictionary()   # the child's shippers count from 0
        self._late_seen = 0                           # and its watchdog

    def __repr__(self) -> str:
        return f"<PrometheusExporter namespace={self.namespace}>"

    def apply(self, events: list[Event]) -> None:
        children, labels_of = self._children, self.tagging.labels
        if len(children) > CHILDREN_CACHE:
            children.clear()            # the metrics keep their children: the rows are found again
        counts: dict[Any, int] = {}
        observed: dict[Any, list[float]] = {}
        for event in events:
            raw = event[:5]                  # kind, group, name, engine, mode
            row = children.get(raw)
            if row is None:
                labels = labels_of(event)
                row = children[raw] = [self.events.labels(*labels), labels, None, None, None]
            counts[row[0]] = counts.get(row[0], 0) + 1
            # A histogram child only for the spans this kind of event has: no empty series.
            for slot, span, value in ((2, "wait", event.wait), (3, "hold", event.hold),
                                      (4, "release", event.release)):
                if value is not None:
                    child = row[slot]
                    if child is None:
                        labels = row[1]
                        child = row[slot] = self.spans[span].labels(*(labels if span == "wait" else labels[:4]))
                    values = observed.get(child)
                    if values is None:
                        values = observed[child] = []
                    values.append(value)
        for counter, count in counts.items():   # one locked update per label set and batch
            counter.inc(count)
        for child, values in observed.items():
            self._observe(child, values)
        self._copy_shipper_counts()

    def _observe(self, child: Any, values: list[float]) -> None:
        """Observe ``values`` into a histogram child: one update per bucket the batch touched.

        ``Histogram.observe`` takes a lock and updates two values per call (in multiprocess
        mode: two writes to the memory-mapped file), which made a batch 4-6 times dearer
        than the dicts this exporter used to keep. So when the child has the bucket and sum
        values ``prometheus_client`` has always kept (checked once per child, for exactly
        our bounds), each touched bucket and the sum are incremented once per batch;
        otherwise every value goes through ``observe()``.
        """
        fast = self._batchable.get(child)
        if fast is None:
            bucket_values, total_value = getattr(child, "_buckets", None), getattr(child, "_sum", None)
            fast = self._batchable[child] = (
                isinstance(bucket_values, list) and len(bucket_values) == len(self.buckets) + 1
                and list(getattr(child, "_upper_bounds", ())) == [*self.buckets, float("inf")]
                and all(hasattr(v, "inc") for v in bucket_values) and hasattr(total_value, "inc"))
        if not fast:
            for value in values:
                child.observe(value)
            return
        buckets = self.buckets
        hits = [0] * (len(buckets) + 1)
        for value in values:
            hits[bisect.bisect_left(buckets, value)] += 1   # the first bound >= value: observe()'s bucket
        child._sum.inc(math.fsum(values))
        for index, count in enumerate(hits):
            if count:
                child._buckets[index].inc(count)

    def tick(self) -> None:
        super().tick()
        if time.monotonic() - self._shippers_at >= SHIPPER_PERIOD:
            with self._drain_mutex:
                self._copy_shipper_counts()

    def _copy_shipper_counts(self) -> None:
        """Bring the background exporters' drop, failure and queue counts into the metrics
        (under the drain mutex: two copies at once would count a difference twice)."""
        self._shippers_at = time.monotonic()
        queued: dict[str, int] = {}
        for shipper in live_shippers():
            stats = shipper.stats()
            dropped, failed = stats["dropped"], stats["failed"]
            last_dropped, last_failed = self._shipped.get(shipper, (0, 0))
            # A shipper's counts restart from 0 in a forked child: count from there.
            if dropped < last_dropped or failed < last_failed:
                last_dropped = last_failed = 0
            # labels() even for no change: a live exporter shows its zeros, as a scrape should.
            self.dropped.labels(shipper.kind).inc(max(dropped - last_dropped, 0))
            self.failed.labels(shipper.kind).inc(max(failed - last_failed, 0))
            self._shipped[shipper] = (dropped, failed)
            queued[shipper.kind] = queued.get(shipper.kind, 0) + stats["queued"]
        for kind, value in queued.items():
            self.queued.labels(kind).set(value)
        watchdog = WATCHDOG.stats()
        late = int(watchdog["late"])
        self.watchdog_late.inc(max(late - self._late_seen, 0))
        self._late_seen = late
        self.watchdog_lag.set(watchdog["lag"])

    def flush(self) -> None:
        """Apply every pending event and the background exporters' counts to the metrics now."""
        self.drain()
        with self._drain_mutex:
            self._copy_shipper_counts()

    def families(self) -> list[Any]:
        """Return this process's metric families (every pending event applied)."""
        self.flush()
        return [family for metric in (self.events, *self.spans.values(), self.dropped, self.failed, self.queued,
                                      self.watchdog_late, self.watchdog_lag)
                for family in metric.collect()]

    def scrape_registry(self) -> Any:
        """Return the registry a ``/metrics`` view serves: :attr:`registry`, or in multiprocess
        mode one with a ``MultiProcessCollector`` over the directory (every process's values)."""
        if self.multiprocess_dir is None:
            return self.registry
        if self._multiprocess_registry is None:
            from prometheus_client import CollectorRegistry
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)
            self._multiprocess_registry = registry
        return self._multiprocess_registry

    def expose(self) -> tuple[bytes, str]:
        """Return the text exposition for a ``/metrics`` view and its content type.

        This process's pending events are applied first; in multiprocess mode the answer
        covers every process that wrote to the directory (see :meth:`scrape_registry`).
        """
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.flush()
        return generate_latest(self.scrape_registry()), CONTENT_TYPE_LATEST

    def close(self) -> None:
        """Apply what is pending and take the metrics off :attr:`registry` (so they can be registered again)."""
        self.flush()
        collector: Any
        for collector in (self._flusher, self.events, *self.spans.values(), self.dropped, self.failed,
                          self.queued, self.watchdog_late, self.watchdog_lag):
            try:
                self.registry.unregister(collector)
            except KeyError:
                pass


class _Flusher:
    """Apply the exporter's pending events whenever its registry is collected; yield nothing."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = weakref.ref(exporter)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        exporter = self.exporter()
        if exporter is not None:
            exporter.flush()
        return iter(())


# -- server hooks -----------------------------------------------------------------------------


def child_exit(server: Any, worker: Any) -> None:
    """Forget a dead worker's live gauges (gunicorn's ``child_exit`` hook; counters and
    histograms of the dead worker stay counted).

    In ``gunicorn.conf.py`` of sync or gthread workers: ``from ylock.metrics.prometheus
    import child_exit``. Not with gevent or eventlet workers: the master would import ylock
    before they monkey-patch ``threading`` (docs/metrics.md has a hook without ylock).
    """
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid, path)


def on_starting(server: Any) -> None:
    """Empty ``$PROMETHEUS_MULTIPROC_DIR`` of a previous run's files (gunicorn's ``on_starting`` hook).

    Counters would otherwise carry on from the previous run (and from pids that do not
    exist any more). Only for a directory of this server's own; runs before any worker starts.
    Without the variable the server starts as it is (each process serves its own counts),
    and one with several workers logs one warning naming the variable.
    """
    path = os.environ.get(MULTIPROC_ENV)
    if path and os.path.isdir(path):
        for name in glob.glob(os.path.join(path, "*.db")):
            os.remove(name)
    elif not path and getattr(getattr(server, "cfg", None), "workers", 1) > 1:
        server.log.warning(f"{MULTIPROC_ENV} is not set: each worker's /metrics counts only its own lock events")
