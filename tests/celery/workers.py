"""Celery workers for the tests: real ``celery worker`` processes, each in a process group of
its own, stopped by their id (SIGTERM: a warm shutdown; SIGKILL to the group: a crash)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """``celery -A <app> worker`` consuming ``queues`` with ``concurrency`` slots of ``pool``."""

    def __init__(self, name: str, directory: Path, *, app: str = "tests.celery.app", queues: str = "celery",
                 concurrency: int = 2, pool: str = "prefork", env: dict[str, str] | None = None,
                 options: tuple[str, ...] = ()) -> None:
        self.nodename = f"{name}@{socket.gethostname()}"
        self.app = app
        self.queues = queues
        self.concurrency = concurrency
        self.pool = pool
        self.env = dict(os.environ if env is None else env)
        self.options = options
        self.log = directory / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<Worker {self.nodename} {self.pool}x{self.concurrency} -Q {self.queues}>"

    def start(self) -> Worker:
        """Start the worker (return at once; :meth:`wait_ready` waits for it to consume)."""
        self.log.unlink(missing_ok=True)
        command = [sys.executable, "-m", "celery", "-A", self.app, "worker", "-n", self.nodename,
                   "-Q", self.queues, "-c", str(self.concurrency), "-P", self.pool, "-l", "INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat", *self.options]
        with open(self.log, "ab") as log:
            # A process group of its own: a SIGKILL to it takes the pool's children too.
            self.proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> Worker:
        """Wait until the worker consumes (it logs "<nodename> ready.")."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while f"{self.nodename} ready." not in self.read_log():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self} exited ({self.proc.returncode}):\n{self.read_log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self} not ready after {timeout} s:\n{self.read_log()}")
            time.sleep(0.05)
        return self

    def terminate(self, timeout: float = 30.0) -> int:
        """Warm shutdown (SIGTERM to the main process: running tasks finish); return its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self} did not stop within {timeout} s of SIGTERM") from None

    def kill(self) -> None:
        """SIGKILL to the worker's process group (the main process and its pool): a crash."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stop(self) -> None:
        """Stop the worker however it is: a warm shutdown, else a kill."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.terminate(20)
            except AssertionError:
                pass
        # Whatever of its group outlived the main process.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-20000:]
        except OSError:
            return "(no log)"


def recorded(events: str | os.PathLike[str], kind: str) -> list[dict[str, Any]]:
    """The events of ``kind`` that the test app's receivers recorded (in any process)."""
    path = Path(events)
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["kind"] == kind]
