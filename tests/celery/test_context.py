"""What a task's hold says it is doing, seen from another process (this test) while a
real worker holds it: the task's name and id, for scope "run" and for "enqueue" (chosen
when it is sent, kept when the worker adopts the hold)."""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.celery.workers import Worker
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


def said(lock: Any) -> list[dict[str, Any]]:
    """What the holders of ``lock`` say they are doing."""
    return [dict(c) for i in lock.engine.describe(lock.group) if i.name == lock.name for c in i.context.values()]


@pytest.mark.parametrize("scope", ["run", "enqueue"])
def test_a_tasks_hold_says_its_name_and_id(tasks: ModuleType, workers: list[Worker], job: str, tmp_path: Path,
                                           scope: str) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    task = tasks.gated_job if scope == "run" else tasks.dedup_job
    if scope == "run":
        result = task.delay(job, str(started), str(gate))
        lock = task.lock_for(job, str(started), str(gate))
    else:
        result = task.delay(job, started=str(started), gate=str(gate))
        lock = task.lock_for(job)
    try:
        wait_until(started.exists, timeout=30, what="the task to hold its lock")
        [holder] = said(lock)
        assert (holder["what"], holder["task_id"]) == (f"celery task {task.name}", result.id)
        assert holder["pid"] != os.getpid()              # a worker's pool process holds it (adopted, for enqueue)
        assert holder["pid"] not in {w.proc.pid for w in workers}
    finally:
        gate.write_text("go")
    assert result.get(timeout=30) in ("done", {"token": int(started.read_text()), "adopted": True})
    assert said(lock) == []
