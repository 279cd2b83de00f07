"""The extension's life cycle: init_app per app, state per app, actionable errors,
configuration (URL, environment, embedded default, named locks), Prometheus endpoint."""
from __future__ import annotations

import pytest
from flask import Flask

import ylock
from flask_ylock import YLock


def test_forgetting_init_app_says_so() -> None:
    ext = YLock()
    app = Flask("forgot")
    with app.app_context(), pytest.raises(RuntimeError, match=r"did you forget to call `ylock.init_app\(app\)`"):
        ext.lock("orders")
    with pytest.raises(RuntimeError, match="needs an application context"):
        ext.lock("orders")


def test_init_app_twice_on_one_app_is_refused(make_app) -> None:
    app, ext = make_app()
    with pytest.raises(RuntimeError, match="already initialised"):
        ext.init_app(app)


def test_one_extension_serves_several_apps(make_app, group: str, tmp_path) -> None:
    ext = YLock()
    redis_app, _ = make_app(ext)
    local_app = Flask("local_app", instance_path=str(tmp_path / "other"))
    local_app.config.update(YLOCK_URL="local://", YLOCK_LOCKS={"accounts": {"GROUP": group, "LEASE": 7}})
    ext.init_app(local_app)
    assert redis_app.extensions["ylock"] is not local_app.extensions["ylock"]
    with redis_app.app_context():
        on_redis = ext.lock("accounts")
    with local_app.app_context():
        on_local = ext.lock("accounts")
        assert on_local.lease == 7.0
    assert on_redis.engine.scheme == "redis" and on_local.engine.scheme == "local"
    # Same group and name, different engines: the two apps' locks are independent.
    with on_redis.write(timeout=0):
        assert on_local.try_lock(0)
        on_local.unlock()


def test_named_locks_take_their_options(make_app, group: str) -> None:
    app, ext = make_app(YLOCK_LOCKS={"orders": {"GROUP": group, "NAME": "all", "FAIR": False, "LEASE": 12,
                                                "TIMEOUT": 3}})
    with app.app_context():
        lock = ext.lock("orders")
        assert (lock.group, lock.name, lock.fair, lock.lease, lock.timeout) == (group, "all", False, 12.0, 3.0)
        # A name that is not configured gets defaults: its group is its name.
        other = ext.locks("reports")
        assert other.group == "reports" and other.engine is lock.engine


def test_the_url_comes_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("YLOCK_URL", "local://")
    app = Flask("env_app", instance_path=str(tmp_path))
    ext = YLock(app)
    with app.app_context():
        assert ext.engine().scheme == "local"


def test_the_embedded_default_lives_in_the_instance_folder(monkeypatch, tmp_path, group: str) -> None:
    monkeypatch.delenv("YLOCK_URL", raising=False)
    app = Flask("embedded_app", instance_path=str(tmp_path / "instance"))
    ext = YLock(app)
    with app.app_context():
        engine = ext.engine()
        assert f"{tmp_path}/instance/ylock-redis.db" in engine.url_for_display()
        with ext.lock(group).write(timeout=5):
            assert [i.name for i in engine.describe(group)] == ["global"]
        engine.close()
    assert (tmp_path / "instance").is_dir()   # created for the database


def test_invalid_configuration_fails_at_init_app(tmp_path) -> None:
    app = Flask("bad", instance_path=str(tmp_path))
    app.config["YLOCK_URL"] = "mongodb://x"
    with pytest.raises(ylock.ConfigurationError, match="unknown engine URL scheme 'mongodb'"):
        YLock(app)
    app = Flask("bad2", instance_path=str(tmp_path))
    app.config.update(YLOCK_URL="local://", YLOCK_METRICS={"INFLUXDB": {"URL": "nope"}})
    with pytest.raises(ylock.ConfigurationError, match=r"YLOCK_METRICS\['INFLUXDB'\]\['URL'\]"):
        YLock(app)
    app = Flask("bad3", instance_path=str(tmp_path))
    app.config.update(YLOCK_URL="local://", YLOCK_USER_LOCK={"PATH": ["/"]})
    with pytest.raises(ylock.ConfigurationError, match=r"YLOCK_USER_LOCK has unknown key 'PATH'"):
        YLock(app)
    assert "ylock" not in app.extensions


def test_prometheus_metrics_are_served(make_app, group: str) -> None:
    import ylock.metrics

    app, ext = make_app(YLOCK_METRICS={"PROMETHEUS": {"PATH": "/metrics", "NAMESPACE": "flaskylock"}})
    try:
        @app.post("/pay/<int:account_id>")
        @ext.locked("accounts", key="account_id")
        def pay(account_id: int) -> str:
            return "paid"
        client = app.test_client()
        assert client.post("/pay/1").status_code == 200
        response = client.get("/metrics")
        assert response.status_code == 200 and response.mimetype == "text/plain"
        line = (f'flaskylock_events_total{{engine="redis",group="{group}",mode="write",name="*",'
                f'outcome="acquired"}} 1.0')        # keyed by account: name="*" unless opted in
        assert line in response.text and 'name="1"' not in response.text
    finally:
        ylock.metrics.shutdown()
