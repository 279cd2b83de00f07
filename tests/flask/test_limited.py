"""Flask: ``@ylock.limited`` and named semaphores, PERMITS in the config and init_app's
checks, the per-user hook with PERMITS, what the holds of a request and of ``flask ylock
run`` say. Real requests on a threaded server, on the session's redis-server."""
from __future__ import annotations

import json
import sys
import threading

import flask_login
import pytest
from flask import Flask

import ylock
from flask_ylock import YLock
from tests.helpers import Runner
from ylock.owner import new_owner


class Park:
    """Holds requests inside their views until the test lets them go; counts them in."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.inside = 0
        self.leave = threading.Event()

    def enter(self) -> None:
        with self.changed:
            self.inside += 1
            self.changed.notify_all()
        assert self.leave.wait(10), "the test never let the request go"

    def wait_inside(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.inside >= count, 10)


@pytest.fixture
def park() -> Park:
    gate = Park()
    yield gate
    gate.leave.set()


def exports_app(make_app, group: str, park: Park, **config) -> tuple[Flask, YLock]:
    config.setdefault("YLOCK_LOCKS", {"exports": {"GROUP": group, "PERMITS": 2}})
    app, ext = make_app(**config)

    @app.post("/exports/<tenant>")
    @ext.limited("exports", key="tenant")                  # PERMITS from YLOCK_LOCKS
    def export(tenant: str) -> dict[str, str]:
        park.enter()
        return {"exported": tenant}

    @app.post("/quick/<tenant>")
    @ext.limited("exports", key=lambda tenant: tenant.upper(), status=503, retry_after=9)
    def quick(tenant: str) -> str:                         # a callable key takes the view's arguments
        return "quick"

    @app.post("/async/<tenant>")
    @ext.limited("exports", key="tenant")
    async def export_async(tenant: str) -> str:
        return "async"
    return app, ext


def test_limited_lets_n_requests_per_key_in_and_answers_429(make_app, live, park: Park, group: str) -> None:
    app, ext = exports_app(make_app, group, park)
    server = live(app)
    inside = [Runner(lambda: server.request("POST", "/exports/a?token=s3cret")) for _ in range(2)]
    for runner in inside:
        runner.start()
    assert park.wait_inside(2)
    for path in ("/exports/a", "/async/a"):
        status, headers, body = server.request("POST", path)
        assert (status, headers["Retry-After"]) == (429, "1")
        assert json.loads(body) == {"error": "limited", "lock": f"{group}/a", "retry_after": 1,
                                    "detail": f"the 2 permits of {group}/a are all taken; retry later"}
    assert server.request("POST", "/async/b")[0] == 200               # another key
    with app.app_context():
        [info] = [i for i in ext.engine().describe(group) if i.owners]
    assert [c["what"] for c in info.context.values()] == ["POST /exports/a"] * 2     # no query string
    park.leave.set()
    assert [r.outcome()[0] for r in inside] == [200, 200]
    assert server.request("POST", "/async/a")[0] == 200               # given back


def test_limited_key_callable_status_and_retry_after(make_app, park: Park, group: str) -> None:
    app, ext = exports_app(make_app, group, park)
    with app.app_context():
        sem = ext.semaphores("exports")["Q"]
    owners = [new_owner() for _ in range(2)]
    for owner in owners:
        assert ylock.run_as(owner, sem.try_acquire)
    try:
        response = app.test_client().post("/quick/q")
        assert (response.status_code, response.headers["Retry-After"], response.json["lock"]) == \
            (503, "9", f"{group}/Q")
        assert app.test_client().post("/quick/r").status_code == 200
    finally:
        for owner in owners:
            ylock.run_as(owner, sem.release)
    assert app.test_client().post("/quick/q").status_code == 200


def test_limited_gives_the_permit_back_when_the_view_raises(make_app, group: str) -> None:
    app, ext = make_app(YLOCK_LOCKS={"exports": {"GROUP": group}})

    @app.post("/fail")
    @ext.limited("exports", permits=1, key=False)
    def fail() -> str:
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):     # TESTING: the view's exception reaches the test
        app.test_client().post("/fail")
    with app.app_context():
        sem = ext.semaphore("exports", permits=1)
        assert (sem.group, sem.name, sem.permits) == (group, "global", 1)
    assert sem.try_acquire()
    sem.release()


def test_named_semaphores_and_their_permits(make_app, group: str) -> None:
    app, ext = make_app(YLOCK_LOCKS={"exports": {"GROUP": group, "NAME": "all", "PERMITS": 3}})
    with app.app_context():
        assert (ext.semaphore("exports").permits, ext.semaphore("exports").name) == (3, "all")
        assert ext.semaphores("exports")["t"].permits == 3
        assert ext.semaphores("exports", permits=5)["t"].permits == 5
        # named as the app's config names it, also after init_app (the registry's own names)
        with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_LOCKS\['plain'\] needs PERMITS"):
            ext.semaphore("plain")


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_init_app_names_a_bad_permits(make_app, bad) -> None:
    with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_LOCKS\['exports'\]\['PERMITS'\] must be a whole "):
        make_app(YLOCK_LOCKS={"exports": {"PERMITS": bad}})
    with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_USER_LOCK\['PERMITS'\] must be a whole "):
        make_app(YLOCK_USER_LOCK={"PERMITS": bad})


def test_limited_without_permits_fails_in_init_app(make_app) -> None:
    ext = YLock()

    @ext.limited("exports")
    def export() -> str:
        return "no"
    with pytest.raises(ylock.ConfigurationError, match=r"@limited\('exports'\) needs permits=N, or PERMITS in "
                                                       r"YLOCK_LOCKS\['exports'\]"):
        make_app(ext)
    with pytest.raises(ylock.ConfigurationError, match="@limited permits must be a whole number"):
        ext.limited("exports", permits=0)
    with pytest.raises(ylock.ConfigurationError, match="cannot be a lock group"):
        ext.limited("shop:exports", permits=1)
    # Applied after init_app, in the app's context: checked at once.
    app, other = make_app(YLOCK_LOCKS={"exports": {"PERMITS": 2}})
    with app.app_context(), pytest.raises(ylock.ConfigurationError, match=r"YLOCK_LOCKS\['reports'\]"):
        other.limited("reports")


# -- the per-user hook with PERMITS --------------------------------------------------------------------


def user_app(make_app, park: Park, group: str, permits: int) -> tuple[Flask, YLock]:
    app, ext = make_app(YLOCK_LOCKS={"users": {"GROUP": group + "-users"}},
                        YLOCK_USER_LOCK={"LOCK": "users", "PATHS": ["/api/"], "TIMEOUT": 0.1, "PERMITS": permits})
    manager = flask_login.LoginManager(app)

    class User(flask_login.UserMixin):
        def __init__(self, uid: str) -> None:
            self.id = uid
    manager.request_loader(lambda request: User(request.headers["X-User"]) if "X-User" in request.headers else None)

    @app.route("/api/work", methods=["GET", "POST"])
    def work() -> str:
        park.enter()
        return "done"

    @app.route("/api/quick", methods=["GET", "POST"])
    def quick() -> str:
        return "quick"
    return app, ext


def test_user_permits_let_n_requests_of_a_user_in(make_app, live, park: Park, group: str) -> None:
    app, ext = user_app(make_app, park, group, permits=2)
    server = live(app)
    inside = [Runner(lambda m=m: server.request(m, "/api/work?id=9", {"X-User": "42"})) for m in ("GET", "POST")]
    for runner in inside:
        runner.start()
    assert park.wait_inside(2)                             # two of user 42's requests at once, any method
    status, headers, body = server.request("POST", "/api/quick", {"X-User": "42"})
    assert (status, headers["Retry-After"], json.loads(body)["error"]) == (429, "1", "limited")
    assert server.request("POST", "/api/quick", {"X-User": "7"})[0] == 200
    with app.app_context():
        [info] = [i for i in ext.engine().describe(group + "-users") if i.owners]
    assert (info.kind, info.name, len(info.owners)) == ("semaphore", "user-42", 2)
    assert sorted(c["what"] for c in info.context.values()) == ["GET /api/work", "POST /api/work"]
    park.leave.set()
    assert [r.outcome()[0] for r in inside] == [200, 200]
    assert server.request("POST", "/api/quick", {"X-User": "42"})[0] == 200


def test_user_permits_one_keeps_the_read_write_lock(make_app, park: Park, group: str) -> None:
    app, ext = user_app(make_app, park, group, permits=1)
    with app.app_context():
        lock = ext.locks("users")["user-42"]
    with ylock.owner_scope():
        with lock.read():
            client = app.test_client()
            assert client.get("/api/quick", headers={"X-User": "42"}).status_code == 200   # reads share
            assert client.post("/api/quick", headers={"X-User": "42"}).status_code == 423  # 423, not 429


# -- what the holds say ----------------------------------------------------------------------------------


def test_the_views_own_locks_and_flask_ylock_run_say_what_they_do(make_app, group: str, redis_server,
                                                                  tmp_path) -> None:
    app, ext = make_app(YLOCK_LOCKS={"accounts": {"GROUP": group}, "nightly": {"GROUP": group, "NAME": "report"}})

    @app.post("/own")
    @ext.locked("accounts", key=False)
    def own() -> str:
        with ext.locks("accounts")["inner"].write(timeout=1):
            infos = {i.name: i for i in ext.engine().describe(group)}
            return json.dumps([c["what"] for name in ("global", "inner") for c in infos[name].context.values()])
    assert json.loads(app.test_client().post("/own?secret=1").data) == ["POST /own", "POST /own"]

    script = ("import json, sys, ylock; e = ylock.engine_from_url(sys.argv[1]); "
              "[i] = [i for i in e.describe(sys.argv[2]) if i.name == 'report']; "
              "open(sys.argv[3], 'w').write(json.dumps([c['what'] for c in i.context.values()]))")
    ran = app.test_cli_runner().invoke(args=["ylock", "run", "nightly", "--", sys.executable, "-c", script,
                                             redis_server.url, group, str(tmp_path / "out"), "--password=x"])
    assert ran.exit_code == 0, ran.output
    assert json.loads((tmp_path / "out").read_text()) == [f"flask ylock run {sys.executable.rsplit('/', 1)[-1]}"]
