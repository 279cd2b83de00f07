from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import ylock


@pytest.fixture
def counter(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The views count their runs on the session's redis-server."""
    monkeypatch.setenv("YLOCK_TEST_COUNTER", redis_server.url)
    return str(redis_server.url)


@pytest.fixture
def django_site(settings: Any, redis_server: Any, counter: str) -> Iterator[str]:
    """tests/idempotency's Django views, their records in a Redis cache and their key locks
    on the session's redis-server (a prefix of the test's own); no lock left held after."""
    prefix = "idem" + uuid.uuid4().hex[:8]
    settings.ROOT_URLCONF = "tests.idempotency.urls"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": redis_server.url, "KEY_PREFIX": prefix}}
    settings.YLOCK = {"ENGINES": {"default": {"URL": redis_server.url, "OPTIONS": {"prefix": prefix}}},
                      "LOCKS": {"idempotency": {"LEASE": 2}}}
    yield prefix
    engine = ylock.engine_from_url(f"{redis_server.url}?prefix={prefix}")
    try:
        held = [i for i in engine.describe() if i.owners]
        assert not held, f"locks left held: {held}"
    finally:
        engine.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test's report gets the output of the gunicorn servers (tests/deploy/helpers.py)."""
    from tests.deploy.helpers import started

    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for served in started:
            report.sections.append((f"output of {served.name} (port {served.port})", served.output()[-8000:]))
