"""A real VictoriaMetrics server for tests of the InfluxDB exporter.

VictoriaMetrics speaks InfluxDB's v2 write API (``POST /api/v2/write``, any token, org
and bucket), so ``influxdb-client`` writes to it as to InfluxDB 2; points are read back
with ``/api/v1/export`` after ``/internal/force_flush``. A field ``f`` of measurement
``m`` becomes the series ``m_f`` with the point's tags as labels.

Debian: ``apt-get install victoria-metrics`` (``/usr/bin/victoria-metrics``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ylock.testing import ServerError, ServerProcess, free_port


def _binary() -> str:
    path = shutil.which("victoria-metrics") or ("/usr/bin/victoria-metrics"
                                                if os.path.exists("/usr/bin/victoria-metrics") else None)
    if path is None:
        raise ServerError("victoria-metrics is not installed (Debian: apt-get install victoria-metrics)")
    return path


class VictoriaMetrics(ServerProcess):
    """One ``victoria-metrics`` on 127.0.0.1 at a free port, storing in its own directory."""

    def __init__(self, directory: str | None = None) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="ylock-vm-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "victoria-metrics.log"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def start(self, attempts: int = 5) -> VictoriaMetrics:
        """Start the server on a free port (another one if that was taken meanwhile)."""
        for _ in range(attempts):
            self.port = free_port()
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [_binary(), f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.data}",
                     "-retentionPeriod=100y", "-search.latencyOffset=0s", "-loggerLevel=WARN"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_ready():
                return self
            self.stop()
        raise ServerError(f"victoria-metrics did not start; last log:\n{self.read_log()}")

    def _wait_ready(self, timeout: float = 15.0) -> bool:
        def ours() -> bool:
            # The server answering must be ours: its storage path is our private directory.
            metrics = self.get("/metrics", timeout=1).decode()
            return f'flag{{name="storageDataPath", value="{self.data}"' in metrics
        return self.wait_answer(timeout, ours, (OSError, urllib.error.URLError))

    def get(self, path: str, params: dict[str, str] | None = None, timeout: float = 10.0) -> bytes:
        """GET ``path`` (with query ``params``) and return the body."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()  # type: ignore[no-any-return]

    def force_flush(self) -> None:
        """Make everything written so far visible to queries."""
        self.get("/internal/force_flush")

    def export(self, match: str, samples: int = 0, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Return the raw series matching the selector ``match`` (``{"metric", "values", "timestamps"}``
        each), once they hold at least ``samples`` samples in all.

        Rows that the server acknowledged become searchable a moment later (its ingestion
        is asynchronous), so poll, flushing each time, until that many are there; raise
        :class:`ServerError` with what was found after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.force_flush()
            body = self.get("/api/v1/export", {"match[]": match}).decode()
            series = [json.loads(line) for line in body.splitlines() if line.strip()]
            found = sum(len(s["values"]) for s in series)
            if found >= samples:
                return series
            if time.monotonic() > deadline:
                raise ServerError(f"{found} samples match {match}, expected {samples} after {timeout} s: {series}")
            time.sleep(0.05)

    def rows_inserted(self) -> int:
        """Return how many InfluxDB line-protocol rows (one per field) the server took in so far."""
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith('vm_rows_inserted_total{type="influx"}'):
                return int(float(line.split()[-1]))
        return 0

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Return the instant vector of a MetricsQL query."""
        self.force_flush()
        reply = json.loads(self.get("/api/v1/query", {"query": promql}))
        if reply.get("status") != "success":
            raise ServerError(f"query {promql!r} failed: {reply}")
        return reply["data"]["result"]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<VictoriaMetrics {self.url} in {self.dir}>"

