"""The README's per-user middleware for API clients, served by gunicorn with several workers
on a real Redis, hit over HTTP by cookie-less clients (as curl or a token-authenticated app
is): a client is its ``Authorization`` credential. Two concurrent requests with one token
are serialised (the second queues for the token's lock while the first runs, and enters
only after the first has left), two with different tokens run at once, and no request
creates a session: ``django_session`` stays empty and no answer sets a cookie.

Which requests run at once is read from events, not timed: the gate view
(templates/django/counter.py) writes a file on entry and waits for the test's file to
leave; a queued request is seen in the lock's waiter queue (``engine.describe()``)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import ylock
from tests.deploy.helpers import clean_env, django_project, gunicorn, serving
from tests.helpers import Runner, wait_until
from ylock.clients import client_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: The settings a test appends (the README's USER_LOCK waits 5 s: a loaded machine may take
#: longer than that to let the first request go, and the queued one must not give up).
WAIT_LONGER = '\nYLOCK["USER_LOCK"]["TIMEOUT"] = 120\n'


def post(url: str, n: str, token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Token {token}"} if token else {}
    response = httpx.post(f"{url}/api/gate", params={"n": n}, headers=headers, timeout=180)
    assert response.status_code == 200, response.text[:500]
    return {**response.json(), "set_cookie": response.headers.get_list("set-cookie")}


def test_api_clients_are_serialised_per_token_and_never_get_a_session(tmp_path: Path, redis_url: str) -> None:
    site = django_project(tmp_path / "site")
    with (site / "mysite" / "settings.py").open("a", encoding="utf-8") as fh:
        fh.write(WAIT_LONGER)
    gates = tmp_path / "gates"
    gates.mkdir()
    env = clean_env(YLOCK_URL=redis_url, COUNTER_FILE=str(tmp_path / "counter.txt"), GATE_DIR=str(gates))
    migrated = subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=site, env=env,
                              capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    secret = subprocess.run([sys.executable, "-c", "from mysite import settings; print(settings.SECRET_KEY)"],
                            cwd=site, env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    alice = client_name("Token alice-5f1d", secret)           # the lock name of alice's token
    engine = ylock.engine_from_url(redis_url)

    def entered(n: str) -> bool:
        return (gates / f"{n}.entered").exists()

    def let_go(n: str) -> None:
        (gates / f"{n}.go").touch()

    def queued_for_alice() -> int:
        info = engine.describe_lock("users", alice)
        return len(info.waiters) if info is not None else 0

    argv = gunicorn("mysite.wsgi", "--workers", "4")
    try:
        with serving("gunicorn api clients", argv, site, env, tmp_path / "gunicorn.log") as server:
            first = Runner(lambda: post(server.url, "a1", "alice-5f1d"))
            first.start()
            wait_until(lambda: entered("a1"), timeout=120, what="alice's first request runs")
            second = Runner(lambda: post(server.url, "a2", "alice-5f1d"))
            second.start()
            # alice's second request waits in the queue of alice's lock, behind the first
            wait_until(lambda: queued_for_alice() == 1, timeout=120, what="alice's second request queues")
            assert not entered("a2")
            bob = Runner(lambda: post(server.url, "b1", "bob-0c27"))
            bob.start()
            wait_until(lambda: entered("b1"), timeout=120, what="bob's request runs beside alice's")
            assert entered("a1") and not entered("a2") and queued_for_alice() == 1
            anonymous = Runner(lambda: post(server.url, "n1", None))
            anonymous.start()
            wait_until(lambda: entered("n1"), timeout=120, what="an anonymous request runs (no lock)")
            for n in ("b1", "n1", "a1"):
                let_go(n)
            wait_until(lambda: entered("a2"), timeout=120, what="alice's second request runs once the first left")
            let_go("a2")
            a1, a2, b1, n1 = (r.outcome() for r in (first, second, bob, anonymous))
    finally:
        engine.close()

    assert a1["lock"] == a2["lock"] == f"users/{alice}" and "alice" not in a1["lock"]
    assert b1["lock"].startswith("users/client-") and b1["lock"] != a1["lock"]
    assert n1["lock"] is None and n1["token"] is None              # nothing identifies it: no lock
    assert a1["left"] <= a2["entered"], (a1, a2)                   # one token: one after the other
    assert b1["entered"] < a1["left"], (a1, b1)                    # two tokens: at the same time
    assert a2["token"] > a1["token"]                               # fencing tokens of two holds
    assert len({a1["pid"], a2["pid"], b1["pid"], n1["pid"]}) == 4   # four workers served them
    assert [r["set_cookie"] for r in (a1, a2, b1, n1)] == [[], [], [], []]
    with sqlite3.connect(site / "db.sqlite3") as db:
        assert db.execute("select count(*) from django_session").fetchone() == (0,)
