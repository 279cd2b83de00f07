"""Idempotency keys across processes: tests/idempotency/views.py served by ``gunicorn -w 3``
(a Django project with Django REST framework views, its records in a Redis cache; a Flask
app, its records on the lock engine's server), one Redis, key locks with a 2 s lease.

Each request that runs a view with ``{"park": true}`` parks at the test's gate (a socket,
tests/web/served.py) until the test lets it go, so the test knows which request runs the
view, in which process, and can kill or stop that process: no sleeps. Every view counts its
runs per key in Redis, so "ran once" is counted, not inferred; the undecorated view is the
control (the same burst runs it 20 times).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import ylock
from tests.deploy.helpers import ROOT, Served, clean_env, gunicorn, serving
from tests.idempotency.views import runs
from tests.web.test_limited import Gate
from ylock.idempotency import ANONYMOUS, record_id

pytestmark = pytest.mark.slow

LEASE = 2.0
PARK = {"park": True, "amount": 7}


@dataclass
class Site:
    """One plugin's views served by gunicorn -w 3."""

    name: str
    server: Served
    gate: Gate
    engine: ylock.Engine
    pool: concurrent.futures.ThreadPoolExecutor

    def post(self, path: str, key: str | None, body: Any = PARK) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return httpx.post(self.server.url + path, content=json.dumps(body), headers=headers, timeout=60)

    def send(self, path: str, key: str | None, body: Any = PARK) -> concurrent.futures.Future[httpx.Response]:
        return self.pool.submit(self.post, path, key, body)

    def key_lock(self, key: str) -> ylock.LockInfo | None:
        """The key's lock as another process sees it (None: free and unqueued)."""
        return self.engine.describe_lock("idempotency", record_id(ANONYMOUS, key))

    def wait_lock(self, key: str, held: bool, waiters: int = 0, timeout: float = 30.0) -> float:
        """Wait until the key's lock is held (with ``waiters`` queued) or free; return how long it took."""
        started = time.monotonic()
        while True:
            info = self.key_lock(key)
            if held and info is not None and info.owners and len(info.waiters) >= waiters:
                return time.monotonic() - started
            if not held and (info is None or not info.owners):
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, f"key lock of {key}: {info}"
            time.sleep(0.02)

    def forget(self, pid: int) -> None:
        """Drop the gate's record of a killed process's parked request."""
        with self.gate.changed:
            self.gate.parked = [p for p in self.gate.parked if p[1] != pid]


