"""Prometheus in a Celery prefork pool: a worker of two pool processes recycled every three
tasks (``--max-tasks-per-child``), with ``$PROMETHEUS_MULTIPROC_DIR`` set: a scrape of the
directory counts every locked task, those of pool processes that have exited included
(they leave with ``os._exit``: celery_ylock writes their pending events at
``worker_process_shutdown``)."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.celery.conftest import started
from tests.celery.workers import Worker
from ylock.testing.fencing import FencedRegister, UnfencedCounter

pytestmark = pytest.mark.slow

TASKS = 12


def acquisitions(directory: Path, name: str) -> float:
    """What a ``/metrics`` view with a MultiProcessCollector over ``directory`` would count."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return sum(s.value for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples
               if s.name == "ylock_events_total" and s.labels["outcome"] == "acquired" and s.labels["name"] == name)


@pytest.mark.parametrize("writer", ["pump", "exit"])
def test_prometheus_in_a_prefork_pool(tasks: ModuleType, celery_env: dict[str, str], job: str, tmp_path: Path,
                                      writer: str) -> None:
    """``pump``: while the worker runs, every read counts every task. ``exit``: the pool
    processes have no pump thread; once the worker has stopped, every task is counted all
    the same (each process wrote its events as it left)."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    if writer == "exit":
        env["CELERY_YLOCK_TEST_NO_PUMP"] = "1"
    worker = Worker(f"prom-{uuid.uuid4().hex[:6]}", tmp_path, queues="prom", concurrency=2, pool="prefork",
                    env=env, options=("--max-tasks-per-child", "3"))
    started.append(worker.start())
    try:
        worker.wait_ready()
        counter = UnfencedCounter(tmp_path / "counter.json", pause=0.0)
        register = FencedRegister(tmp_path / "register.json")
        results = [tasks.count.apply_async((job, counter.path, register.path, 0.0), queue="prom")
                   for _ in range(TASKS)]
        runs = [r.get(timeout=120) for r in results]
        assert counter.value == TASKS
        pids = {run["pid"] for run in runs}
        assert len(pids) >= TASKS // 3, f"pool processes were not recycled: {pids}"
        if writer == "exit":
            assert worker.terminate() == 0
        deadline = time.monotonic() + 10
        while (first := acquisitions(directory, job)) != TASKS:
            assert first < TASKS, f"{first:g} acquisitions counted for {TASKS} tasks"
            assert time.monotonic() < deadline, f"{first:g} acquisitions of {TASKS} after 10 s"
            time.sleep(0.05)
        assert [acquisitions(directory, job) for _ in range(6)] == [TASKS] * 6
        assert len(list(directory.glob("counter_*.db"))) >= len(pids)    # one file per pool process
    finally:
        worker.stop()
