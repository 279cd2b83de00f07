"""Metrics for ylock: observe every lock call, whatever the engine, and export it.

The facade publishes :class:`ylock.events.Event` s synchronously (acquired, timed_out,
released, renewed, lost, waiter_evicted, with wait/hold/release spans). This package
subscribes exporters to them:

- an in-memory :class:`~ylock.metrics.aggregator.Aggregator` (counts per kind and
  group, wait/hold/release percentiles), whose last five minutes every process publishes
  to the engines it locks on (:mod:`ylock.metrics.shared`), so that ``ylock stats`` in
  any process shows the whole deployment;
- :class:`~ylock.metrics.influxdb.InfluxExporter`: one batching writer per process with
  a bounded buffer that drops, and counts, what InfluxDB cannot take;
- :class:`~ylock.metrics.prometheus.PrometheusExporter`: ``prometheus_client`` counters and
  histograms, right under multi-process servers with ``$PROMETHEUS_MULTIPROC_DIR``;
- user exporters, dotted paths to callables taking an Event, run off the lock path.

Configure them from one dict, the ``METRICS`` key of the Django ``YLOCK`` setting or
Flask's ``YLOCK_METRICS``::

    ylock.metrics.configure({
        "INFLUXDB": {"URL": "http://influx:8086", "TOKEN": "...", "ORG": "acme", "BUCKET": "locks"},
        "PROMETHEUS": True,
        "EXPORTERS": ["myapp.metrics.forward"],
        "TAG_NAMES": ["orders"],                           # name="*" in every other group
        "STATS_PERIOD": 5, "STATS_TTL": 60,                # publish for `ylock stats` (None: don't)
    })

``configure(None)`` (what Flask does when ``YLOCK_METRICS`` is not set) keeps the aggregator
for this process but publishes nothing: publishing starts when metrics are configured.

Exporters are process-wide, like the events they listen to: configuring the same
settings twice (two Flask apps, a test re-running ``ready()``) reuses the exporters
already running instead of starting a second writer.
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any

from ylock import events
from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.metrics.aggregator import Aggregator
from ylock.metrics.background import Shipper, live_shippers
from ylock.metrics.shared import Publisher
from ylock.metrics.tags import (
    ANY_NAME,
    MAX_NAMES,
    W_UNBOUNDED,
    Tagging,
    UnboundedLabelsWarning,
    keyed_groups,
    unbounded_labels,
)
from ylock.names import check_group
from ylock.owner import after_fork as _after_fork

__all__ = ["configure", "validate", "stats", "shutdown", "unbounded", "unbounded_labels", "keyed_groups", "Metrics",
           "Aggregator",
           "Tagging", "Shipper", "AGGREGATOR", "PUBLISHER", "Publisher", "ANY_NAME", "KEYS", "W_UNBOUNDED",
           "UnboundedLabelsWarning"]

#: Every key of a ``METRICS`` dict, with its default.
KEYS: dict[str, Any] = {
    "STATS": True,            # keep the in-memory aggregator behind `ylock stats`
    "TAG_NAMES": False,       # tag points with the lock name in these groups (few, fixed names): a list;
                              # False: none (name="*"); True: every group's (unbounded: warned about)
    "UNTAGGED_GROUPS": [],    # groups whose names are never tagged, whatever TAG_NAMES says
    "MAX_NAMES": MAX_NAMES,   # per group and process, at most this many names are tagged; then name="*"
    "INFLUXDB": None,         # dict of InfluxDB settings (see ylock.metrics.influxdb.DEFAULTS), or True for env
    "PROMETHEUS": None,       # True, or {"NAMESPACE": "ylock", "REGISTRY": "default"|"own", "PATH": "/metrics"}
    "EXPORTERS": [],          # dotted paths of callables taking an Event, run off the lock path
    "STATS_PERIOD": 5.0,      # seconds between two publications of the aggregator's window; None: never
    "STATS_TTL": 60.0,        # seconds a publication lives on the engine's server
}
PROMETHEUS_KEYS = {"NAMESPACE": "ylock", "REGISTRY": "own", "PATH": None, "BUCKETS": None}

#: The process's aggregator (subscribed by :func:`configure` unless ``STATS`` is False).
AGGREGATOR = Aggregator()
#: Publishes the aggregator's window for the deployment's ``ylock stats`` (started by
#: :func:`configure` given a dict, unless ``STATS`` is False or ``STATS_PERIOD`` is None).
PUBLISHER = Publisher(AGGREGATOR)

_mutex = threading.Lock()
_exporters: dict[tuple[Any, ...], Any] = {}   # settings key -> running exporter, process-wide


class Metrics:
    """What :func:`configure` set up: the exporters, subscribed to :mod:`ylock.events`."""

    def __init__(self, aggregator: Aggregator | None, influxdb: Any, prometheus: Any, custom: Any,
                 prometheus_path: str | None) -> None:
        self.aggregator = aggregator
        self.influxdb = influxdb
        self.prometheus = prometheus
        self.custom = custom
        self.prometheus_path = prometheus_path

    @property
    def subscribers(self) -> list[Any]:
        """Return every subscribed exporter."""
        return [s for s in (self.aggregator, self.influxdb, self.prometheus, self.custom) if s is not None]

    def stats(self) -> dict[str, Any]:
        """Return the aggregator's snapshot and the background exporters' counts."""
        return {"groups": self.aggregator.snapshot() if self.aggregator else {},
                "exporters": {s.kind: s.stats() for s in (self.influxdb, self.custom) if s is not None}}

    def flush(self, timeout: float = 5.0) -> bool:
        """Ship what the background exporters hold; return True if all drained in time."""
        return all([s.flush(timeout) for s in (self.influxdb, self.custom) if s is not None])

    def __repr__(self) -> str:
        return f"<ylock.metrics.Metrics {self.subscribers}>"


def validate(config: Mapping[str, Any] | None, *, setting: str = "METRICS",
             environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the full settings (defaults filled in); raise ConfigurationError naming the bad key.

    Check everything :func:`configure` would need (dotted paths import, InfluxDB settings
    complete, ``prometheus-client``/``influxdb-client`` installed) without starting anything.
    """
    from ylock.metrics import custom, influxdb

    code = opt.E_METRICS
    out = opt.section(config, setting, KEYS, code=code)
    opt.boolean(out["STATS"], f"{setting}['STATS']", code=code)
    out["TAG_NAMES"] = _tag_names(out["TAG_NAMES"], f"{setting}['TAG_NAMES']")
    out["MAX_NAMES"] = opt.number(out["MAX_NAMES"], f"{setting}['MAX_NAMES']", minimum=1, maximum=100_000,
                                  integer=True, code=code)
    if out["STATS_PERIOD"] is not None:
        out["STATS_PERIOD"] = opt.seconds(out["STATS_PERIOD"], f"{setting}['STATS_PERIOD']", maximum=3600, code=code)
    out["STATS_TTL"] = opt.seconds(out["STATS_TTL"], f"{setting}['STATS_TTL']", maximum=86400, code=code)
    if out["STATS_PERIOD"] is not None and out["STATS_TTL"] <= out["STATS_PERIOD"]:
        raise opt.fail(f"{setting}['STATS_TTL']", f"must be longer than STATS_PERIOD ({out['STATS_PERIOD']:g} s), "
                       f"got {out['STATS_TTL']:g}", code, "else a process vanishes from `ylock stats` between "
                       "two publications; e.g. 12 x STATS_PERIOD")
    for key in ("UNTAGGED_GROUPS", "EXPORTERS"):
        out[key] = opt.strings(out[key], f"{setting}[{key!r}]", code=code)
    for path in out["EXPORTERS"]:
        custom.import_callable(path, f"{setting}['EXPORTERS']")
    if out["INFLUXDB"] not in (None, False):
        _require("influxdb_client", f"{setting}['INFLUXDB']", "influxdb")
        out["INFLUXDB"] = influxdb.settings_from(out["INFLUXDB"], environ, f"{setting}['INFLUXDB']")
    else:
        out["INFLUXDB"] = None
    prom = out["PROMETHEUS"]
    if prom not in (None, False):
        where = f"{setting}['PROMETHEUS']"
        if prom is not True and not isinstance(prom, Mapping):
            raise opt.fail(where, f"must be True or a dict, got {prom!r}", code)
        prom = opt.section(None if prom is True else prom, where, PROMETHEUS_KEYS, code=code)
        opt.choice(prom["REGISTRY"], f"{where}['REGISTRY']", ("own", "default"), code=code)
        if prom["PATH"] is not None and (not isinstance(prom["PATH"], str) or not prom["PATH"].startswith("/")):
            raise opt.fail(f"{where}['PATH']", f"must be a URL path like '/metrics', got {prom['PATH']!r}", code)
        if not isinstance(prom["NAMESPACE"], str) or not prom["NAMESPACE"].isidentifier():
            raise opt.fail(f"{where}['NAMESPACE']", f"must be an identifier, got {prom['NAMESPACE']!r}", code)
        _require("prometheus_client", where, "prometheus")
        from ylock.metrics.prometheus import multiprocess_dir

        multiprocess_dir()   # $PROMETHEUS_MULTIPROC_DIR usable, if set
        out["PROMETHEUS"] = prom
    else:
        out["PROMETHEUS"] = None
    return out


