from __future__ import annotations

import pytest

import ylock


@pytest.fixture(autouse=True)
def ylock_on_redis(settings, redis_server):
    """Every Django test runs on the session's real redis-server, under its own key prefix,
    and must leave no lock held behind it (releases happen in ``finally``)."""
    settings.YLOCK = {"ENGINES": {"default": {"URL": redis_server.url, "OPTIONS": {"prefix": "dj"}}}}
    yield
    engine = ylock.engine_from_url(redis_server.url + "?prefix=dj")
    leftovers = list(engine.describe())
    for info in leftovers:
        engine.force_release(info.group, info.name)
    assert not [i for i in leftovers if i.owners], f"locks left held: {leftovers}"
