"""Write ylock/metrics/grafana/ylock-dashboard.json: the Grafana dashboard (InfluxDB 2,
Flux) over the points of :mod:`ylock.metrics.influxdb`. Run: python docs/make_dashboard.py"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "ylock" / "metrics" / "grafana" / "ylock-dashboard.json"

BASE = '''from(bucket: "${bucket}")
  |> range(start: v.timeRangeStart, stop: v.timeRangeStop)
  |> filter(fn: (r) => r._measurement == "${measurement}" and r._field == "%(field)s"%(outcome)s)
  |> filter(fn: (r) => contains(value: r.group, set: ${group:json}))
  |> group(columns: ["group"])'''


def flux(field: str, outcome: str | None, agg: str) -> str:
    where = f' and r.outcome == "{outcome}"' if outcome else ""
    return (BASE % {"field": field, "outcome": where}) + "\n  " + agg


def quantile(q: float) -> str:
    return ("|> aggregateWindow(every: v.windowPeriod, createEmpty: false, "
            f"fn: (column, tables=<-) => tables |> quantile(q: {q}, column: column))\n"
            f'  |> map(fn: (r) => ({{r with _field: "p{int(q * 100)}"}}))')


COUNT = '|> aggregateWindow(every: v.windowPeriod, fn: sum, createEmpty: false)'


def target(ref: str, query: str) -> dict[str, object]:
    return {"refId": ref, "datasource": {"type": "influxdb", "uid": "${datasource}"}, "query": query}


def panel(pid: int, title: str, targets: list[dict[str, object]], unit: str, x: int, y: int,
          kind: str = "timeseries", w: int = 12, h: int = 8, description: str = "") -> dict[str, object]:
    return {
        "id": pid, "type": kind, "title": title, "description": description,
        "datasource": {"type": "influxdb", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


panels = [
    panel(1, "Wait time to acquire, p50 / p90 / p99 per group",
          [target("A", flux("wait", "acquired", quantile(0.5))), target("B", flux("wait", "acquired", quantile(0.9))),
           target("C", flux("wait", "acquired", quantile(0.99)))], "s", 0, 0,
          description="Seconds from the lock call to the acquisition (field wait, outcome acquired)."),
    panel(2, "Hold time, p50 / p99 per group",
          [target("A", flux("hold", "released", quantile(0.5))), target("B", flux("hold", "released", quantile(0.99)))],
          "s", 12, 0, description="First acquire to final release (reentry does not cut it)."),
    panel(3, "Acquisitions per group", [target("A", flux("count", "acquired", COUNT))], "short", 0, 8),
    panel(4, "Timeouts per group", [target("A", flux("count", "timed_out", COUNT))], "short", 12, 8,
          description="Lock calls that gave up after their timeout (HTTP 423 in the plugins)."),
    panel(5, "Lost locks", [target("A", flux("count", "lost", COUNT))], "short", 0, 16, w=8,
          description="Holds whose lease could not be renewed: another owner may have had the lock."),
    panel(6, "Waiters evicted", [target("A", flux("count", "waiter_evicted", COUNT))], "short", 8, 16, w=8,
          description="Dead queue heads removed by another waiter."),
    panel(7, "Release call time, p99", [target("A", flux("release", "released", quantile(0.99)))], "s", 16, 16,
          w=8),
    panel(8, "Timeouts / acquisitions, whole range",
          [target("A", flux("count", "timed_out", "|> sum()")), target("B", flux("count", "acquired", "|> sum()"))],
          "short", 0, 24, kind="bargauge", w=24, h=6),
]

dashboard = {
    "__inputs": [{"name": "DS_INFLUXDB", "label": "InfluxDB (Flux)", "type": "datasource", "pluginId": "influxdb"}],
    "uid": "ylock-locks", "title": "ylock: distributed locks", "tags": ["ylock", "locks"],
    "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "label": "InfluxDB", "type": "datasource", "query": "influxdb"},
        {"name": "bucket", "label": "Bucket", "type": "textbox", "query": "locks",
         "current": {"text": "locks", "value": "locks"}},
        {"name": "measurement", "label": "Measurement", "type": "textbox", "query": "ylock",
         "current": {"text": "ylock", "value": "ylock"}},
        {"name": "group", "label": "Lock group", "type": "query", "multi": True, "includeAll": True,
         "datasource": {"type": "influxdb", "uid": "${datasource}"}, "refresh": 2,
         "query": 'import "influxdata/influxdb/schema"\n'
                  'schema.tagValues(bucket: "${bucket}", tag: "group", '
                  'predicate: (r) => r._measurement == "${measurement}", start: -30d)',
         "current": {"text": "All", "value": "$__all"}},
    ]},
    "panels": panels,
}

if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard, indent=2) + "\n")
    print(f"wrote {OUT}")
