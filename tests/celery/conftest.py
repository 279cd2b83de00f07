"""Fixtures of the Celery tests: the session's redis-server as broker (db 1), result backend
(db 2) and lock engine (db 0); two prefork workers for most tests; workers' logs in the
report of a failing test."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from tests.celery.workers import Worker
from ylock.testing.redis import RedisServer

#: Workers started so far in this session (their logs go into failure reports).
started: list[Worker] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for worker in started:
            report.sections.append((f"log of {worker!r}", worker.read_log()))


@pytest.fixture(scope="session")
def celery_env(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Point the test app at the session's redis-server (variables read by tests.celery.settings)."""
    base = f"redis://127.0.0.1:{redis_server.port}"
    directory = tmp_path_factory.mktemp("celery")
    values = {"CELERY_YLOCK_TEST_BROKER": f"{base}/1", "CELERY_YLOCK_TEST_BACKEND": f"{base}/2",
              "CELERY_YLOCK_TEST_YLOCK_URL": f"{base}/0", "CELERY_YLOCK_TEST_EVENTS": str(directory / "events.jsonl"),
              "CELERY_YLOCK_TEST_DIR": str(directory)}
    client = redis.Redis(port=redis_server.port)
    for db in (1, 2):
        client.execute_command("SELECT", db)
        client.flushdb()
    client.close()
    os.environ.update(values)
    return values


@pytest.fixture(scope="session")
def tasks(celery_env: dict[str, str]) -> ModuleType:
    """The test app's module (tests.celery.app), once its settings can be read: tests reach
    the tasks through it, never by importing them (pytest's collection would evaluate the
    lazy task objects, and with them the settings, before the session set them)."""
    import tests.celery.app

    return tests.celery.app


@pytest.fixture(scope="session")
def app(tasks: ModuleType) -> Any:
    return tasks.app


@pytest.fixture(scope="session")
def workers(celery_env: dict[str, str], app: Any) -> Iterator[list[Worker]]:
    """Two prefork workers of two processes each, consuming the default queue."""
    directory = Path(celery_env["CELERY_YLOCK_TEST_DIR"])
    pair = [Worker(f"w{i}", directory, concurrency=2, pool="prefork") for i in (1, 2)]
    try:
        for worker in pair:
            started.append(worker.start())
        for worker in pair:
            worker.wait_ready()
        yield pair
    finally:
        for worker in pair:
            worker.stop()


@pytest.fixture
def solo(celery_env: dict[str, str], app: Any) -> Iterator[Callable[[], Worker]]:
    """Start workers of this test's own on the "solo" queue (threads pool: one process)."""
    directory = Path(celery_env["CELERY_YLOCK_TEST_DIR"])
    mine: list[Worker] = []

    def start() -> Worker:
        worker = Worker(f"solo{len(mine)}-{uuid.uuid4().hex[:6]}", directory, queues="solo", concurrency=2,
                        pool="threads")
        mine.append(worker)
        started.append(worker.start())
        return worker.wait_ready()

    try:
        yield start
    finally:
        for worker in mine:
            worker.stop()


@pytest.fixture
def job() -> str:
    """A lock key no other test uses."""
    return "job-" + uuid.uuid4().hex[:12]

