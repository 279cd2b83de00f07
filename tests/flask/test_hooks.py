"""Per-user locking around requests (YLOCK_USER_LOCK): read for safe methods, write for
the others, path filters, Flask-Login users, release even when the view raises."""
from __future__ import annotations

import flask_login
from flask import Flask

from flask_ylock import YLock
from tests.flask.conftest import Gate
from tests.helpers import Runner


def add_views(app: Flask, gate: Gate) -> None:
    @app.route("/api/work", methods=["GET", "POST"])
    def work() -> str:
        gate.pass_through()
        return "done"

    @app.get("/api/quick")
    def quick() -> str:
        return "quick"

    @app.post("/api/fail")
    def fail() -> str:
        raise RuntimeError("boom")

    @app.post("/health")
    def health() -> str:
        return "ok"

    @app.post("/api/public/ping")
    def ping() -> str:
        return "pong"


def user_app(make_app, gate: Gate, **config) -> tuple[Flask, YLock]:
    app, ext = make_app(YLOCK_USER_LOCK={"LOCK": "users", "PATHS": ["/api/"], "EXCLUDE": ["/api/public/"],
                                         "TIMEOUT": 0.1}, **config)
    add_views(app, gate)
    return app, ext


def token(server, name: str) -> dict[str, str]:
    """The headers of an API client with its own token (no cookie); its first request gets
    no session cookie back: the per-user hook never writes the session."""
    headers = {"Authorization": f"Bearer {name}-7d1e"}
    status, answer, _ = server.request("GET", "/api/quick", headers)
    assert status == 200 and "Set-Cookie" not in answer, answer
    return headers


def test_a_user_writing_blocks_that_user_only(make_app, live, gate: Gate) -> None:
    app, _ = user_app(make_app, gate)
    server = live(app)
    alice, bob = token(server, "alice"), token(server, "bob")
    assert alice != bob
    writing = Runner(lambda: server.request("POST", "/api/work", alice))
    writing.start()
    assert gate.entered.wait(10)
    status, headers, _ = server.request("GET", "/api/quick", alice)
    assert status == 423 and headers["Retry-After"] == "1"
    assert server.request("GET", "/api/quick", bob)[0] == 200          # another user is not blocked
    assert server.request("POST", "/health", alice)[0] == 200          # outside PATHS
    assert server.request("POST", "/api/public/ping", alice)[0] == 200  # EXCLUDEd
    gate.leave.set()
    assert writing.outcome()[0] == 200
    assert server.request("POST", "/api/quick", alice)[0] in (200, 405)


def test_safe_requests_of_one_user_share_a_read_lock(make_app, live, gate: Gate) -> None:
    app, _ = user_app(make_app, gate)
    server = live(app)
    alice = token(server, "alice")
    reading = Runner(lambda: server.request("GET", "/api/work", alice))
    reading.start()
    assert gate.entered.wait(10)
    assert server.request("GET", "/api/quick", alice)[0] == 200         # read + read
    assert server.request("POST", "/api/fail", alice)[0] == 423         # write waits for the reader
    gate.leave.set()
    assert reading.outcome()[0] == 200


def test_the_user_lock_is_released_when_the_view_raises(make_app, gate: Gate, group: str) -> None:
    app, ext = user_app(make_app, gate)
    client = app.test_client()
    client.get("/api/quick")
    app.config["TESTING"] = False
    assert client.post("/api/fail").status_code == 500
    with app.app_context():
        users = ext.locks("users")
        assert list(users.engine.describe(users.group)) == []
    assert client.post("/api/fail").status_code == 500   # not 423: nothing was left held


def test_flask_login_users_are_locked_by_id(make_app, live, gate: Gate) -> None:
    app, ext = user_app(make_app, gate)
    manager = flask_login.LoginManager(app)

    class User(flask_login.UserMixin):
        def __init__(self, uid: str) -> None:
            self.id = uid

    manager.request_loader(lambda request: User(request.headers["X-User"]) if "X-User" in request.headers
                           else None)
    server = live(app)
    writing = Runner(lambda: server.request("POST", "/api/work", {"X-User": "42"}))
    writing.start()
    assert gate.entered.wait(10)
    with app.app_context():
        users = ext.locks("users")
        assert [(i.name, i.mode) for i in users.engine.describe(users.group)] == [("user-42", "write")]
    assert server.request("GET", "/api/quick", {"X-User": "42"})[0] == 423   # any session of user 42
    assert server.request("GET", "/api/quick", {"X-User": "7"})[0] == 200
    gate.leave.set()
    assert writing.outcome()[0] == 200
