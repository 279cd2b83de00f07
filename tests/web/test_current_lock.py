"""A ``@locked`` view reaches the lock its request holds (issue #27): Django's
``django_ylock.current_lock(request, name=None)`` and Flask's ``flask_ylock.current_lock()``
return the held Lock (a Semaphore under ``@limited``), whose token is the one ``describe()``
shows, for every key kind (URL argument, callable, user), in sync and async views, in
class-based views, under the per-user middleware and nested decorators, on real Redis."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from flask import Flask, jsonify

import flask_ylock
import ylock
from flask_ylock import YLock
from ylock import web

LOCKS = {"accounts": {"TIMEOUT": 1}, "profiles": {"TIMEOUT": 1}, "users": {"TIMEOUT": 1}}


@pytest.fixture
def url(redis_server: Any, group: str) -> Iterator[str]:
    """This test's keys on the session's Redis; nothing may be left held afterwards."""
    url = f"{redis_server.url}?prefix={group}"
    yield url
    engine = ylock.engine_from_url(url)
    try:
        assert [i for i in engine.describe() if i.owners] == []
    finally:
        engine.close()


@pytest.fixture
def dj(settings: Any, url: str) -> Client:
    settings.ROOT_URLCONF = "tests.web.keys_urls"
    settings.YLOCK = {"ENGINES": {"default": {"URL": url}}, "LOCKS": LOCKS}
    return Client(HTTP_AUTHORIZATION="Token alice")    # an API client: no cookie, a token


def held_alone(body: dict[str, Any], group: str, name: str, kind: str = "Lock") -> None:
    """The request held ``group/name``, and its token is the one describe() shows."""
    assert (body["kind"], body["group"], body["name"], body["held"]) == (kind, group, name, True), body
    assert isinstance(body["token"], int) and body["token"] > 0
    if kind == "Lock":
        assert body["described"] == [body["token"]], body


@pytest.mark.parametrize("path", ["/s/7", "/a/7", "/cbv/7", "/acbv/7", "/c?k=7"])
def test_django_views_reach_the_requests_lock(dj: Client, path: str) -> None:
    first, second = dj.get(path), dj.get(path)
    assert (first.status_code, second.status_code) == (200, 200), first.content
    held_alone(first.json(), "accounts", "7")
    assert second.json()["token"] > first.json()["token"]       # a new hold, a new token


def test_django_user_key_and_limited_views_reach_theirs(dj: Client) -> None:
    body = dj.post("/u").json()
    held_alone(body, "profiles", body["name"])
    assert body["name"].startswith("client-") and "alice" not in body["name"]
    held_alone(dj.post("/l/7").json(), "exports", "7", kind="Semaphore")


def test_django_nested_decorators_and_the_user_lock_by_name(dj: Client, settings: Any) -> None:
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {"PATHS": ["/n/", "/api/"]}}
    body = dj.post("/n/7").json()
    assert body["inner"] == body["profiles"]                 # the innermost: the decorator next to the view
    held_alone(body["accounts"], "accounts", "7")
    held_alone(body["profiles"], "profiles", body["profiles"]["name"])
    held_alone(body["users"], "users", body["profiles"]["name"])     # the middleware's: the same user
    me = dj.get("/api/me").json()                            # the middleware's lock alone (read: GET)
    assert (me["kind"], me["group"], me["held"]) == ("Lock", "users", True) and me["name"].startswith("client-")


def test_django_a_request_holding_nothing_is_told_so(dj: Client) -> None:
    response = dj.get("/plain")
    assert response.status_code == 409
    assert "holds no lock" in response.json()["error"] and "@locked" in response.json()["error"]


def test_held_names_what_the_request_holds_when_asked_for_another() -> None:
    held = web.Held()
    lock = ylock.Lock(ylock.engine_from_url("local://"), "accounts", "7")
    with held.holding("accounts", lock):
        assert held.find() is held.find("accounts") is lock
        with pytest.raises(LookupError, match="holds no lock of 'orders'; it holds 'accounts'"):
            held.find("orders")
    with pytest.raises(LookupError, match="holds no lock"):
        held.find()


def flask_app(url: str, tmp_path: Any) -> Flask:
    app = Flask("current", instance_path=str(tmp_path))
    app.config.update(SECRET_KEY="current", TESTING=True, YLOCK_URL=url, YLOCK_LOCKS=LOCKS,
                      YLOCK_USER_LOCK={"PATHS": ["/n/", "/api/"]})
    ext = YLock(app)

    def holding(name: str | None = None) -> dict[str, Any]:
        lock = flask_ylock.current_lock(name)
        shown = [i.token for i in ext.engine().describe(lock.group) if i.name == lock.name and i.owners]
        return {"kind": type(lock).__name__, "group": lock.group, "name": lock.name, "token": lock.token,
                "described": shown, "held": lock.held()}

    @app.post("/s/<key>")
    @ext.locked("accounts", key="key")
    def sync_view(key: str) -> Any:
        return jsonify(holding())

    @app.post("/a/<key>")
    @ext.locked("accounts", key="key")
    async def async_view(key: str) -> Any:
        return jsonify(holding())

    @app.post("/c")
    @ext.locked("accounts", key=lambda **kwargs: "7")
    def callable_view() -> Any:
        return jsonify(holding())

    @app.post("/u")
    @ext.locked("profiles")
    def user_view() -> Any:
        return jsonify(holding())

    @app.post("/l/<key>")
    @ext.limited("exports", permits=2, key="key")
    def limited_view(key: str) -> Any:
        return jsonify(ext.current_lock() and holding())

    @app.post("/n/<key>")
    @ext.locked("accounts", key="key")
    def nested_view(key: str) -> Any:
        return jsonify(inner=holding(), user=holding("users"))

    @app.get("/plain")
    def plain_view() -> Any:
        try:
            flask_ylock.current_lock()
        except LookupError as exc:
            return jsonify(error=str(exc)), 409
        return jsonify(error=None)
    return app


@pytest.mark.parametrize("path", ["/s/7", "/a/7", "/c"])
def test_flask_views_reach_the_requests_lock(url: str, tmp_path: Any, path: str) -> None:
    client = flask_app(url, tmp_path).test_client()
    first, second = client.post(path).json, client.post(path).json
    held_alone(first, "accounts", "7")
    assert second["token"] > first["token"]


def test_flask_user_key_limited_nested_and_nothing_held(url: str, tmp_path: Any) -> None:
    client = flask_app(url, tmp_path).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = "Token alice"      # an API client: no cookie, a token
    body = client.post("/u").json
    held_alone(body, "profiles", body["name"])
    assert body["name"].startswith("client-") and "alice" not in body["name"]
    held_alone(client.post("/l/7").json, "exports", "7", kind="Semaphore")
    nested = client.post("/n/7").json
    held_alone(nested["inner"], "accounts", "7")
    held_alone(nested["user"], "users", nested["user"]["name"])  # the per-user hook's (write: POST)
    response = client.get("/plain")
    assert response.status_code == 409 and "holds no lock" in response.json["error"]


def test_typed_for_mypy_strict(tmp_path: Any) -> None:
    """``current_lock(request).token`` type-checks under ``mypy --strict`` in users' code."""
    from mypy import api

    source = tmp_path / "views.py"
    source.write_text(
        "from django.http import HttpRequest\n"
        "import django_ylock\nimport flask_ylock\n\n"
        "def django_token(request: HttpRequest) -> int | None:\n"
        "    return django_ylock.current_lock(request).token\n\n"
        "def flask_token() -> int | None:\n"
        "    return flask_ylock.current_lock('accounts').token\n")
    out, err, status = api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(source)])
    assert status == 0, out + err
