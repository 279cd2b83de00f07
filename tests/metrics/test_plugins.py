"""Metrics from the plugins, end to end: a Django app (``YLOCK['METRICS']``) and a Flask app
(``YLOCK_METRICS``) serve locked views on a real Redis, and the points their exporters
write to a real InfluxDB v2 endpoint (VictoriaMetrics) read back with the right tags and
values."""
from __future__ import annotations

import warnings
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
    # keyed by account: one lock per account, labelled name="*" (bounded by default)
    check_series(victoria_metrics, group, "django", [e for e in seen if e.group == group], "*")


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
    check_series(victoria_metrics, group, "flask", [e for e in seen if e.group == group], "*")


def test_django_check_warns_about_labels_that_grow_without_bound(settings) -> None:
    """``manage.py check``: W007 for TAG_NAMES True, and for a listed group that USER_LOCK or a
    keyed ``@locked`` view takes one key at a time; nothing for the default or a fixed group."""
    from django.core import checks

    def warnings_for(metrics: dict[str, Any]) -> list[checks.CheckMessage]:
        settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}, "METRICS": metrics,
                          "USER_LOCK": {"LOCK": "visitors-w007", "PATHS": ["/api/"]}}   # no view keys it
        return [m for m in checks.run_checks(tags=["ylock"]) if m.id == "django_ylock.W007"]

    assert warnings_for({"PROMETHEUS": True}) == []
    assert warnings_for({"PROMETHEUS": True, "TAG_NAMES": ["regions-w005"]}) == []   # a group of few names
    [every] = warnings_for({"PROMETHEUS": True, "TAG_NAMES": True})
    assert every.level == checks.WARNING and "YLOCK['METRICS']['TAG_NAMES'] is True" in every.msg
    listed = warnings_for({"PROMETHEUS": True, "TAG_NAMES": ["visitors-w007", "accounts", "regions-w005"]})
    # tests/dj/views.py (the URLconf's): @locked("accounts", key="account_id"). The user lock's
    # family is this test's own: a decorator that another test of this process applied to a
    # family (ylock.web.KEYED is per process) would be named first for it.
    assert [m.msg.split(",")[0] for m in listed] == ["YLOCK['METRICS']['TAG_NAMES'] lists 'visitors-w007'",
                                                     "YLOCK['METRICS']['TAG_NAMES'] lists 'accounts'"]
    assert "USER_LOCK (one lock per user)" in listed[0].msg and "@locked('accounts', key=" in listed[1].msg
    assert all(m.hint and "few and fixed" in m.hint for m in [every, *listed])


def test_flask_warns_at_startup_about_labels_that_grow_without_bound(tmp_path: Any) -> None:
    from flask_ylock import YLock

    def start(metrics: dict[str, Any]) -> list[str]:
        ext = YLock()
        app = Flask("labels", instance_path=str(tmp_path))
        app.config.update(YLOCK_URL="local://", YLOCK_METRICS=metrics, YLOCK_USER_LOCK={"LOCK": "visitors"})

        @app.post("/orders/<int:order_id>")
        @ext.locked("orders", key="order_id")
        def order(order_id: int) -> str:
            return "ok"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ext.init_app(app)
        ylock.metrics.shutdown()
        return [str(w.message) for w in caught if w.category is ylock.metrics.UnboundedLabelsWarning]

    assert start({"PROMETHEUS": True}) == []
    [every] = start({"PROMETHEUS": True, "TAG_NAMES": True})
    assert every.startswith("YLOCK_METRICS['TAG_NAMES'] is True") and "few and fixed" in every
    listed = start({"PROMETHEUS": True, "TAG_NAMES": ["orders", "visitors", "regions-w005"]})
    assert [w.split(",")[0] for w in listed] == ["YLOCK_METRICS['TAG_NAMES'] lists 'orders'",
                                                 "YLOCK_METRICS['TAG_NAMES'] lists 'visitors'"]
