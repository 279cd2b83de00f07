"""Helpers for testing code that uses ylock: real servers on free loopback ports.

Each server class starts the system's binary (``redis-server``, ZooKeeper) in a private
temporary directory on a port picked at run time, checks that the process answering on
that port is the one it started, and dumps the server's log when asked (tests do so on
failure). A server that cannot start raises :class:`ServerError`: never a skip.

For tests without a server, :mod:`ylock.testing.local` has an in-memory engine that can
make a lock busy, itself unavailable or a hold lost, and :mod:`pytest_ylock`
hands one to each test that asks (docs/testing.md).
"""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar


class ServerError(RuntimeError):
    """A test server could not be started or did not answer."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_S = TypeVar("_S", bound="ServerProcess")


class ServerProcess:
    """What every test server process shares: freezing it, stopping it, reading its log and
    the ``with`` statement. A subclass sets ``proc`` in ``start()`` and names its ``log``."""

    proc: subprocess.Popen[bytes] | None = None
    log_tail = 4000     # characters of the log that read_log() returns

    @property
    def log(self) -> Path:
        raise NotImplementedError

    def start(self) -> Any:
        raise NotImplementedError

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it accepts connections but never answers. Return once
        every thread of it has stopped (the signal is asynchronous: right after kill()
        returns, a thread still running on another CPU can answer a request sent meanwhile)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        _wait_stopped(self.proc.pid)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill the process (a frozen one too) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-self.log_tail:]
        except OSError:
            return "(no log)"

    def log_size(self) -> int:
        """Where the log ends now: the offset of the lines a start about to be made writes."""
        return self.log.stat().st_size if self.log.exists() else 0

    def log_since(self, offset: int) -> str:
        """The log written since ``offset`` (one of :meth:`log_size`'s), "" if there is none."""
        try:
            with open(self.log, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_answer(self, timeout: float, ask: Callable[[], bool | None],
                    not_yet: tuple[type[BaseException], ...] = (), pause: float = 0.05) -> bool:
        """Ask the process started last whether it serves, until ``timeout`` seconds pass.

        ``ask()`` returns whether the server answering is the one started here (ports are
        shared: another process may hold the port), or None when it cannot tell yet; an
        exception in ``not_yet`` (connection refused...) means not yet too. Between tries,
        sleep ``pause`` seconds. Return ``ask()``'s verdict, or False once the process has
        exited or the time is up."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                verdict = ask()
            except not_yet:
                verdict = None
            if verdict is not None:
                return verdict
            time.sleep(pause)
        return False

    def __enter__(self: _S) -> _S:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until every thread of process ``pid`` is stopped (Linux: /proc; elsewhere, return)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:         # the thread has exited
                continue
            states.append(stat[stat.rindex(")") + 2])     # the field after "(command name)"
        if all(state in "tTZX" for state in states):
            return
        if time.monotonic() > deadline:
            raise ServerError(f"process {pid} did not stop on SIGSTOP (thread states {states})")
        time.sleep(0.001)
