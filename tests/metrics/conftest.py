"""Fixtures for the metrics tests: a real VictoriaMetrics (speaking InfluxDB's v2 write
API) for the session, a TCP proxy that can swallow requests, and a clean exporter state
around every test."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

import ylock.metrics
from tests.conftest import _servers
from ylock.testing.victoriametrics import VictoriaMetrics


@pytest.fixture(scope="session")
def victoria_metrics() -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics().start()
    _servers.append(server)
    yield server
    _servers.remove(server)
    server.stop()


@pytest.fixture(autouse=True)
def _fresh_metrics() -> Iterator[None]:
    """Start each test with no exporter subscribed and an empty aggregator."""
    ylock.metrics.shutdown()
    ylock.metrics.AGGREGATOR.reset()
    yield
    ylock.metrics.shutdown(timeout=0.5)
    ylock.metrics.AGGREGATOR.reset()


class Blackhole:
    """A TCP server on a free loopback port that accepts connections and, while
    ``swallow`` is set, never answers them; otherwise it forwards them to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.swallow = True
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            if self.swallow:
                self._held.append(conn)   # keep it open, read nothing, answer nothing
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stopped = True
        self._server.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def blackhole(victoria_metrics: VictoriaMetrics) -> Iterator[Blackhole]:
    hole = Blackhole(("127.0.0.1", victoria_metrics.port))
    yield hole
    hole.close()
