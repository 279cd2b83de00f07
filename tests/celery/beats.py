"""Celery beats for the tests: real ``celery beat`` processes, and the receiving side that
records every message they send.

:class:`Beat` is one ``celery -A <app> beat`` process (in a process group of its own, signalled
by its id). :class:`Recorder` consumes the queue the beats send to, from a thread of the test
process, and records each message as it arrives: its entry, the time it arrived, and what
the LeaderScheduler's header says (the term's fencing token, the run's time, the sender);
for Celery's plain scheduler (no header) the sender is the message's ``origin``. The checks
(:func:`twice_within`, :func:`gaps`) read those records only.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.celery.workers import ROOT

Record = dict[str, Any]


class Beat:
    """``celery -A <app> beat`` with its own schedule file and log."""

    def __init__(self, name: str, directory: Path, env: dict[str, str], *, app: str = "tests.celery.beat_app") -> None:
        self.name = name
        self.env = env
        self.app = app
        self.schedule = directory / f"{name}-schedule"
        self.log = directory / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<Beat {self.name} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> Beat:
        command = [sys.executable, "-m", "celery", "-A", self.app, "beat", "-s", str(self.schedule), "-l", "INFO"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def send(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM (a clean shutdown); return the exit code. The bound is generous: how soon the
        lock is handed over is what the tests measure (from the records), not how long the
        interpreter takes to exit on a loaded machine (its schedule file's sync, its atexit)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash (the lock is left to its lease)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """Stop however it is (resumed first if it was stopped)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-20000:]
        except OSError:
            return "(no log)"

    def wait_log(self, text: str, after: int = 0, timeout: float = 60.0) -> int:
        """Wait until the log says ``text`` past its first ``after`` characters; return where it does."""
        wait_for(f"{self!r} logs {text!r}", lambda: self.read_log(), lambda log: text in log[after:], [self],
                 timeout)
        return self.read_log().index(text, after)

    def log_size(self) -> int:
        return len(self.read_log())


def wait_for(what: str, fetch: Callable[[], Any], condition: Callable[[Any], bool], processes: Iterable[Any] = (),
             timeout: float = 90.0) -> Any:
    """Wait until ``condition(fetch())`` holds and return that value (``timeout`` only guards
    against a hang: the error shows the processes' logs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if condition(value):
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p!r}\n{p.read_log()}" for p in processes)
            raise AssertionError(f"{what}: not within {timeout} s; last seen: {value!r}\n{logs}")
        time.sleep(0.05)


class Recorder:
    """Consume ``queue`` on ``broker_url`` from a thread; :attr:`records` grows as messages arrive."""

    def __init__(self, broker_url: str, queue: str) -> None:
        self.broker_url = broker_url
        self.queue = queue
        self.records: list[Record] = []
        self._finish = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"recorder-{queue}", daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def _run(self) -> None:
        import kombu

        try:
            with kombu.Connection(self.broker_url) as connection:
                queue = connection.SimpleQueue(self.queue, no_ack=True)
                while True:
                    try:
                        message = queue.get(block=True, timeout=0.2)
                    except queue.Empty:
                        if self._finish.is_set():
                            return             # asked to finish, and the queue is empty
                        continue
                    self.records.append(as_record(message.headers, message.payload, time.time()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test by finish()
            self._error = exc

    def finish(self, timeout: float = 30.0) -> list[Record]:
        """Return every record once the queue is empty (call it once the senders stopped)."""
        self._finish.set()
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        assert not self._thread.is_alive(), f"the recorder of {self.queue} did not finish"
        return list(self.records)

    def wait(self, what: str, condition: Callable[[list[Record]], bool], beats: Iterable[Any] = (),
             timeout: float = 90.0) -> list[Record]:
        """Wait until ``condition(records)`` holds; return the records."""
        def fetch() -> list[Record]:
            if self._error is not None:
                raise self._error
            return list(self.records)
        records: list[Record] = wait_for(what, fetch, condition, beats, timeout)
        return records


def as_record(headers: dict[str, Any], payload: Any, received: float) -> Record:
    """One send, as the receiving side sees it."""
    args = payload[0] if isinstance(payload, (list, tuple)) and payload else []
    sent = headers.get("ylock_beat") or {}
    origin = str(headers.get("origin") or "")
    return {"entry": args[0] if args else None, "received": received, "task_id": headers.get("id"),
            "origin": origin, "token": sent.get("token"), "at": sent.get("at"),
            "sender": sent.get("by") or origin, "header_entry": sent.get("entry"), "lock": sent.get("lock")}


def read_records(path: Path) -> list[Record]:
    """The records the test app's ``record`` task wrote (its worker's side)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pid_of(record: Record) -> int:
    """The sender's pid: ``host:pid`` (the header) or ``gen<pid>@host`` (Celery's origin)."""
    sender = str(record["sender"])
    if sender.startswith("gen"):
        return int(sender[3:].split("@")[0])
    return int(sender.rsplit(":", 1)[1])


def of(records: Iterable[Record], entry: str | None = None, *, pid: int | None = None, not_pid: int | None = None,
       after: float | None = None, token: int | None = None) -> list[Record]:
    """The records of ``entry`` (all entries: None), sent by ``pid`` / not by ``not_pid``, run at or after
    ``after`` (epoch seconds), with ``token``; in the order they ran."""
    out = [r for r in records if (entry is None or r["entry"] == entry)
           and (pid is None or pid_of(r) == pid) and (not_pid is None or pid_of(r) != not_pid)
           and (after is None or time_of(r) >= after) and (token is None or r["token"] == token)]
    return sorted(out, key=time_of)


def time_of(record: Record) -> float:
    """When the send ran: the header's run time, else (a plain beat) when it arrived."""
    return float(record["at"] if record.get("at") is not None else record["received"])


def twice_within(records: Iterable[Record], period: float) -> list[tuple[Record, Record]]:
    """The pairs of consecutive sends of one entry less than ``period`` apart."""
    found = []
    by_entry: dict[str, list[Record]] = {}
    for record in records:
        by_entry.setdefault(record["entry"], []).append(record)
    for sends in by_entry.values():
        sends.sort(key=time_of)
        found += [(a, b) for a, b in zip(sends, sends[1:]) if time_of(b) - time_of(a) < period]
    return found


def gaps(records: Iterable[Record], entry: str) -> list[tuple[float, Record, Record]]:
    """The time between each two consecutive sends of ``entry``, largest first."""
    sends = of(records, entry)
    return sorted(((time_of(b) - time_of(a), a, b) for a, b in zip(sends, sends[1:])), key=lambda g: -g[0])


def beat_env(celery_env: dict[str, str], *, lock: str, record: Path, queue: str, lease: float, period: float,
             **more: str) -> dict[str, str]:
    """The environment of the beat test app's processes."""
    return {**os.environ, **celery_env, "BEAT_LOCK": lock, "BEAT_RECORD": str(record), "BEAT_QUEUE": queue,
            "BEAT_LEASE": str(lease), "BEAT_PERIOD": str(period), **more}
