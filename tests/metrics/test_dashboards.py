"""The Grafana dashboards (Flux and PromQL) against what the exporters really emit.

Both are rendered from one description of the panels; the committed files must be the
generator's output. Real lock activity on a real Redis (acquisitions, a timeout, reads, a
lost lease, an evicted dead waiter) goes through both exporters at once: the Prometheus
exposition is parsed with ``prometheus_client``'s parser and imported into a real
VictoriaMetrics, where every PromQL query of the dashboard must return series; the
InfluxDB points are written to the same server, and every measurement, field, tag and
outcome a Flux query names must be in what it stored."""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import ylock
import ylock.metrics
from tests.helpers import Runner, wait_until, waiters
from tests.metrics.test_influxdb import influx
from ylock.metrics import grafana
from ylock.metrics.grafana.panels import FLUX, PANELS, PROMQL
from ylock.metrics.influxdb import DEFAULTS as INFLUX_DEFAULTS
from ylock.testing.redis import RedisServer
from ylock.testing.victoriametrics import VictoriaMetrics

NAMESPACE = "ylockdash"      # not the Flux measurement's "ylock_" prefix: the two exports stay apart
SLOW = ylock.Polling.constant(1.5)   # the queued reader does not poll while the test evicts it


def committed(backend: str) -> dict[str, Any]:
    return json.loads(grafana.FILES[backend].read_text(encoding="utf-8"))


def test_the_committed_dashboards_are_the_generators_output() -> None:
    for backend, path in grafana.FILES.items():
        assert path.read_text(encoding="utf-8") == grafana.render(backend), \
            f"{path.name} is stale: run python -m ylock.metrics.grafana"


def test_both_dashboards_have_every_shared_panel() -> None:
    flux, prom = committed(FLUX), committed(PROMQL)
    shared = [p.title for p in PANELS if FLUX in p.backends and PROMQL in p.backends]
    assert len(shared) >= 8
    assert [p["title"] for p in flux["panels"]] == shared
    assert [p["title"] for p in prom["panels"] if p["title"] in shared] == shared
    for panels in (flux["panels"], prom["panels"]):
        assert all(p["targets"] for p in panels)


def activity(engine: ylock.Engine, redis_server: RedisServer, group: str) -> None:
    """Acquisitions (write and read), a timeout, a lost lease and an evicted dead waiter."""
    lock = ylock.Lock(engine, group, "global")
    with lock.write():
        contender = Runner(lambda: ylock.Lock(engine, group, "global").try_lock(0.02))
        contender.start()
        assert contender.outcome() is False
    with lock.read():
        pass
    ledger = ylock.Lock(engine, group, "ledger")
    ledger.lock(timeout=5)
    assert engine.force_release(group, "ledger")            # an operator's `ylock release`
    with pytest.raises(ylock.LockLost):
        ledger.unlock()
    # A queued reader "dies" (its liveness key goes): the writer's release evicts it.
    writer = ylock.Lock(engine, group, "queue")
    writer.lock()
    go = threading.Event()

    def reader() -> None:
        mine = ylock.Lock(engine, group, "queue", polling=SLOW)
        mine.rlock(timeout=10)
        go.wait(10)
        mine.runlock()
    runner = Runner(reader)
    runner.start()
    wait_until(lambda: len(waiters(engine, group, "queue")) == 1, what="the reader queued")
    owner = waiters(engine, group, "queue")[0].split(":", 1)[1]
    assert redis.Redis.from_url(redis_server.url).hdel(f"ylock:{{{group}:queue}}:w", owner) == 1   # as if it died
    writer.unlock()
    go.set()
    runner.outcome()


