"""Fixtures of the deployment tests (the helpers are in :mod:`tests.deploy.helpers`): the
output of every server a failing test started goes into its report."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy.helpers import started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for served in started:
            report.sections.append((f"output of {served.name} (port {served.port})", served.output()[-6000:]))


@pytest.fixture(autouse=True)
def _forget_started() -> Iterator[None]:
    started.clear()
    yield


@pytest.fixture
def redis_url(redis_server: Any) -> str:
    """The session's redis-server, under a key prefix of this test's own."""
    return f"{redis_server.url}?prefix=deploy{uuid.uuid4().hex[:10]}"
