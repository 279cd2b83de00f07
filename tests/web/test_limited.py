"""@limited across processes: the same Flask app and Django project (tests/web/served*.py)
served by two gunicorn servers of one worker process each, on one Redis. Each request that
gets in parks at the test's gate (a socket) until the test lets it go, so the test knows
at every moment which requests are in flight, and in which process: never more than the
permits per key, whichever process serves them; the next one gets 429 with Retry-After at
once; other keys are not held up; a permit given back in one process lets a request of
the other in. Another process (the test) sees in ``engine.describe()`` what each holder
is doing: the request's method and path, never its query string."""
from __future__ import annotations

import collections
import concurrent.futures
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import ylock
from tests.deploy.helpers import ROOT, Served, clean_env, gunicorn, serving

pytestmark = pytest.mark.slow

LIMITED = {"error": "limited", "lock": "exports/{key}", "retry_after": 1,
           "detail": "the 2 permits of exports/{key} are all taken; retry later"}


class Gate:
    """The test's end of :func:`tests.web.served.park`: which requests are in flight (by
    key, with the pid of the process serving them), and letting them go."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.parked: list[tuple[str, int, socket.socket]] = []
        self.peak: collections.Counter[str] = collections.Counter()
        self.changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return                          # closed
            conn.settimeout(10)
            key, pid = conn.makefile("r").readline().split()
            with self.changed:
                self.parked.append((key, int(pid), conn))
                self.peak[key] = max(self.peak[key], len(self.pids(key)))
                self.changed.notify_all()

    def pids(self, key: str) -> list[int]:
        """The processes of the requests in flight for ``key``."""
        return [pid for k, pid, _ in self.parked if k == key]

    def wait_parked(self, key: str, count: int, timeout: float = 30.0) -> list[int]:
        """Wait until ``count`` requests for ``key`` are in flight; return their pids."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.pids(key)) >= count, timeout), \
                f"{count} requests for {key} never got in: {self.parked}"
            return self.pids(key)

    def let_go(self, key: str) -> None:
        """Let every request in flight for ``key`` return."""
        with self.changed:
            mine = [p for p in self.parked if p[0] == key]
            self.parked = [p for p in self.parked if p[0] != key]
        for _, _, conn in mine:
            conn.sendall(b"go")
            conn.close()

    def close(self) -> None:
        for key in {k for k, _, _ in self.parked}:
            self.let_go(key)
        self.listener.close()


@dataclass
class Site:
    """One plugin's app served by two gunicorn servers (one worker process each)."""

    servers: list[Served]
    gate: Gate
    engine: ylock.Engine
    pool: concurrent.futures.ThreadPoolExecutor

    def post(self, server: int, path: str) -> tuple[int, str | None, Any]:
        response = httpx.post(self.servers[server].url + path, timeout=30)
        return response.status_code, response.headers.get("Retry-After"), response.json()

    def send(self, server: int, path: str) -> concurrent.futures.Future[tuple[int, str | None, Any]]:
        return self.pool.submit(self.post, server, path)


