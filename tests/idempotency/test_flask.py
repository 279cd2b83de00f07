"""@ylock.idempotent in Flask through its test client, on a real Redis: the store it picks
(the app's Flask-Caching cache when it has one, else the engine's server), the defaults of
YLOCK_IDEMPOTENCY, bad settings and arguments named where they are made, users' keys kept
apart, and the pytest plugin's helpers."""
from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from flask import Flask
from flask_caching import Cache

import ylock
from flask_ylock import YLock
from tests.idempotency.views import create_flask_app, runs


def make_app(redis_server: Any, tmp_path: Any, cache: dict[str, Any] | None = None, **config: Any) -> Flask:
    url = f"{redis_server.url}?prefix=f{uuid.uuid4().hex[:8]}"
    app = create_flask_app(url, str(tmp_path), TESTING=True, **config)
    if cache is not None:
        Cache(app, config=cache)
    return app


def post(app: Flask, path: str, key: str | None, body: Any = None, **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    return app.test_client().post(path, data=json.dumps(body or {"amount": 3}), content_type="application/json",
                                  headers=headers)


@pytest.mark.parametrize("store", ["engine", "redis-cache", "simple-cache"])
@pytest.mark.parametrize("path", ["/fbv/pay", "/async/pay"])
def test_every_store_replays(redis_server: Any, tmp_path: Any, counter: str, store: str, path: str,
                             ylock_idempotency: Any) -> None:
    cache = {"engine": None, "simple-cache": {"CACHE_TYPE": "SimpleCache"},
             "redis-cache": {"CACHE_TYPE": "RedisCache", "CACHE_REDIS_URL": redis_server.url,
                             "CACHE_KEY_PREFIX": uuid.uuid4().hex[:6]}}[store]
    app = make_app(redis_server, tmp_path, cache)
    key = str(uuid.uuid4())
    first, replay = ylock_idempotency.assert_replays(lambda k: post(app, path, k), key)
    assert first.status_code == 201 and replay.headers["X-Payment-Run"] == "1"
    assert "Set-Cookie" in first.headers and "Set-Cookie" not in replay.headers
    view = path.split("/")[1]
    assert runs(view, key) == 1
    assert post(app, path, key, {"amount": 4}).status_code == 422
    assert post(app, path, None).json["error"] == "idempotency key missing"
    with ylock_idempotency.in_flight(uuid.uuid4().hex, app=app) as lock:
        assert lock.held()
    other = uuid.uuid4().hex
    with ylock_idempotency.in_flight(other, app=app):
        busy = post(app, path, other)
    assert busy.status_code == 409 and busy.headers["Retry-After"] == "1" and runs(view, other) == 0
    if store == "redis-cache":          # the records are in the cache's Redis, under its prefix
        assert any(b"ylock-idempotency:" in k for k in app.extensions["cache"][next(iter(
            app.extensions["cache"]))]._write_client.keys(f"{cache['CACHE_KEY_PREFIX']}*"))  # type: ignore[index]


def test_the_settings_give_the_defaults(redis_server: Any, tmp_path: Any, counter: str) -> None:
    app = make_app(redis_server, tmp_path, YLOCK_IDEMPOTENCY={"HEADER": "X-Request-Id", "REQUIRED": False})
    key = uuid.uuid4().hex
    assert post(app, "/fbv/pay", None).status_code == 201                   # not required: runs, unprotected
    first = post(app, "/fbv/pay", None, **{"X-Request-Id": key})
    again = post(app, "/fbv/pay", None, **{"X-Request-Id": key})
    assert first.data == again.data and again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("config, message", [
    ({"TTL": 0}, "YLOCK_IDEMPOTENCY['TTL'] must be a number of seconds >= 1"),
    ({"SCOPE": "team"}, "YLOCK_IDEMPOTENCY['SCOPE'] must be 'user', 'global' or a callable"),
    ({"HEADER": "Idempotency Key"}, "YLOCK_IDEMPOTENCY['HEADER'] must be an HTTP header name"),
    ({"CACHE": 3}, "YLOCK_IDEMPOTENCY['CACHE'] must be 'auto'"),
    ({"TIMEOUT": -1}, "YLOCK_IDEMPOTENCY['TIMEOUT'] must not be negative"),
    ({"LEASE": 0}, "YLOCK_IDEMPOTENCY['LEASE'] must be a number of seconds"),
    ({"LOCK": "a:b"}, "YLOCK_IDEMPOTENCY['LOCK'] 'a:b' cannot name a lock family"),
    ({"TLL": 5}, "YLOCK_IDEMPOTENCY has unknown key 'TLL'"),
])
def test_bad_settings_stop_init_app(tmp_path: Any, config: dict[str, Any], message: str) -> None:
    app = Flask("bad", instance_path=str(tmp_path))
    app.config.update(YLOCK_URL="local://", YLOCK_IDEMPOTENCY=config)
    with pytest.raises(ylock.ConfigurationError) as raised:
        YLock(app)
    assert message in str(raised.value)


@pytest.mark.parametrize("arguments, message", [
    ({"ttl": "1d"}, "@idempotent ttl must be a number of seconds"),
    ({"required": "yes"}, "@idempotent required must be True or False"),
    ({"scope": "team"}, "@idempotent scope must be 'user', 'global' or a callable"),
    ({"cache": 7}, "@idempotent cache must be 'auto'"),
    ({"timeout": float("nan")}, "@idempotent timeout must be None"),
])
def test_bad_arguments_fail_where_the_decorator_is_applied(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ylock.ConfigurationError) as raised:
        YLock().idempotent(**arguments)
    assert message in str(raised.value)


def test_a_cache_without_compare_and_set_is_refused(redis_server: Any, tmp_path: Any, counter: str) -> None:
    app = make_app(redis_server, tmp_path, {"CACHE_TYPE": "FileSystemCache", "CACHE_DIR": str(tmp_path / "c")})
    app.testing = False
    response = post(app, "/fbv/pay", uuid.uuid4().hex)
    assert response.status_code == 500
    with pytest.raises(ylock.ConfigurationError, match="FileSystemCache cannot keep idempotency records"):
        app.testing = True
        post(app, "/fbv/pay", uuid.uuid4().hex)


def test_users_keys_are_apart(redis_server: Any, tmp_path: Any, counter: str) -> None:
    from flask_login import LoginManager, UserMixin

    class User(UserMixin):
        def __init__(self, name: str) -> None:
            self.id = name

    app = make_app(redis_server, tmp_path)
    login = LoginManager(app)
    login.request_loader(lambda request: User(request.headers["X-User"]) if "X-User" in request.headers else None)
    key = uuid.uuid4().hex
    ann = post(app, "/fbv/pay", key, **{"X-User": "ann"})
    bob = post(app, "/fbv/pay", key, **{"X-User": "bob"})
    assert "Idempotent-Replayed" not in bob.headers and runs("fbv", key) == 2
    assert post(app, "/fbv/pay", key, **{"X-User": "ann"}).data == ann.data