@pytest.fixture(scope="module", params=["django", "flask"])
def site(request: pytest.FixtureRequest, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[Site]:
    prefix = "idem" + uuid.uuid4().hex[:10]
    url = f"{redis_server.url}?prefix={prefix}"
    directory = tmp_path_factory.mktemp(request.param)
    gate = Gate()
    env = clean_env(YLOCK_TEST_URL=url, YLOCK_TEST_COUNTER=redis_server.url, YLOCK_TEST_PREFIX=prefix,
                    YLOCK_TEST_GATE=str(gate.port), YLOCK_TEST_INSTANCE=str(directory), PYTHONPATH=str(ROOT))
    if request.param == "flask":
        app = "tests.idempotency.views:create_flask_app()"
    else:
        app = "django.core.wsgi:get_wsgi_application()"
        env["DJANGO_SETTINGS_MODULE"] = "tests.idempotency.served_settings"
    # 3 workers of 24 threads: a burst of 20 fits in any one of them, however the kernel
    # spreads the connections; a stopped worker stays stopped for seconds, not a minute.
    argv = gunicorn(app, "-w", "3", "--threads", "24", "--timeout", "120")
    engine = ylock.engine_from_url(url)
    pool = concurrent.futures.ThreadPoolExecutor(48)
    os.environ["YLOCK_TEST_COUNTER"] = redis_server.url          # for runs() in this process
    try:
        with serving(request.param, argv, ROOT, env, Path(directory, "gunicorn.log")) as server:
            yield Site(request.param, server, gate, engine, pool)
    finally:
        gate.close()
        pool.shutdown(wait=True, cancel_futures=True)
        engine.close()


def view_name(site: Site, path: str) -> str:
    return path.strip("/").split("/")[0]


def test_concurrent_duplicates_run_the_view_once(site: Site) -> None:
    # Control: the undecorated view, 20 requests at once, runs 20 times (all in flight together).
    key = uuid.uuid4().hex
    control = [site.send("/plain/pay", key) for _ in range(20)]
    site.gate.wait_parked(f"plain/{key}", 20)
    site.gate.let_go(f"plain/{key}")
    assert [f.result(60).status_code for f in control] == [201] * 20
    assert runs("plain", key) == 20

    # timeout=0: while the first runs, 19 duplicates get 409 + Retry-After at once.
    key = uuid.uuid4().hex
    first = site.send("/fbv/pay", key)
    site.gate.wait_parked(f"fbv/{key}", 1)
    duplicates = [site.send("/fbv/pay", key) for _ in range(19)]
    answers = [f.result(60) for f in duplicates]
    assert [(a.status_code, a.headers["Retry-After"]) for a in answers] == [(409, "1")] * 19
    assert {a.json()["error"] for a in answers} == {"idempotency key in use"}
    site.gate.let_go(f"fbv/{key}")
    assert first.result(60).status_code == 201 and runs("fbv", key) == 1

    # timeout=60: 20 at once; 19 queue on the key's lock (in every worker) while the first
    # runs, then all get its response: one run, 20 identical bodies, 19 marked replayed.
    key = uuid.uuid4().hex
    burst = [site.send("/waiting/pay", key) for _ in range(20)]
    site.gate.wait_parked(f"waiting/{key}", 1)
    site.wait_lock(key, held=True, waiters=19)
    site.gate.let_go(f"waiting/{key}")
    got = [f.result(60) for f in burst]
    assert [r.status_code for r in got] == [201] * 20
    assert len({r.content for r in got}) == 1
    assert sorted(r.headers.get("Idempotent-Replayed", "no") for r in got) == ["no"] + ["true"] * 19
    assert runs("waiting", key) == 1


def paths(site: Site) -> list[str]:
    if site.name == "django":
        return ["/fbv/pay", "/cbv/pay", "/async/pay", "/drf/pay"]
    return ["/fbv/pay", "/async/pay"]


def test_replays_422_400_and_500(site: Site) -> None:
    body = {"amount": 12}
    for path in paths(site):
        view = view_name(site, path)
        key = uuid.uuid4().hex
        first = site.post(path, key, body)
        assert first.status_code == 201, (path, first.text)
        for _ in range(4):                  # the retries land on any of the 3 workers
            again = site.post(path, key, body)
            assert (again.status_code, again.content) == (201, first.content), path
            assert again.headers["Content-Type"] == first.headers["Content-Type"]
            assert again.headers["X-Payment-Run"] == "1" and again.headers["Idempotent-Replayed"] == "true"
            assert "set-cookie" not in again.headers
        assert runs(view, key) == 1, path

        reused = site.post(path, key, {"amount": 13})
        assert reused.status_code == 422 and reused.json()["error"] == "idempotency key reused", path
        missing = site.post(path, None, body)
        assert missing.status_code == 400 and missing.json()["error"] == "idempotency key missing", path
        assert site.post(path, "k" * 256, body).status_code == 400

        key = uuid.uuid4().hex
        assert site.post(path, key, {"fail": "first"}).status_code == 500
        retried = site.post(path, key, {"fail": "first"})
        assert retried.status_code == 201 and "Idempotent-Replayed" not in retried.headers, path
        assert site.post(path, key, {"fail": "first"}).content == retried.content
        assert runs(view, key) == 2, path


def kill_paths(site: Site) -> list[str]:
    return ["/fbv/pay", "/drf/pay"] if site.name == "django" else ["/fbv/pay"]


def test_a_killed_worker_frees_its_key_within_the_lease(site: Site) -> None:
    for path in kill_paths(site):
        view, key = view_name(site, path), uuid.uuid4().hex
        first = site.send(path, key)
        [pid] = site.gate.wait_parked(f"{view}/{key}", 1)
        held = site.key_lock(key)
        assert held is not None and held.ttl is not None and held.ttl <= LEASE
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        still = site.key_lock(key)          # nothing released it: it is free when its lease runs out
        assert still is not None and still.owners == held.owners
        site.forget(pid)
        site.wait_lock(key, held=False)
        freed = time.monotonic() - killed
        assert isinstance(first.exception(60), httpx.HTTPError)     # its client got no answer
        print(f"[idempotency] {site.name} {path}: key freed {freed:.2f}s after SIGKILL (lease {LEASE}s)")
        assert freed < 3 * LEASE + 1
        retry = site.send(path, key)
        [other] = site.gate.wait_parked(f"{view}/{key}", 1)
        site.gate.let_go(f"{view}/{key}")
        answer = retry.result(60)
        assert other != pid and answer.status_code == 201 and answer.json()["run"] == 2
        assert "Idempotent-Replayed" not in answer.headers and runs(view, key) == 2


def test_a_stopped_worker_does_not_overwrite_the_retrys_response(site: Site) -> None:
    for path in kill_paths(site):
        view, key = view_name(site, path), uuid.uuid4().hex
        stale = site.send(path, key)
        [pid] = site.gate.wait_parked(f"{view}/{key}", 1)
        os.kill(pid, signal.SIGSTOP)
        try:
            site.wait_lock(key, held=False)                     # its lease ran out
            retry = site.send(path, key)
            site.gate.wait_parked(f"{view}/{key}", 2)
            site.gate.let_go(f"{view}/{key}")                   # the retry's "go"; the stopped one's waits
            newer = retry.result(60)
            assert newer.status_code == 201 and newer.json()["run"] == 2
        finally:
            os.kill(pid, signal.SIGCONT)
        late = stale.result(60)
        # The fault happened: the stopped request ran its view to the end, after the retry.
        assert late.status_code == 201 and late.json()["run"] == 1 and late.json()["pid"] == pid
        assert late.json()["token"] < newer.json()["token"]        # the retry's hold is the newer one
        replay = site.post(path, key)
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == newer.content != late.content
        assert runs(view, key) == 2
        assert "was not stored: a newer holder" in site.server.output()
