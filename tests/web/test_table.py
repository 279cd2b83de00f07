"""One table of request-level behaviour, run through both plugins: a Django project and a
Flask app with the same views must answer every request the same way (status, reason,
Retry-After, JSON body) and take the same locks (ylock.web is the one implementation):
423 for a busy lock, 429 for a request over its concurrency limit (@limited), 503 for an
engine that cannot be reached."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client
from flask import Flask, jsonify

import django_ylock
import ylock
from flask_ylock import YLock
from tests.helpers import Runner
from ylock.testing import free_port

LOCKS = {"accounts": {"TIMEOUT": 0.2}, "profiles": {"TIMEOUT": 0.2}, "reports": {"PERMITS": 1}}


class Plugin:
    """One plugin's app and how to call it."""

    name: str
    url: str

    def request(self, method: str, path: str, session: Any = None) -> tuple[int, str, dict[str, str], Any]:
        raise NotImplementedError

    def session(self) -> Any:
        raise NotImplementedError

    def client(self, token: str | None) -> Any:
        """A client that sends no cookie back and, given ``token``, ``Authorization: Token <token>``."""
        raise NotImplementedError

    def post(self, client: Any, path: str) -> tuple[int, list[str]]:
        """POST ``path``: the status and the ``Set-Cookie`` headers of the answer."""
        raise NotImplementedError

    def start_session(self, client: Any) -> dict[str, Any]:
        """Give ``client`` a session as the app would (a login, a cart); return its contents."""
        raise NotImplementedError


class DjangoPlugin(Plugin):
    name = "django"

    def __init__(self, settings: Any, url: str) -> None:
        self.url = url
        settings.ROOT_URLCONF = "tests.web.django_urls"
        settings.YLOCK = {"ENGINES": {"default": {"URL": url}}, "LOCKS": LOCKS}

    def session(self) -> Client:
        return Client()

    def client(self, token: str | None) -> Client:
        return Client(**({"HTTP_AUTHORIZATION": f"Token {token}"} if token else {}))

    def post(self, client: Any, path: str) -> tuple[int, list[str]]:
        response = client.post(path)
        client.cookies.clear()                  # an API client: it never sends a cookie back
        return response.status_code, [str(c) for c in response.cookies.values()]

    def start_session(self, client: Any) -> dict[str, Any]:
        # A server-side session (the cache backend here; the database's is Django's default):
        # its key is random, unlike a signed cookie's, whose key is its data.
        session = client.session
        session["cart"] = [7]
        session.save()
        return dict(client.session.items())

    def request(self, method: str, path: str, session: Any = None) -> tuple[int, str, dict[str, str], Any]:
        client = session or Client()
        response = client.generic(method, path)
        body = response.json() if response["Content-Type"] == "application/json" else response.content
        headers = {k: v for k, v in response.headers.items() if k == "Retry-After"}
        return response.status_code, response.reason_phrase, headers, body