def import_prometheus(victoria_metrics: VictoriaMetrics, text: str, timestamp_ms: int) -> None:
    """Import a scrape into VictoriaMetrics as if taken at ``timestamp_ms``."""
    lines = [f"{line} {timestamp_ms}" for line in text.splitlines() if line and not line.startswith("#")]
    request = urllib.request.Request(f"{victoria_metrics.url}/api/v1/import/prometheus",
                                     data=("\n".join(lines) + "\n").encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def label_sets(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it has, from a text exposition (prometheus_client's parser)."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def check_names(expr: str, exported: dict[str, list[dict[str, str]]]) -> None:
    """Every metric, label and label value ``expr`` names is in the export."""
    names = re.findall(rf"\b({NAMESPACE}_\w+)", expr)
    assert names, expr
    for name in names:
        assert name in exported, f"{name} (in {expr}) is not exported: {sorted(exported)}"
    for name, matchers in re.findall(rf"\b({NAMESPACE}_\w+)\{{([^}}]*)\}}", expr):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
            assert any(label in labels for labels in exported[name]), f"{name} has no label {label}: {expr}"
            if op == "=":
                assert value in {labels.get(label) for labels in exported[name]}, f"{name}{{{label}={value!r}}}"
    for by in re.findall(r"by \(([^)]*)\)", expr):
        for label in (b.strip() for b in by.split(",")):
            assert any(label in labels for n in names for labels in exported[n]), f"no label {label}: {expr}"


def test_every_promql_query_returns_series_from_a_real_export(victoria_metrics: VictoriaMetrics,
                                                               redis_engine: ylock.Engine,
                                                               redis_server: RedisServer, group: str) -> None:
    metrics = ylock.metrics.configure({"PROMETHEUS": {"NAMESPACE": NAMESPACE},
                                       "INFLUXDB": influx(victoria_metrics.url)})
    now = int(time.time() * 1000)
    # Two scrapes a minute apart, both older than the server's 30 s search latency offset.
    activity(redis_engine, redis_server, group)
    import_prometheus(victoria_metrics, metrics.prometheus.expose()[0].decode(), now - 120_000)
    activity(redis_engine, redis_server, group)
    text = metrics.prometheus.expose()[0].decode()
    import_prometheus(victoria_metrics, text, now - 60_000)
    exported = label_sets(text)
    assert any(s.get("outcome") == "waiter_evicted" and s.get("group") == group
               for s in exported[f"{NAMESPACE}_events_total"])

    dashboard = committed(PROMQL)
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "group"]
    query = variable["query"]["query"].replace("${namespace}", NAMESPACE)
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
    assert match, query
    victoria_metrics.force_flush()      # imported rows are searchable once flushed
    values = json.loads(victoria_metrics.get(f"/api/v1/label/{match[2]}/values",
                                             {"match[]": match[1], "start": str(now // 1000 - 3600)}))
    assert group in values["data"]

    targets = [t for p in dashboard["panels"] for t in p["targets"]]
    assert len(targets) >= 12
    for target in targets:
        expr = target["expr"].replace("${namespace}", NAMESPACE)
        check_names(expr, exported)
        if "exporter" not in expr:     # the exporters' series are process-wide, not per group
            expr = expr.replace("$group", re.escape(group))
        series = victoria_metrics.query(expr.replace("$__rate_interval", "5m").replace("$__range", "1h"))
        assert series, f"no series for {target['expr']}"
        if "group" in expr:
            assert {s["metric"].get("group") for s in series} == {group}, series
        if "exporter" in expr:
            assert {s["metric"].get("exporter") for s in series} >= {"influxdb"}, series
    assert metrics.flush(10)


def test_every_flux_query_names_what_the_influxdb_points_hold(victoria_metrics: VictoriaMetrics,
                                                              redis_engine: ylock.Engine,
                                                              redis_server: RedisServer, group: str) -> None:
    metrics = ylock.metrics.configure({"INFLUXDB": influx(victoria_metrics.url)})
    activity(redis_engine, redis_server, group)
    assert metrics.flush(10)
    measurement = INFLUX_DEFAULTS["MEASUREMENT"]
    # VictoriaMetrics stores a line-protocol point as one series per field: <measurement>_<field>.
    series = victoria_metrics.export(f'{{__name__=~"{measurement}_.*", group="{group}"}}', samples=10)
    pairs = {(s["metric"]["__name__"][len(measurement) + 1:], s["metric"]["outcome"]) for s in series}
    tags = {key for s in series for key in s["metric"] if key != "__name__"}
    assert {outcome for _, outcome in pairs} >= {"acquired", "timed_out", "released", "lost", "waiter_evicted"}

    dashboard = committed(FLUX)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["measurement"]["current"]["value"] == measurement
    assert re.findall(r'tag: "(\w+)"', variables["group"]["query"]) == ["group"] and "group" in tags
    queries = [t["query"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 12
    for query in queries:
        assert 'r._measurement == "${measurement}"' in query
        [field] = re.findall(r'r\._field == "(\w+)"', query)
        for outcome in re.findall(r'r\.outcome == "(\w+)"', query) or [None]:
            assert any(f == field and (outcome is None or o == outcome) for f, o in pairs), \
                f"no {field} field on {outcome} points: {sorted(pairs)}"
        for tag in re.findall(r"\br\.(\w+)", query):
            assert tag in tags or tag in ("_measurement", "_field"), f"no tag {tag}: {sorted(tags)}"
        for columns in re.findall(r"group\(columns: \[([^\]]*)\]\)", query):
            for column in re.findall(r'"(\w+)"', columns):
                assert column in tags, column
