"""celery_ylock on real workers: two prefork workers of two processes each (and, for the
crash and shutdown tests, a threads-pool worker of their own) take tasks from the session's
redis-server. Every test would fail against a broken lock: exclusion is checked with an
unfenced counter and a fenced register, releases by taking the lock right after."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

import ylock
from celery_ylock import LockedTask, TaskLocked, skipped
from tests.celery.workers import Worker, recorded
from tests.helpers import collect, wait_until, waiters
from ylock.testing import free_port
from ylock.testing.fencing import FencedRegister, UnfencedCounter

pytestmark = pytest.mark.slow


def free(lock: ylock.Lock) -> bool:
    """Take and give back ``lock`` at once; return whether it was free."""
    if lock.try_lock():
        lock.unlock()
        return True
    return False


# -- exclusion ------------------------------------------------------------------------------------


def test_fifty_tasks_for_one_key_never_overlap(tasks: ModuleType, workers: list[Worker], job: str,
                                               tmp_path: Path) -> None:
    # The control: the same read-pause-write without the lock loses updates on these workers.
    control = UnfencedCounter(tmp_path / "control.json", pause=0.05)
    for result in [tasks.count_unlocked.delay(job, control.path, 0.05) for _ in range(20)]:
        result.get(timeout=60)
    assert control.increments == 20 and control.lost > 0

    counter = UnfencedCounter(tmp_path / "counter.json", pause=0.02)
    register = FencedRegister(tmp_path / "register.json")
    results = [tasks.count.delay(job, counter.path, register.path, 0.02) for _ in range(50)]
    runs = sorted((r.get(timeout=120) for r in results), key=lambda run: run["started"])
    assert counter.increments == 50 and counter.lost == 0 and counter.value == 50
    state = register.state()
    assert (state.accepted, state.rejected, state.value) == (50, 0, 50)
    tokens = [run["token"] for run in runs]
    assert all(a < b for a, b in zip(tokens, tokens[1:])), "fencing tokens must increase run after run"
    assert all(a["ended"] <= b["started"] for a, b in zip(runs, runs[1:])), "two runs overlapped"
    assert len({run["pid"] for run in runs}) >= 2       # the runs were spread over processes


# -- on_busy --------------------------------------------------------------------------------------


def test_skip_does_not_run_the_task_and_says_so(tasks: ModuleType, workers: list[Worker], job: str, tmp_path: Path,
                                                celery_env: dict[str, str]) -> None:
    marker = tmp_path / "ran"
    lock = tasks.skip_job.lock_for(job, str(marker))
    with lock.write(timeout=5):
        result = tasks.skip_job.delay(job, str(marker))
        value = result.get(timeout=30)
    assert skipped(value) and value["lock"] == f"jobs/{job}" and value["scope"] == "run"
    assert not marker.exists()
    sent = [e for e in recorded(celery_env["CELERY_YLOCK_TEST_EVENTS"], "task_skipped") if e["task_id"] == result.id]
    assert len(sent) == 1 and sent[0]["lock"] == f"jobs/{job}" and sent[0]["task"] == tasks.skip_job.name
    assert any(f"{result.id}] skipped: lock jobs/{job} is busy" in w.read_log() for w in workers)
    assert tasks.skip_job.delay(job, str(marker)).get(timeout=30) == "ran" and marker.exists()


def test_retry_requeues_the_task_until_the_lock_is_free(tasks: ModuleType, workers: list[Worker], job: str) -> None:
    lock = tasks.retry_job.lock_for(job)
    with lock.write(timeout=5):
        result = tasks.retry_job.delay(job)
        wait_until(lambda: result.state == "RETRY", timeout=30, what="the task to be retried")
        released = time.time()
    value = result.get(timeout=30)
    assert value["retries"] >= 1 and value["at"] >= released

    with lock.write(timeout=5):
        brief = tasks.retry_job_briefly.delay(job)           # max_retries=2, then it fails
        with pytest.raises(TaskLocked, match="another owner holds it"):
            brief.get(timeout=30)


def test_wait_runs_the_task_once_the_lock_is_free_or_fails_after_its_timeout(tasks: ModuleType, workers: list[Worker],
                                                                             job: str) -> None:
    lock = tasks.wait_job.lock_for(job)
    with lock.write(timeout=5):
        result = tasks.wait_job.delay(job)
        wait_until(lambda: waiters(lock.engine, lock.group, lock.name), timeout=30, what="the task to wait")
        released = time.time()
    assert result.get(timeout=30)["at"] >= released

    with lock.write(timeout=5):
        started = time.monotonic()
        brief = tasks.wait_job_briefly.delay(job)             # waits 0.5 s
        with pytest.raises(TaskLocked, match="within 0.5"):
            brief.get(timeout=30)
        assert time.monotonic() - started >= 0.5


def test_raise_fails_the_task_at_once(tasks: ModuleType, workers: list[Worker], job: str) -> None:
    lock = tasks.raise_job.lock_for(job)
    with lock.write(timeout=5):
        result = tasks.raise_job.delay(job)
        with pytest.raises(TaskLocked, match="on_busy='raise'"):
            result.get(timeout=30)
    assert tasks.raise_job.delay(job).get(timeout=30) == "ran"


# -- scope="enqueue" ------------------------------------------------------------------------------


def test_enqueue_refuses_a_duplicate_and_the_first_runs_with_the_senders_token(tasks: ModuleType, workers: list[Worker],
                                                                               job: str, tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    lock = tasks.dedup_job.lock_for(job)
    with collect(ylock.events.DETACHED) as detached:
        first = tasks.dedup_job.delay(job, started=str(started), gate=str(gate))
    with pytest.raises(TaskLocked, match="queued or running"):
        tasks.dedup_job.delay(job)                            # while the first is queued (or starting)
    wait_until(started.exists, timeout=30, what="the first task to start")
    with pytest.raises(TaskLocked, match="queued or running"):
        tasks.dedup_job.delay(job)                            # while it runs
    assert not free(lock)
    gate.write_text("open")
    assert first.get(timeout=30) == {"token": detached[0].token, "adopted": True}
    assert free(lock)                                   # released when it finished
    assert tasks.dedup_job.delay(job).get(timeout=30)["adopted"]


def test_enqueue_releases_the_lock_when_the_task_fails(tasks: ModuleType, workers: list[Worker], job: str) -> None:
    failing = tasks.dedup_job.delay(job, fail=True)
    with pytest.raises(RuntimeError, match="asked to fail"):
        failing.get(timeout=30)
    assert free(tasks.dedup_job.lock_for(job))
    assert tasks.dedup_job.delay(job).get(timeout=30)["adopted"]


def test_enqueue_skip_returns_a_skipped_result(tasks: ModuleType, workers: list[Worker], job: str, tmp_path: Path,
                                               celery_env: dict[str, str]) -> None:
    gate = tmp_path / "gate"
    first = tasks.dedup_skip_job.delay(job, gate=str(gate))
    second = tasks.dedup_skip_job.delay(job)
    assert skipped(second.get()) and second.get()["scope"] == "enqueue"
    assert [e["task_id"] for e in recorded(celery_env["CELERY_YLOCK_TEST_EVENTS"], "task_skipped")
            if e["lock"] == f"dedup/{job}"] == [second.id]
    gate.write_text("open")
    assert first.get(timeout=30) == "ran"


def test_a_task_that_retries_itself_keeps_its_enqueue_lock(tasks: ModuleType, workers: list[Worker], job: str) -> None:
    with collect(ylock.events.DETACHED) as detached:
        result = tasks.dedup_retry_job.delay(job)
    wait_until(lambda: result.state == "RETRY", timeout=30, what="the task to retry")
    with pytest.raises(TaskLocked):
        tasks.dedup_retry_job.delay(job)                      # its lock went on to the retry's message
    assert result.get(timeout=30) == {"token": detached[0].token, "adopted": True, "retries": 1}
    assert free(tasks.dedup_retry_job.lock_for(job))


def test_a_revoked_task_releases_its_lock(tasks: ModuleType, workers: list[Worker], app: Celery, job: str) -> None:
    lock = tasks.dedup_job.lock_for(job)
    result = tasks.dedup_job.apply_async((job,), countdown=1.0)
    assert not free(lock)
    app.control.revoke(result.id)
    revoked = time.monotonic()
    wait_until(lambda: free(lock), timeout=20, what="the revoked task's lock to be released")
    # At its ETA the worker drops the task and releases its lock, long before the queue lease (120 s).
    assert time.monotonic() - revoked < 10
    wait_until(lambda: result.state == "REVOKED", timeout=10, what="the task to be revoked")


def test_a_send_that_fails_releases_the_lock_at_once(celery_env: dict[str, str], job: str) -> None:
    unreachable = Celery("unreachable", set_as_current=False)
    unreachable.conf.update(
        broker_url=f"redis://127.0.0.1:{free_port()}/0", task_publish_retry=False, broker_connection_timeout=1,
        broker_connection_retry=False, broker_connection_max_retries=0,
        ylock={"ENGINES": {"default": {"URL": celery_env["CELERY_YLOCK_TEST_YLOCK_URL"]}}})

    @unreachable.task(shared=False, base=LockedTask, lock={"name": "dedup", "key": "{job}", "scope": "enqueue"})
    def sent(job: str) -> None:
        """Never runs."""

    with collect() as seen:
        started = time.monotonic()
        with pytest.raises(OperationalError):
            sent.delay(job)
        elapsed = time.monotonic() - started
    kinds = [event.kind for event in seen if event.name == job]
    assert kinds == ["acquired", "detached", "adopted", "released"], kinds
    assert free(sent.lock_for(job)) and elapsed < 5


# -- long runs: renewal, loss, crash, shutdown ---------------------------------------------------


def _started(marker: Path) -> dict[str, Any]:
    import json

    wait_until(marker.exists, timeout=30, what="the task to start")
    return json.loads(marker.read_text())     # type: ignore[no-any-return]


def test_the_lease_is_renewed_however_long_the_task_runs(tasks: ModuleType, solo: Callable[[], Worker], job: str,
                                                         tmp_path: Path) -> None:
    solo()
    marker = tmp_path / "marker"
    lock = tasks.hold_short.lock_for(job, "", 0)                       # LEASE 1.5 s
    result = tasks.hold_short.apply_async((job, str(marker), 4.5), queue="solo")
    started = _started(marker)
    checks = 0
    while time.time() < started["at"] + 4.0:                   # three leases and more, the task still running
        assert not free(lock)
        checks += 1
        time.sleep(0.1)
    assert checks >= 20
    assert result.get(timeout=10) == {"token": started["token"], "lost": False, "lost_event": False}
    assert free(lock)


def test_a_lost_hold_is_seen_by_the_task_which_stops(tasks: ModuleType, solo: Callable[[], Worker], job: str,
                                                     tmp_path: Path) -> None:
    solo()
    marker = tmp_path / "marker"
    lock = tasks.hold_short.lock_for(job, "", 0)
    result = tasks.hold_short.apply_async((job, str(marker), 30.0), queue="solo")
    _started(marker)
    lost_at = time.monotonic()
    assert lock.engine.force_release(lock.group, lock.name)     # as `ylock release` would
    with pytest.raises(ylock.LockLost, match="stop"):
        result.get(timeout=15)
    assert time.monotonic() - lost_at < 1.5 + 1                 # seen at the next renewal


@pytest.mark.parametrize("task", ["hold_short", "hold_short_enqueued"])
def test_a_worker_killed_with_sigkill_frees_its_lock_within_the_lease(tasks: ModuleType, task: str, solo: Callable[[],
                                                                      Worker], job: str, tmp_path: Path) -> None:
    worker = solo()
    marker = tmp_path / "marker"
    locked = getattr(tasks, task)
    lock = locked.lock_for(job, "", 0)                           # LEASE 1.5 s (an enqueued one: queue lease 120 s)
    locked.apply_async((job, str(marker), 60.0), queue="solo")
    _started(marker)
    assert not free(lock)
    worker.kill()
    killed = time.monotonic()
    wait_until(lambda: free(lock), timeout=10, what="the dead worker's lock to expire")
    freed = time.monotonic() - killed
    assert 0.5 <= freed <= 1.5 + 0.5, freed                     # held after the kill, gone within the lease


def test_a_warm_shutdown_lets_the_task_finish_and_releases_its_lock(tasks: ModuleType, solo: Callable[[], Worker],
                                                                    job: str, tmp_path: Path) -> None:
    worker = solo()
    marker = tmp_path / "marker"
    lock = tasks.hold_long.lock_for(job, "", 0)                        # LEASE 60 s
    result = tasks.hold_long.apply_async((job, str(marker), 1.5), queue="solo")
    _started(marker)
    assert worker.terminate(30) == 0
    assert free(lock)                                            # released, not left to its 60 s lease
    assert result.get(timeout=10)["lost"] is False


# -- startup ---------------------------------------------------------------------------------------


def test_a_worker_with_contradicting_settings_does_not_start(celery_env: dict[str, str], tmp_path: Path) -> None:
    worker = Worker("bad", tmp_path, app="tests.celery.bad_app", concurrency=1, pool="solo").start()
    try:
        assert worker.proc is not None
        assert worker.proc.wait(60) != 0
    finally:
        worker.stop()
    log = worker.read_log()
    assert "LOCKS['jobs']['LEASE'] (30 s) must be shorter than the broker's visibility_timeout (20 s)" in log, log


# -- the example -----------------------------------------------------------------------------------


def test_the_example_app_runs_as_documented(redis_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import os
    import sys

    base = f"redis://127.0.0.1:{redis_server.port}"
    env = {"YLOCK_URL": f"{base}/0", "CELERY_BROKER_URL": f"{base}/3", "CELERY_RESULT_BACKEND": f"{base}/4",
           "EXAMPLE_DATABASE": str(tmp_path / "accounts.sqlite3")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = Worker("example", tmp_path, app="example_project.celery_app", concurrency=3, env={**os.environ})
    try:
        worker.start().wait_ready()
        sys.modules.pop("example_project.celery_app", None)
        example = importlib.import_module("example_project.celery_app")
        outcome = example.demo()
    finally:
        worker.stop()
    assert outcome["reports_run"] >= 1 and outcome["reports_skipped"] >= 1
    assert outcome["reports_run"] + outcome["reports_skipped"] == 3
    assert outcome["duplicate_feed"].startswith("refused: task example_project.celery_app.import_feed")
    assert outcome["balance"] == outcome["expected_balance"] == 200     # 20 deposits, none lost
