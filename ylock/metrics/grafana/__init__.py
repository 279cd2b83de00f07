"""ylock's Grafana dashboards, rendered from one description of the panels (:mod:`.panels`).

=====================================  ==========================================================
file                                   data source
=====================================  ==========================================================
``ylock-dashboard.json``               InfluxDB 2 (Flux), over :mod:`ylock.metrics.influxdb`'s points
``ylock-prometheus-dashboard.json``    Prometheus, VictoriaMetrics, Mimir (PromQL), over
                                       :mod:`ylock.metrics.prometheus`'s metrics
=====================================  ==========================================================

Both files ship in the package; ``python -m ylock.metrics.grafana`` writes them again
from :data:`.panels.PANELS` (``--check``: exit 1 if a committed file differs).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ylock.metrics.grafana.panels import FLUX, PANELS, PROMQL, Count, Measure, Panel, Quantile, Total

HERE = Path(__file__).resolve().parent
#: The file of each data source's dashboard, in this package.
FILES = {FLUX: HERE / "ylock-dashboard.json", PROMQL: HERE / "ylock-prometheus-dashboard.json"}

# -- Flux (InfluxDB 2) ---------------------------------------------------------------------------

_FLUX_BASE = '''from(bucket: "${bucket}")
  |> range(start: v.timeRangeStart, stop: v.timeRangeStop)
  |> filter(fn: (r) => r._measurement == "${measurement}" and r._field == "%(field)s"%(outcome)s)
  |> filter(fn: (r) => contains(value: r.group, set: ${group:json}))
  |> group(columns: ["group"])'''
_FLUX_WINDOW_SUM = "|> aggregateWindow(every: v.windowPeriod, fn: sum, createEmpty: false)"


def flux(measure: Measure) -> str:
    """Return the Flux query of ``measure`` (the points of one field and outcome, per group)."""
    if isinstance(measure, Quantile):
        field = measure.span
        agg = ("|> aggregateWindow(every: v.windowPeriod, createEmpty: false, "
               f"fn: (column, tables=<-) => tables |> quantile(q: {measure.q}, column: column))\n"
               f'  |> map(fn: (r) => ({{r with _field: "p{int(measure.q * 100)}"}}))')
    elif isinstance(measure, Count):
        field, agg = "count", _FLUX_WINDOW_SUM
    elif isinstance(measure, Total):
        field, agg = "count", "|> sum()"
    else:
        raise ValueError(f"{measure!r} is not in the InfluxDB points")
    where = f' and r.outcome == "{measure.outcome}"'
    return (_FLUX_BASE % {"field": field, "outcome": where}) + "\n  " + agg


# -- PromQL (Prometheus, VictoriaMetrics, Mimir) -------------------------------------------------

#: The histograms with an ``outcome`` label (hold and release are only ever of released locks).
_SPANS_WITH_OUTCOME = ("wait",)


def promql(measure: Measure) -> tuple[str, str, bool]:
    """Return the PromQL query of ``measure``, its legend and whether it is an instant query."""
    ns = "${namespace}"
    if isinstance(measure, Quantile):
        outcome = f', outcome="{measure.outcome}"' if measure.span in _SPANS_WITH_OUTCOME else ""
        return (f"histogram_quantile({measure.q}, sum by (group, le) (rate({ns}_{measure.span}_seconds_bucket"
                f'{{group=~"$group"{outcome}}}[$__rate_interval])))',
                f"{{{{group}}}} p{int(measure.q * 100)}", False)
    if isinstance(measure, Count):
        return (f'sum by (group) (increase({ns}_events_total{{group=~"$group", outcome="{measure.outcome}"}}'
                "[$__rate_interval]))", "{{group}}", False)
    if isinstance(measure, Total):
        return (f'sum by (group) (increase({ns}_events_total{{group=~"$group", outcome="{measure.outcome}"}}'
                "[$__range]))", f"{{{{group}}}} {measure.outcome}", True)
    if measure.what == "queued":
        return f"sum by (exporter) ({ns}_exporter_queued)", "{{exporter}} queued", False
    return (f"sum by (exporter) (increase({ns}_exporter_{measure.what}_total[$__rate_interval]))",
            f"{{{{exporter}}}} {measure.what}", False)


# -- dashboards ----------------------------------------------------------------------------------

_SOURCE = {FLUX: {"type": "influxdb", "uid": "${datasource}"}, PROMQL: {"type": "prometheus", "uid": "${datasource}"}}


def _target(backend: str, ref: str, measure: Measure) -> dict[str, Any]:
    if backend == FLUX:
        return {"refId": ref, "datasource": _SOURCE[FLUX], "query": flux(measure)}
    expr, legend, instant = promql(measure)
    return {"refId": ref, "datasource": _SOURCE[PROMQL], "expr": expr, "legendFormat": legend,
            "instant": instant, "range": not instant}


def _panel(backend: str, panel: Panel) -> dict[str, Any]:
    return {
        "id": panel.id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": _SOURCE[backend],
        "gridPos": {"x": panel.x, "y": panel.y, "w": panel.w, "h": panel.h},
        "fieldConfig": {"defaults": {"unit": panel.unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": [_target(backend, chr(ord("A") + i), m) for i, m in enumerate(panel.measures)],
    }


def _variables(backend: str) -> list[dict[str, Any]]:
    if backend == FLUX:
        return [
            {"name": "datasource", "label": "InfluxDB", "type": "datasource", "query": "influxdb"},
            {"name": "bucket", "label": "Bucket", "type": "textbox", "query": "locks",
             "current": {"text": "locks", "value": "locks"}},
            {"name": "measurement", "label": "Measurement", "type": "textbox", "query": "ylock",
             "current": {"text": "ylock", "value": "ylock"}},
            {"name": "group", "label": "Lock group", "type": "query", "multi": True, "includeAll": True,
             "datasource": _SOURCE[FLUX], "refresh": 2,
             "query": 'import "influxdata/influxdb/schema"\n'
                      'schema.tagValues(bucket: "${bucket}", tag: "group", '
                      'predicate: (r) => r._measurement == "${measurement}", start: -30d)',
             "current": {"text": "All", "value": "$__all"}},
        ]
    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
        {"name": "namespace", "label": "Namespace", "type": "textbox", "query": "ylock",
         "current": {"text": "ylock", "value": "ylock"},
         "description": "METRICS['PROMETHEUS']['NAMESPACE']: the metrics' name prefix"},
        {"name": "group", "label": "Lock group", "type": "query", "multi": True, "includeAll": True,
         "allValue": ".+", "datasource": _SOURCE[PROMQL], "refresh": 2,
         "definition": "label_values(${namespace}_events_total, group)",
         "query": {"query": "label_values(${namespace}_events_total, group)", "refId": "groups"},
         "current": {"text": "All", "value": "$__all"}},
    ]


def dashboard(backend: str) -> dict[str, Any]:
    """Return the Grafana dashboard (a JSON-able dict) of ``backend`` (``"flux"`` or ``"promql"``)."""
    if backend not in FILES:
        raise ValueError(f"backend must be one of {sorted(FILES)}, got {backend!r}")
    if backend == FLUX:
        head = {"__inputs": [{"name": "DS_INFLUXDB", "label": "InfluxDB (Flux)", "type": "datasource",
                              "pluginId": "influxdb"}],
                "uid": "ylock-locks", "title": "ylock: distributed locks"}
    else:
        head = {"__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                              "pluginId": "prometheus"}],
                "uid": "ylock-locks-prometheus", "title": "ylock: distributed locks (Prometheus)"}
    return {**head, "tags": ["ylock", "locks"], "schemaVersion": 39, "version": 1, "editable": True,
            "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": _variables(backend)},
            "panels": [_panel(backend, p) for p in PANELS if backend in p.backends]}


def render(backend: str) -> str:
    """Return the text of ``backend``'s dashboard file."""
    return json.dumps(dashboard(backend), indent=2) + "\n"


def write() -> list[Path]:
    """Write every dashboard file; return their paths."""
    for backend, path in FILES.items():
        path.write_text(render(backend), encoding="utf-8")
    return list(FILES.values())
