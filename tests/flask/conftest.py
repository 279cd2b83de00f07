"""Fixtures for the Flask plugin tests: apps on the session's real redis-server, a real
threaded HTTP server for concurrent requests, and a view that holds its lock until told."""
from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import make_server

from flask_ylock import YLock
from ylock.testing.redis import RedisServer


@pytest.fixture
def make_app(redis_server: RedisServer, group: str, tmp_path: Any) -> Callable[..., tuple[Flask, YLock]]:
    """Build an app on the session's redis-server whose lock families live in this test's group."""

    def make(ext: YLock | None = None, **config: Any) -> tuple[Flask, YLock]:
        app = Flask(f"app_{group}", instance_path=str(tmp_path / "instance"))
        app.config.update(SECRET_KEY="test", TESTING=True, YLOCK_URL=redis_server.url,
                          YLOCK_LOCKS={"accounts": {"GROUP": group, "TIMEOUT": 0.2},
                                       "users": {"GROUP": group + "-users"}})
        app.config.update(config)
        ext = ext or YLock()
        ext.init_app(app)
        return app, ext
    return make


class LiveServer:
    """A real threaded HTTP server for ``app`` on a free loopback port."""

    def __init__(self, app: Flask) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                timeout: float = 10, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        if data is None and method == "POST":
            data = b""
        req = urllib.request.Request(self.url + path, method=method, headers=headers or {}, data=data)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def live() -> Iterator[Callable[[Flask], LiveServer]]:
    servers: list[LiveServer] = []

    def start(app: Flask) -> LiveServer:
        servers.append(LiveServer(app))
        return servers[-1]
    yield start
    for s in servers:
        s.stop()


class Gate:
    """Lets a test hold a view inside its lock: ``entered`` is set once the view runs,
    and the view returns when ``leave`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.leave = threading.Event()

    def pass_through(self) -> None:
        self.entered.set()
        assert self.leave.wait(10), "the test never let the view go"


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.leave.set()
