"""Metrics from the plugins, end to end: a Django app (``YLOCK['METRICS']``) and a Flask app
(``YLOCK_METRICS``) serve locked views on a real Redis, and the points their exporters
write to a real InfluxDB v2 endpoint (VictoriaMetrics) read back with the right tags and
values."""
from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from flask import Flask

import ylock.metrics
from tests.helpers import collect
from tests.metrics.test_influxdb import by_name, influx
from ylock.testing.redis import RedisServer
from ylock.testing.victoriametrics import VictoriaMetrics


def check_series(victoria_metrics: VictoriaMetrics, group: str, app: str, seen: list[Any], name: str) -> None:
    """The views took write locks ``name`` twice and a read lock once: check what was written."""
    series = by_name(victoria_metrics.export(f'{{__name__=~"ylock_.*", group="{group}"}}', samples=9))
    for s in (x for xs in series.values() for x in xs):
        labels = s["metric"]
        assert (labels["group"], labels["name"], labels["engine"], labels["app"]) == (group, name, "redis", app)
    assert sum(sum(s["values"]) for s in series[("ylock_count", "acquired", "write")]) == 2
    assert sum(sum(s["values"]) for s in series[("ylock_count", "released", "write")]) == 2
    assert sum(sum(s["values"]) for s in series[("ylock_count", "acquired", "read")]) == 1
    holds = sorted(v for s in series[("ylock_hold", "released", "write")] for v in s["values"])
    expected = sorted(e.hold for e in seen if e.kind == "released" and e.mode == "write")
    assert len(expected) == 2 and holds == pytest.approx(expected, rel=1e-6)


def test_a_django_app_exports_its_views_locks(settings, redis_server: RedisServer,
                                              victoria_metrics: VictoriaMetrics, group: str) -> None:
    settings.YLOCK = {  # setting_changed rebuilds the registry and starts the exporter
        "ENGINES": {"default": {"URL": redis_server.url, "OPTIONS": {"prefix": "djm"}}},
        "LOCKS": {"accounts": {"GROUP": group}},
        "METRICS": {"INFLUXDB": influx(victoria_metrics.url, TAGS={"app": "django"})},
    }
    with collect() as seen:
        client = Client()
        assert client.post("/transfer/7/").status_code == 200
        assert client.post("/transfer/7/").status_code == 200
        assert client.get("/balance/7/").status_code == 200
    ylock.metrics.shutdown(timeout=10)          # flushes the batching writer
    check_series(victoria_metrics, group, "django", [e for e in seen if e.group == group], "7")


def test_a_flask_app_exports_its_views_locks(redis_server: RedisServer, victoria_metrics: VictoriaMetrics,
                                             group: str, tmp_path: Any) -> None:
    from flask_ylock import YLock

    app = Flask("metrics_app", instance_path=str(tmp_path))
    app.config.update(YLOCK_URL=redis_server.url, YLOCK_LOCKS={"accounts": {"GROUP": group}},
                      YLOCK_METRICS={"INFLUXDB": influx(victoria_metrics.url, TAGS={"app": "flask"})})
    ext = YLock(app)

    @app.post("/transfer/<int:account_id>")
    @ext.locked("accounts", key="account_id")
    def transfer(account_id: int) -> str:
        return "moved"

    @app.get("/balance/<int:account_id>")
    @ext.locked("accounts", key="account_id", mode="read")
    def balance(account_id: int) -> str:
        return "1"

    with collect() as seen:
        client = app.test_client()
        assert client.post("/transfer/9").status_code == 200
        assert client.post("/transfer/9").status_code == 200
        assert client.get("/balance/9").status_code == 200
    ylock.metrics.shutdown(timeout=10)
    check_series(victoria_metrics, group, "flask", [e for e in seen if e.group == group], "9")
