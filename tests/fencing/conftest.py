"""Fixtures of the fencing tests: Django on the session's real redis-server (a key prefix of
the test's own), nothing left held afterwards."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import ylock


@pytest.fixture
def redis_prefixed(redis_server: Any) -> str:
    """The session's redis-server under a key prefix of this test's own."""
    return f"{redis_server.url}?prefix=fence{uuid.uuid4().hex[:10]}"


@pytest.fixture
def ylock_django(settings: Any, redis_prefixed: str) -> Iterator[str]:
    """Point Django's YLOCK at the real Redis; assert nothing is left held."""
    settings.YLOCK = {"ENGINES": {"default": {"URL": redis_prefixed}},
                      "LOCKS": {"accounts": {"GROUP": "accounts", "LEASE": 5, "TIMEOUT": 5},
                                "cache": {"GROUP": "cache", "LEASE": 5}}}
    yield redis_prefixed
    engine = ylock.engine_from_url(redis_prefixed)
    try:
        held = [i for i in engine.describe() if i.owners]
        for info in held:
            engine.force_release(info.group, info.name)
        assert not held, f"locks left held: {held}"
    finally:
        engine.close()