@pytest.fixture(scope="module", params=["flask", "django"])
def site(request: pytest.FixtureRequest, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[Site]:
    url = f"{redis_server.url}?prefix=limited{uuid.uuid4().hex[:10]}"
    directory = tmp_path_factory.mktemp(request.param)
    gate = Gate()
    env = clean_env(YLOCK_TEST_URL=url, YLOCK_TEST_GATE=str(gate.port), YLOCK_TEST_INSTANCE=str(directory),
                    PYTHONPATH=str(ROOT))
    if request.param == "flask":
        app = "tests.web.served:create_flask_app()"
    else:
        app = "django.core.wsgi:get_wsgi_application()"
        env["DJANGO_SETTINGS_MODULE"] = "tests.web.served_settings"
    argv = gunicorn(app, "-w", "1", "--threads", "6")
    engine = ylock.engine_from_url(url)
    pool = concurrent.futures.ThreadPoolExecutor(16)
    try:
        with serving(f"{request.param}-a", argv, ROOT, env, Path(directory, "a.log")) as a, \
                serving(f"{request.param}-b", argv, ROOT, env, Path(directory, "b.log")) as b:
            yield Site([a, b], gate, engine, pool)
    finally:
        gate.close()
        pool.shutdown(wait=True, cancel_futures=True)
        engine.close()


def test_never_more_than_the_permits_in_flight_per_key_across_processes(site: Site) -> None:
    key = "t" + uuid.uuid4().hex[:6]
    first = site.send(0, f"/exports/{key}?token=s3cret")
    site.gate.wait_parked(f"exports/{key}", 1)
    second = site.send(1, f"/exports/{key}?token=s3cret")
    pids = site.gate.wait_parked(f"exports/{key}", 2)
    assert len(set(pids)) == 2                          # one permit held in each process
    for server in (0, 1, 0, 1):                         # the next ones, in either process: 429 at once
        status, retry, body = site.post(server, f"/exports/{key}")
        assert (status, retry) == (429, "1")
        assert body == {k: v.format(key=key) if isinstance(v, str) else v for k, v in LIMITED.items()}
    other = site.send(1, f"/exports/{key}x")            # another key is not held up
    site.gate.wait_parked(f"exports/{key}x", 1)

    # Another process sees who holds the permits, and what they are doing.
    [info] = [i for i in site.engine.describe("exports") if i.name == key]
    assert (info.kind, info.permits, len(info.owners)) == ("semaphore", 2, 2)
    assert sorted(c["pid"] for c in info.context.values()) == sorted(pids)
    assert [c["what"] for c in info.context.values()] == [f"POST /exports/{key}"] * 2
    assert "s3cret" not in json.dumps(info.as_dict())   # never the query string

    site.gate.let_go(f"exports/{key}")
    assert first.result(30)[0] == second.result(30)[0] == 200
    site.gate.let_go(f"exports/{key}x")
    assert other.result(30)[:1] == (200,)
    assert site.gate.peak[f"exports/{key}"] == 2

    # Given back: two requests get in again, one per process.
    again = [site.send(server, f"/exports/{key}") for server in (1, 0)]
    site.gate.wait_parked(f"exports/{key}", 2)
    site.gate.let_go(f"exports/{key}")
    assert [f.result(30)[0] for f in again] == [200, 200]
    assert not [i for i in site.engine.describe("exports") if i.owners]


def test_a_burst_at_once_lets_exactly_the_permits_in(site: Site) -> None:
    key = "t" + uuid.uuid4().hex[:6]
    burst = [site.send(server, f"/exports/{key}") for server in (0, 1) * 5]
    answered = []
    for future in concurrent.futures.as_completed(burst, timeout=30):
        answered.append(future.result())
        if len(answered) == 8:
            break                                       # the 2 that got in are parked
    assert sorted(a[:2] for a in answered) == [(429, "1")] * 8
    assert len(site.gate.wait_parked(f"exports/{key}", 2)) == 2
    site.gate.let_go(f"exports/{key}")
    assert sorted(f.result(30)[0] for f in burst) == [200] * 2 + [429] * 8
    assert site.gate.peak[f"exports/{key}"] == 2


def test_another_process_sees_what_a_locked_request_is_doing(site: Site) -> None:
    key = "t" + uuid.uuid4().hex[:6]
    held = site.send(0, f"/accounts/{key}?token=s3cret&user=alice")
    [pid] = site.gate.wait_parked(f"accounts/{key}", 1)
    [info] = [i for i in site.engine.describe("accounts") if i.name == key]
    [said] = info.context.values()
    assert (said["what"], said["pid"], info.mode) == (f"POST /accounts/{key}", pid, "write")
    assert "s3cret" not in json.dumps(info.as_dict()) and "alice" not in json.dumps(info.as_dict())
    site.gate.let_go(f"accounts/{key}")
    assert held.result(30)[0] == 200
