"""``@ylock.locked`` on real requests: contention answers 423 with Retry-After, an
unreachable engine 503, locks are released when the view raises, sync and async views."""
from __future__ import annotations

import json

from flask import Flask

from flask_ylock import YLock
from tests.flask.conftest import Gate
from tests.helpers import Runner, wait_until
from ylock import clients as ylock_clients
from ylock.testing import free_port


def add_views(app: Flask, ylock: YLock, gate: Gate) -> None:
    @app.post("/accounts/<int:account_id>/withdraw")
    @ylock.locked("accounts", key="account_id", timeout=0.2)
    def withdraw(account_id: int) -> dict[str, object]:
        gate.pass_through()
        return {"account": account_id, "token": ylock.locks("accounts").token(str(account_id))}

    @app.get("/accounts/<int:account_id>")
    @ylock.locked("accounts", key="account_id", mode="read", timeout=0.2)
    def balance(account_id: int) -> dict[str, object]:
        gate.pass_through()
        return {"account": account_id}

    @app.post("/async/<int:account_id>")
    @ylock.locked("accounts", key="account_id", timeout=0.2)
    async def withdraw_async(account_id: int) -> dict[str, object]:
        gate.pass_through()
        return {"account": account_id, "async": True}

    @app.post("/boom/<int:account_id>")
    @ylock.locked("accounts", key="account_id")
    def boom(account_id: int) -> str:
        raise RuntimeError("view failed")

    @app.post("/mine")
    @ylock.locked("accounts", key=lambda **kw: "global", timeout=0)
    def mine() -> str:
        return "ok"


def test_contention_answers_423_with_retry_after(make_app, live, gate: Gate) -> None:
    app, ylock = make_app()
    add_views(app, ylock, gate)
    server = live(app)
    first = Runner(lambda: server.request("POST", "/accounts/7/withdraw"))
    first.start()
    assert gate.entered.wait(10)
    status, headers, body = server.request("POST", "/accounts/7/withdraw")
    assert status == 423 and headers["Retry-After"] == "1"
    refusal = json.loads(body)
    lock = refusal["lock"]           # the test's "accounts" group, under its own per-test prefix
    assert lock.endswith("/7") and refusal == {"error": "locked", "lock": lock, "retry_after": 1,   # as Django's
                                               "detail": f"the write lock {lock} is busy; retry later"}
    # Readers of account 7 wait for the writer too:
    assert server.request("GET", "/accounts/7")[0] == 423
    gate.leave.set()
    status, _, body = first.outcome()
    assert status == 200 and isinstance(json.loads(body)["token"], int)
    assert server.request("POST", "/accounts/7/withdraw")[0] == 200


def test_readers_share_the_lock(make_app, live, gate: Gate) -> None:
    app, ylock = make_app()
    add_views(app, ylock, gate)
    server = live(app)
    first = Runner(lambda: server.request("GET", "/accounts/3"))
    first.start()
    assert gate.entered.wait(10)
    second = Runner(lambda: server.request("GET", "/accounts/3"))
    second.start()
    # The second reader got in while the first still holds: both are inside the view.
    wait_until(lambda: len(list(ylock_holders(app, ylock, "3"))) == 2, what="two readers holding")
    assert server.request("POST", "/accounts/3/withdraw")[0] == 423
    gate.leave.set()
    assert first.outcome()[0] == 200 and second.outcome()[0] == 200


def ylock_holders(app: Flask, ylock: YLock, name: str) -> tuple[str, ...]:
    with app.app_context():
        family = ylock.locks("accounts")
        for info in family.engine.describe(family.group):
            if info.name == name:
                return info.owners
    return ()


def test_async_views_are_locked_too(make_app, live, gate: Gate) -> None:
    app, ylock = make_app()
    add_views(app, ylock, gate)
    server = live(app)
    first = Runner(lambda: server.request("POST", "/async/5"))
    first.start()
    assert gate.entered.wait(10)
    assert server.request("POST", "/async/5")[0] == 423
    assert server.request("POST", "/accounts/5/withdraw")[0] == 423   # same lock as the sync view
    gate.leave.set()
    status, _, body = first.outcome()
    assert status == 200 and json.loads(body)["async"] is True
    assert ylock_holders(app, ylock, "5") == ()


def test_the_lock_is_released_when_the_view_raises(make_app) -> None:
    app, ylock = make_app()
    add_views(app, ylock, Gate())
    client = app.test_client()
    app.config["TESTING"] = False   # let the exception become a 500 instead of propagating
    assert client.post("/boom/9").status_code == 500
    assert ylock_holders(app, ylock, "9") == ()
    assert client.post("/mine").status_code == 200


def test_an_unreachable_engine_answers_503(make_app) -> None:
    app, ylock = make_app(YLOCK_URL=f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5&connect_timeout=0.5")
    add_views(app, ylock, Gate())
    response = app.test_client().post("/mine")
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert response.json["error"] == "lock engine unavailable"


def test_the_key_defaults_to_who_sent_the_request(make_app, gate: Gate) -> None:
    """key=None: a client's Authorization credential, hashed (no session is written); a
    request with no credential and no session takes no lock; YLOCK_CLIENT_KEY replaces the
    credential (here an API key header), and False turns it off."""
    app, ylock = make_app()

    @app.post("/profile")
    @ylock.locked("users", timeout=0)
    def profile() -> dict[str, object]:
        return {"holders": [i.name for i in ylock.locks("users").engine.describe(ylock.locks("users").group)]}

    alice, bob, nobody = (app.test_client(use_cookies=False) for _ in range(3))
    alice.environ_base["HTTP_AUTHORIZATION"] = "Bearer alice-secret"
    bob.environ_base["HTTP_AUTHORIZATION"] = "Bearer bob-secret"
    answer = alice.post("/profile")
    first = answer.json["holders"]
    assert len(first) == 1 and first[0].startswith("client-") and "alice" not in first[0]
    assert "Set-Cookie" not in answer.headers                         # no session made for it
    assert alice.post("/profile").json["holders"] == first          # same token, same lock
    assert bob.post("/profile").json["holders"] not in ([], first)   # another token, another lock
    assert nobody.post("/profile").json["holders"] == []             # nothing identifies it: no lock

    keyed_app, keyed = make_app(YLOCK_CLIENT_KEY=ylock_clients.header("X-Api-Key"))

    @keyed_app.post("/profile")
    @keyed.locked("users", timeout=0)
    def keyed_profile() -> dict[str, object]:
        return {"holders": [i.name for i in keyed.locks("users").engine.describe(keyed.locks("users").group)]}

    client = keyed_app.test_client(use_cookies=False)
    by_key = client.post("/profile", headers={"X-Api-Key": "k-1"}).json["holders"]
    assert len(by_key) == 1 and by_key[0].startswith("client-")
    assert client.post("/profile", headers={"Authorization": "Bearer alice-secret"}).json["holders"] == []


def test_retry_after_can_be_configured(make_app) -> None:
    app, ylock = make_app(YLOCK_RETRY_AFTER=7)
    add_views(app, ylock, Gate())
    with app.app_context():
        held = ylock.locks("accounts")["global"]
    with held.write(timeout=5):   # held by this thread: the request must come from another one
        request = Runner(lambda: app.test_client().post("/mine"))
        request.start()
        response = request.outcome()
    assert response.status_code == 423 and response.headers["Retry-After"] == "7"
    assert response.json == {"error": "locked", "lock": f"{held.group}/global", "retry_after": 7,
                             "detail": f"the write lock {held.group}/global is busy; retry later"}