class FlaskPlugin(Plugin):
    name = "flask"

    def __init__(self, url: str, tmp_path: Any) -> None:
        self.url = url
        app = Flask("table", instance_path=str(tmp_path))
        app.config.update(SECRET_KEY="table-secret", YLOCK_URL=url, YLOCK_LOCKS=LOCKS)
        ext = YLock(app)

        @app.post("/accounts/<account_id>/withdraw")
        @ext.locked("accounts", key="account_id")
        def withdraw(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.get("/accounts/<account_id>")
        @ext.locked("accounts", key="account_id", mode="read")
        def balance(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.post("/async/<account_id>")
        @ext.locked("accounts", key="account_id")
        async def async_withdraw(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.post("/files/<path:account_id>")
        @ext.locked("accounts", key="account_id")
        def files(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.post("/profile")
        @ext.locked("profiles")
        def profile() -> Any:
            return jsonify(ok=True)

        @app.post("/exports/<account_id>")
        @ext.limited("exports", permits=2, key="account_id")
        def export(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.post("/async-exports/<account_id>")
        @ext.limited("exports", permits=2, key="account_id")
        async def async_export(account_id: str) -> Any:
            return jsonify(ok=True)

        @app.get("/reports")
        @ext.limited("reports", key=False)          # PERMITS from the LOCKS setting
        def report() -> Any:
            return jsonify(ok=True)
        self.app = app

    def session(self) -> Any:
        return self.app.test_client()

    def client(self, token: str | None) -> Any:
        client = self.app.test_client(use_cookies=False)
        if token:
            client.environ_base["HTTP_AUTHORIZATION"] = f"Token {token}"
        return client

    def post(self, client: Any, path: str) -> tuple[int, list[str]]:
        response = client.post(path)
        return response.status_code, response.headers.getlist("Set-Cookie")

    def start_session(self, client: Any) -> dict[str, Any]:
        # Flask's cookie sessions have no id: what keys a visitor is the id an earlier
        # release of ylock kept there (a server-side session's sid would do too).
        with client.session_transaction() as session:
            session["_ylock_visitor"] = f"v-{id(client)}"
            session["cart"] = [7]
            return dict(session)

    def request(self, method: str, path: str, session: Any = None) -> tuple[int, str, dict[str, str], Any]:
        client = session or self.app.test_client()
        response = client.open(path, method=method)
        body = response.json if response.mimetype == "application/json" else response.data
        headers = {k: v for k, v in response.headers.items() if k == "Retry-After"}
        code, _, reason = response.status.partition(" ")
        return int(code), reason, headers, body


@pytest.fixture(params=["django", "flask"])
def plugin(request: pytest.FixtureRequest, settings: Any, redis_server: Any, group: str, tmp_path: Any) -> Plugin:
    url = f"{redis_server.url}?prefix={group}"      # each test and plugin on its own keys
    if request.param == "django":
        return DjangoPlugin(settings, url)
    return FlaskPlugin(url, tmp_path)


def holding(url: str, family: str, name: str, mode: str = "write") -> Iterator[None]:
    """Hold ``family/name`` in another thread for the duration of the block; mode
    ``"permits:N/M"``: N permits of the semaphore of M permits, each by an owner of its own."""
    engine = ylock.engine_from_url(url)
    if mode.startswith("permits:"):
        taken, permits = map(int, mode.partition(":")[2].split("/"))
        sem = ylock.Semaphore(engine, family, name, permits=permits)
        owners = [ylock.owner.new_owner() for _ in range(taken)]
        for owner in owners:
            assert ylock.run_as(owner, sem.try_acquire)
        try:
            yield
        finally:
            for owner in owners:
                ylock.run_as(owner, sem.release)
            engine.close()
        return
    lock = ylock.Lock(engine, family, name)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with (lock.write() if mode == "write" else lock.read()):
            held.set()
            done.wait(10)
    runner = Runner(hold)
    runner.start()
    assert held.wait(10)
    try:
        yield
    finally:
        done.set()
        runner.outcome()
        engine.close()


from contextlib import contextmanager  # noqa: E402

held = contextmanager(holding)

BUSY = {"error": "locked", "lock": "accounts/7", "retry_after": 1,
        "detail": "the write lock accounts/7 is busy; retry later"}
LIMITED = {"error": "limited", "lock": "exports/7", "retry_after": 1,
           "detail": "the 2 permits of exports/7 are all taken; retry later"}

# (held: family, name, mode or None), request (method, path), expected (status, reason, Retry-After, body or None)
TABLE: list[tuple[tuple[str, str, str] | None, tuple[str, str], tuple[int, str, str | None, Any]]] = [
    (None, ("POST", "/accounts/7/withdraw"), (200, "OK", None, {"ok": True})),
    (("accounts", "7", "write"), ("POST", "/accounts/7/withdraw"), (423, "Locked", "1", BUSY)),
    (("accounts", "7", "write"), ("POST", "/accounts/8/withdraw"), (200, "OK", None, {"ok": True})),
    (("accounts", "7", "write"), ("GET", "/accounts/7"), (423, "Locked", "1", {**BUSY, "detail":
                                                           "the read lock accounts/7 is busy; retry later"})),
    (("accounts", "7", "read"), ("GET", "/accounts/7"), (200, "OK", None, {"ok": True})),
    (("accounts", "7", "read"), ("POST", "/accounts/7/withdraw"), (423, "Locked", "1", BUSY)),
    (("accounts", "7", "write"), ("POST", "/async/7"), (423, "Locked", "1", BUSY)),
    # A URL value is escaped into a lock name: the path value "a/b" is the lock "a%2Fb".
    (("accounts", "a%2Fb", "write"), ("POST", "/files/a/b"), (423, "Locked", "1", {
        **BUSY, "lock": "accounts/a%2Fb", "detail": "the write lock accounts/a%2Fb is busy; retry later"})),
    (None, ("POST", "/files/a/{b}"), (200, "OK", None, {"ok": True})),
    # @limited: at most N requests per key at once; the others get 429 at once (timeout=0).
    (None, ("POST", "/exports/7"), (200, "OK", None, {"ok": True})),
    (("exports", "7", "permits:1/2"), ("POST", "/exports/7"), (200, "OK", None, {"ok": True})),
    (("exports", "7", "permits:2/2"), ("POST", "/exports/7"), (429, "Too Many Requests", "1", LIMITED)),
    (("exports", "7", "permits:2/2"), ("POST", "/exports/8"), (200, "OK", None, {"ok": True})),
    (("exports", "7", "permits:2/2"), ("POST", "/async-exports/7"), (429, "Too Many Requests", "1", LIMITED)),
    (("exports", "7", "permits:1/2"), ("POST", "/async-exports/7"), (200, "OK", None, {"ok": True})),
    (("exports", "7", "write"), ("POST", "/exports/7"), (200, "OK", None, {"ok": True})),   # a lock: unrelated
    (("reports", "global", "permits:1/1"), ("GET", "/reports"), (429, "Too Many Requests", "1", {
        "error": "limited", "lock": "reports/global", "retry_after": 1,
        "detail": "the permit of reports/global is taken; retry later"})),
    (None, ("GET", "/reports"), (200, "OK", None, {"ok": True})),
]


@pytest.mark.parametrize("hold, call, expected", TABLE)
def test_both_plugins_answer_alike(plugin: Plugin, hold: Any, call: tuple[str, str], expected: Any) -> None:
    if hold is None:
        got = plugin.request(*call)
    else:
        with held(plugin.url, *hold):
            got = plugin.request(*call)
    status, reason, retry, body = expected
    assert got[:2] == (status, reason)
    assert got[2] == ({"Retry-After": retry} if retry else {})
    assert got[3] == body


def test_an_unreachable_engine_answers_503_without_its_address(plugin: Plugin, settings: Any, tmp_path: Any) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?connect_timeout=0.2&socket_timeout=0.2"
    other = DjangoPlugin(settings, url) if plugin.name == "django" else FlaskPlugin(url, tmp_path)
    for path, lock in (("/accounts/7/withdraw", "accounts/7"), ("/exports/7", "exports/7"),
                       ("/async-exports/7", "exports/7")):
        status, reason, headers, body = other.request("POST", path)
        assert (status, reason, headers) == (503, "Service Unavailable", {"Retry-After": "5"})
        assert body == {"error": "lock engine unavailable", "lock": lock, "retry_after": 5,
                        "detail": "the lock service is unavailable; retry later"}
        assert str(port) not in str(body)


def test_api_clients_are_locked_by_a_hash_of_their_credential(plugin: Plugin) -> None:
    """A cookie-less client (curl, a token-authenticated app) is keyed by its Authorization
    header, hashed: one lock per token; an anonymous request with no credential and no
    session takes no lock. No answer sets a cookie: no session is created for it."""
    names: list[str] = []

    def seen(event: ylock.events.Event) -> None:
        if event.kind == "acquired" and event.group == "profiles":
            names.append(event.name)
    ylock.events.subscribe(seen)
    try:
        answers = [plugin.post(plugin.client(token), "/profile") for token in ("alice-9f2", "alice-9f2", "bob-41c",
                                                                               None)]
    finally:
        ylock.events.unsubscribe(seen)
    assert answers == [(200, [])] * 4                           # no Set-Cookie: no session made
    assert len(names) == 3 and names[0] == names[1] != names[2]   # one lock per token; none without one
    assert all(n.startswith("client-") and len(n) == len("client-") + 32 for n in names)
    assert not [n for n in names if "alice" in n or "bob" in n]     # the credential never shows


def test_a_visitor_with_a_session_is_locked_by_a_hash_of_it(plugin: Plugin, settings: Any) -> None:
    """A browser visitor whose session the app made (a login, a cart) keeps one lock for it;
    ylock reads the session, it never writes it."""
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cache"
    names: list[str] = []

    def seen(event: ylock.events.Event) -> None:
        if event.kind == "acquired" and event.group == "profiles":
            names.append(event.name)
    ylock.events.subscribe(seen)
    try:
        one, two = plugin.session(), plugin.session()
        contents = [plugin.start_session(session) for session in (one, two)]
        for session in (one, one, two):
            if plugin.name == "flask":
                assert plugin.post(session, "/profile") == (200, [])  # the session is not rewritten
            else:
                assert plugin.request("POST", "/profile", session)[0] == 200
    finally:
        ylock.events.unsubscribe(seen)
    assert len(names) == 3 and names[0] == names[1] != names[2]     # one lock per session
    if plugin.name == "django":
        assert dict(one.session.items()) == contents[0]              # read, not written
    assert all(n.startswith("session-") and len(n) == len("session-") + 32 for n in names)
    if plugin.name == "django":
        raw = one.cookies["sessionid"].value
        assert raw and all(raw not in n for n in names)         # the session cookie never shows


def test_a_name_that_can_never_be_a_lock_fails_when_decorated() -> None:
    with pytest.raises(ylock.ConfigurationError, match="shop/counter"):
        django_ylock.locked("shop/counter")
    with pytest.raises(ylock.ConfigurationError, match="shop/counter"):
        YLock().locked("shop/counter")
    with pytest.raises(ylock.ConfigurationError, match="cannot be a lock group"):
        YLock().locked("shop:counter")


def test_locked_views_build_one_lock_per_request_and_read_settings_once(plugin: Plugin,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from django_ylock import conf

    built: list[str] = []
    reads: list[int] = []
    original_init, original_checked, original_read = ylock.Lock.__init__, ylock.Lock._checked, conf._read

    def init(self: ylock.Lock, *args: Any, **kwargs: Any) -> None:
        built.append("init")
        original_init(self, *args, **kwargs)

    def checked(*args: Any) -> ylock.Lock:
        built.append("family")
        return original_checked(*args)

    def read() -> Any:
        reads.append(1)
        return original_read()
    monkeypatch.setattr(ylock.Lock, "__init__", init)
    monkeypatch.setattr(ylock.Lock, "_checked", staticmethod(checked))
    monkeypatch.setattr(conf, "_read", read)
    assert plugin.request("POST", "/accounts/1/withdraw")[0] == 200    # warm: settings read, family built
    built.clear()
    reads.clear()
    for account in range(20):
        assert plugin.request("POST", f"/accounts/{account}/withdraw")[0] == 200
    assert built == ["family"] * 20        # the one lock each request takes, nothing else
    assert reads == []                      # no settings read per request


def _unused(_: Callable[..., Any]) -> None:  # keep imports tidy for type checkers
    pass
