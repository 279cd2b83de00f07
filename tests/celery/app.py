"""The Celery app that the test workers run (``celery -A tests.celery.app worker``): one
task per behaviour of celery_ylock. Tasks are not shared (``shared=False``), so that other
apps of the test session do not get them."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from celery_ylock import LockedTask, current_lock, signals
from ylock.testing.fencing import FencedRegister, UnfencedCounter

app = Celery("ylock_tests", set_as_current=False)
app.config_from_object("tests.celery.settings")

JOBS = {"name": "jobs", "key": "{job}"}


def _record(kind: str, **data: Any) -> None:
    """Append one line to the session's event file (O_APPEND: lines of processes never mix)."""
    path = os.environ.get("CELERY_YLOCK_TEST_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"kind": kind, "pid": os.getpid(), **data}) + "\n")


@signals.task_skipped.connect
def _skipped(sender: Any, task_id: str, lock: str, scope: str, **kwargs: Any) -> None:
    _record("task_skipped", task=sender.name, task_id=task_id, lock=lock, scope=scope)


def _wait_for(gate: str | None, timeout: float = 30.0) -> None:
    """Wait until the test creates ``gate`` (a file): the test decides when the task ends."""
    deadline = time.monotonic() + timeout
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.01)


# -- exclusion ------------------------------------------------------------------------------------


@app.task(bind=True, shared=False, base=LockedTask,
          lock={"name": "counter", "key": "{job}", "on_busy": "wait", "timeout": 120})
def count(self: LockedTask, job: str, counter: str, register: str, pause: float) -> dict[str, Any]:
    """Read, pause, write: updates get lost unless the runs exclude each other."""
    hold = current_lock(self)              # the typed accessor (self.request.ylock, as a TaskHold)
    started = time.time()
    UnfencedCounter(counter, pause).increment()
    accepted = FencedRegister(register).increment(hold.token)
    return {"token": hold.token, "accepted": accepted, "started": started, "ended": time.time(), "pid": os.getpid()}


@app.task(shared=False)
def count_unlocked(job: str, counter: str, pause: float) -> None:
    """The control: the same work without a lock."""
    UnfencedCounter(counter, pause).increment()


# -- on_busy -------------------------------------------------------------------------------------


@app.task(bind=True, shared=False, base=LockedTask, lock={**JOBS, "on_busy": "skip"})
def skip_job(self: LockedTask, job: str, marker: str) -> str:
    Path(marker).write_text("ran")
    return "ran"


@app.task(bind=True, shared=False, base=LockedTask,
          lock={**JOBS, "on_busy": "retry", "countdown": 0.2, "max_retries": 100})
def retry_job(self: LockedTask, job: str) -> dict[str, Any]:
    return {"retries": self.request.retries, "at": time.time(), "token": self.request.ylock.token}


@app.task(bind=True, shared=False, base=LockedTask,
          lock={**JOBS, "on_busy": "retry", "countdown": 0.1, "max_retries": 2})
def retry_job_briefly(self: LockedTask, job: str) -> str:
    return "ran"


@app.task(bind=True, shared=False, base=LockedTask, lock={**JOBS, "on_busy": "wait", "timeout": 10})
def wait_job(self: LockedTask, job: str) -> dict[str, Any]:
    return {"at": time.time(), "token": self.request.ylock.token}


@app.task(bind=True, shared=False, base=LockedTask, lock={**JOBS, "on_busy": "wait", "timeout": 0.5})
def wait_job_briefly(self: LockedTask, job: str) -> str:
    return "ran"


@app.task(bind=True, shared=False, base=LockedTask, lock={**JOBS, "on_busy": "raise"})
def raise_job(self: LockedTask, job: str) -> str:
    return "ran"


@app.task(bind=True, shared=False, base=LockedTask, lock={**JOBS, "on_busy": "raise"})
def gated_job(self: LockedTask, job: str, started: str, gate: str) -> str:
    """Holds its lock until the test creates ``gate`` (``started`` says it holds it)."""
    Path(started).write_text(str(self.request.ylock.token))
    _wait_for(gate)
    return "done"


# -- scope="enqueue" -----------------------------------------------------------------------------


@app.task(bind=True, shared=False, base=LockedTask, lock={"name": "dedup", "key": "{job}", "scope": "enqueue"})
def dedup_job(self: LockedTask, job: str, started: str | None = None, gate: str | None = None,
              fail: bool = False) -> dict[str, Any]:
    hold = self.request.ylock
    if started:
        Path(started).write_text(str(hold.token))
    _wait_for(gate)
    if fail:
        raise RuntimeError("this task was asked to fail")
    return {"token": hold.token, "adopted": hold.adopted}


@app.task(bind=True, shared=False, base=LockedTask,
          lock={"name": "dedup", "key": "{job}", "scope": "enqueue", "on_busy": "skip"})
def dedup_skip_job(self: LockedTask, job: str, gate: str | None = None) -> str:
    _wait_for(gate)
    return "ran"


@app.task(bind=True, shared=False, base=LockedTask, lock={"name": "dedup", "key": "{job}", "scope": "enqueue"})
def dedup_retry_job(self: LockedTask, job: str) -> dict[str, Any]:
    """Retries itself once: its lock goes on to the retry's message."""
    if self.request.retries == 0:
        raise self.retry(countdown=0.5)
    hold = self.request.ylock
    return {"token": hold.token, "adopted": hold.adopted, "retries": self.request.retries}


# -- long runs: renewal, loss, SIGKILL, warm shutdown ---------------------------------------------


def _hold_for(task: LockedTask, marker: str, seconds: float) -> dict[str, Any]:
    hold = task.request.ylock
    Path(marker + ".tmp").write_text(json.dumps({"pid": os.getpid(), "token": hold.token, "at": time.time()}))
    os.replace(marker + ".tmp", marker)         # the test reads it as soon as it exists
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hold.check()            # the documented way to stop once the hold is lost
        time.sleep(0.02)
    return {"token": hold.token, "lost": hold.lost, "lost_event": hold.lost_event.is_set()}


@app.task(bind=True, shared=False, base=LockedTask, lock={"name": "short", "key": "{job}", "on_busy": "raise"})
def hold_short(self: LockedTask, job: str, marker: str, seconds: float) -> dict[str, Any]:
    return _hold_for(self, marker, seconds)


@app.task(bind=True, shared=False, base=LockedTask, lock={"name": "long", "key": "{job}", "on_busy": "raise"})
def hold_long(self: LockedTask, job: str, marker: str, seconds: float) -> dict[str, Any]:
    return _hold_for(self, marker, seconds)


@app.task(bind=True, shared=False, base=LockedTask,
          lock={"name": "short", "key": "{job}", "scope": "enqueue"})
def hold_short_enqueued(self: LockedTask, job: str, marker: str, seconds: float) -> dict[str, Any]:
    return _hold_for(self, marker, seconds)


@worker_process_init.connect
def _without_pump(**kwargs: Any) -> None:
    """In a pool process of test_prometheus_in_a_prefork_pool[exit]: no pump thread, so that
    only what celery_ylock does at the process's exit can write its metrics."""
    if os.environ.get("CELERY_YLOCK_TEST_NO_PUMP"):
        import ylock.metrics.deferred

        ylock.metrics.deferred._pump = threading.Thread()     # taken for a running pump: never started