def _tag_names(value: Any, where: str) -> bool | list[str]:
    """TAG_NAMES: True, False, or a list of lock groups."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise opt.fail(where, f"must be a list of the lock groups whose names are tagged (or True, or False), "
                       f"got {value!r}", opt.E_METRICS, "e.g. ['orders']: groups of few, fixed lock names")
    groups = list(value)
    for group in groups:
        try:
            check_group(group)
        except ValueError as exc:
            raise opt.fail(where, f"lists an invalid group: {exc}", opt.E_METRICS) from exc
    return groups


def unbounded(config: Mapping[str, Any] | None, keyed: Mapping[str, str], *, setting: str = "METRICS",
              environ: Mapping[str, str] | None = None) -> list[ConfigurationError]:
    """Return the warnings :func:`~ylock.metrics.tags.unbounded_labels` has for the metrics
    settings ``config`` (none when it is None or invalid: its errors say more), given the
    groups ``keyed`` one lock per key (group -> how)."""
    if config is None:
        return []
    try:
        s = validate(config, setting=setting, environ=environ)
    except (ConfigurationError, ImportError):
        return []
    if s["INFLUXDB"] is None and s["PROMETHEUS"] is None and not s["EXPORTERS"]:
        return []          # nothing exports the labels
    return unbounded_labels(s["TAG_NAMES"], s["UNTAGGED_GROUPS"], keyed=keyed, setting=setting)


def _require(module: str, where: str, extra: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"{where} needs {module.replace('_', '-')} (pip install 'ylock[{extra}]')",
                                 code=opt.E_EXTRA) from exc


def configure(config: Mapping[str, Any] | None, *, setting: str = "METRICS",
              environ: Mapping[str, str] | None = None) -> Metrics:
    """Validate ``config``, build (or reuse) its exporters and subscribe them to lock events."""
    from ylock.metrics.custom import CallbackExporter, import_callable
    from ylock.metrics.influxdb import InfluxExporter
    from ylock.metrics.prometheus import PrometheusExporter

    s = validate(config, setting=setting, environ=environ)
    names = s["TAG_NAMES"]
    tagging_key = (names if isinstance(names, bool) else tuple(sorted(names)), tuple(sorted(s["UNTAGGED_GROUPS"])),
                   s["MAX_NAMES"])
    tagging = Tagging(names, s["UNTAGGED_GROUPS"], s["MAX_NAMES"])
    key: tuple[Any, ...]
    with _mutex:
        influx = prom = callbacks = None
        if s["INFLUXDB"] is not None:
            i = s["INFLUXDB"]
            key = ("influxdb", tagging_key, tuple(sorted((k, repr(v)) for k, v in i.items())))
            influx = _exporters.get(key)
            if influx is None:
                influx = _exporters[key] = InfluxExporter.from_config(i, tagging=tagging, environ={})
        if s["PROMETHEUS"] is not None:
            p = s["PROMETHEUS"]
            # One set of metric families per registry and namespace: registering them twice fails.
            key = ("prometheus", p["REGISTRY"], p["NAMESPACE"])
            prom = _exporters.get(key)
            if prom is not None and prom.tagging_key != tagging_key:
                prom.retag(tagging)
                prom.tagging_key = tagging_key
            if prom is None:
                import prometheus_client

                registry = prometheus_client.REGISTRY if p["REGISTRY"] == "default" else None
                kwargs = {"buckets": tuple(p["BUCKETS"])} if p["BUCKETS"] else {}
                prom = _exporters[key] = PrometheusExporter(registry, namespace=p["NAMESPACE"], tagging=tagging,
                                                            **kwargs)
                prom.tagging_key = tagging_key
        if s["EXPORTERS"]:
            key = ("custom", tuple(s["EXPORTERS"]))
            callbacks = _exporters.get(key)
            if callbacks is None:
                callbacks = _exporters[key] = CallbackExporter([import_callable(p, f"{setting}['EXPORTERS']")
                                                                for p in s["EXPORTERS"]])
        aggregator = AGGREGATOR if s["STATS"] else None
        metrics = Metrics(aggregator, influx, prom, callbacks,
                          s["PROMETHEUS"]["PATH"] if s["PROMETHEUS"] else None)
        for subscriber in metrics.subscribers:
            events.subscribe(subscriber)
        if aggregator is not None and config is not None and s["STATS_PERIOD"] is not None:
            PUBLISHER.start(s["STATS_PERIOD"], s["STATS_TTL"])
    return metrics


def stats() -> dict[str, Any]:
    """Return this process's aggregated lock statistics and every background exporter's counts."""
    return {"groups": AGGREGATOR.snapshot(),
            "exporters": {s.kind: s.stats() for s in live_shippers() if not s._closed}}


def shutdown(timeout: float = 2.0) -> None:
    """Unsubscribe every exporter :func:`configure` set up, flush and close them (tests, exit)."""
    with _mutex:
        running = list(_exporters.values())
        _exporters.clear()
    events.unsubscribe(AGGREGATOR)
    PUBLISHER.stop(timeout)
    for exporter in running:
        events.unsubscribe(exporter)
        if isinstance(exporter, Shipper):
            exporter.close(timeout)
        elif hasattr(exporter, "close"):     # Prometheus: off its registry, so it can be built again
            exporter.close()


def _after_fork_in_child() -> None:
    global _mutex
    _mutex = threading.Lock()
    AGGREGATOR._after_fork()



_after_fork(_after_fork_in_child)   # os.fork() and forks made from C (uWSGI)
