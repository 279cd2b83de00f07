"""The panels of ylock's Grafana dashboards, described once for every data source.

Each panel lists what it plots as measures (:class:`Quantile`, :class:`Count`,
:class:`Total`, :class:`ExporterCount`) in terms of ylock's events, not of a query
language; :mod:`ylock.metrics.grafana` renders them as Flux over the InfluxDB points of
:mod:`ylock.metrics.influxdb` and as PromQL over the metrics of
:mod:`ylock.metrics.prometheus`. A panel added here appears in both dashboards (unless
its measures exist in one export only: ``backends``).
"""
from __future__ import annotations

from dataclasses import dataclass

#: The data sources a dashboard is rendered for.
FLUX, PROMQL = "flux", "promql"


@dataclass(frozen=True)
class Quantile:
    """The ``q`` quantile of a span (``wait``, ``hold``, ``release``) of ``outcome`` events, per group."""

    span: str
    outcome: str
    q: float


@dataclass(frozen=True)
class Count:
    """How many ``outcome`` events, per group and time window."""

    outcome: str


@dataclass(frozen=True)
class Total:
    """How many ``outcome`` events, per group, over the dashboard's whole time range."""

    outcome: str


@dataclass(frozen=True)
class ExporterCount:
    """A background exporter's own figure (``dropped``, ``failed``: per window; ``queued``: now)."""

    what: str


Measure = Quantile | Count | Total | ExporterCount


@dataclass(frozen=True)
class Panel:
    """One panel: what it plots, where it sits (Grafana's 24-column grid), how it reads."""

    id: int
    title: str
    measures: tuple[Measure, ...]
    unit: str
    x: int
    y: int
    kind: str = "timeseries"
    w: int = 12
    h: int = 8
    description: str = ""
    backends: tuple[str, ...] = (FLUX, PROMQL)


PANELS = (
    Panel(1, "Wait time to acquire, p50 / p90 / p99 per group",
          (Quantile("wait", "acquired", 0.5), Quantile("wait", "acquired", 0.9), Quantile("wait", "acquired", 0.99)),
          "s", 0, 0, description="Seconds from the lock call to the acquisition (field wait, outcome acquired)."),
    Panel(2, "Hold time, p50 / p99 per group", (Quantile("hold", "released", 0.5), Quantile("hold", "released", 0.99)),
          "s", 12, 0, description="First acquire to final release (reentry does not cut it)."),
    Panel(3, "Acquisitions per group", (Count("acquired"),), "short", 0, 8),
    Panel(4, "Timeouts per group", (Count("timed_out"),), "short", 12, 8,
          description="Lock calls that gave up after their timeout (HTTP 423 in the plugins)."),
    Panel(5, "Lost locks", (Count("lost"),), "short", 0, 16, w=8,
          description="Holds whose lease could not be renewed: another owner may have had the lock."),
    Panel(6, "Waiters evicted", (Count("waiter_evicted"),), "short", 8, 16, w=8,
          description="Dead queue heads removed by another waiter."),
    Panel(7, "Release call time, p99", (Quantile("release", "released", 0.99),), "s", 16, 16, w=8),
    Panel(8, "Timeouts / acquisitions, whole range", (Total("timed_out"), Total("acquired")), "short", 0, 24,
          kind="bargauge", w=24, h=6),
    Panel(9, "Exporters: events dropped, failed, queued",
          (ExporterCount("dropped"), ExporterCount("failed"), ExporterCount("queued")), "short", 0, 30, w=24,
          description="What the background exporters (InfluxDB, yours) could not ship: dropped when their "
                      "buffer was full, failed when the sink refused a batch; queued: waiting now.",
          backends=(PROMQL,)),
)
