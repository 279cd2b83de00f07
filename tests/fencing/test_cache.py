"""``django_ylock.cache.get_or_set`` over Django's Redis cache and ``flask_ylock``'s over
Flask-Caching, with threads of one process on real Redis locks: one computation for a
cold key while every other caller waits, one retry after a failure, the lock engine down
(computed, logged, never an error), ``lock_timeout`` spent, and bad input. (Across
processes: test_singleflight.py; across gunicorn workers: test_gunicorn_cache.py.)"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import django_ylock
import ylock
from tests.fencing.workers import wait_for_waiters
from ylock import singleflight
from ylock.testing import free_port

CALLERS = 8


@pytest.fixture
def django_cache(settings: Any, ylock_django: str, redis_server: Any) -> str:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": redis_server.url, "KEY_PREFIX": f"c{uuid.uuid4().hex[:8]}"}}
    return ylock_django


def callers(read: Callable[[], Any], count: int = CALLERS) -> list[Any]:
    """Call ``read`` from ``count`` threads started at once; return the values (or errors)."""
    start = threading.Barrier(count)
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        start.wait(30)
        try:
            results[i] = read()
        except Exception as exc:
            results[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


class Computation:
    """A compute() that waits until every other caller queues for the key's lock (so they
    all missed the cache), counts its calls and, with ``fail_first``, raises the first time."""

    def __init__(self, url: str, group: str, fail_first: bool = False) -> None:
        self.engine = ylock.engine_from_url(url)
        self.group, self.fail_first = group, fail_first
        self.calls = 0

    def __call__(self) -> dict[str, int]:
        wait_for_waiters(self.engine, self.group, CALLERS - 1 - self.calls)
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise RuntimeError("the report failed")
        return {"report": self.calls}


def test_django_cold_key_is_computed_once_while_the_others_wait(django_cache):
    compute = Computation(django_cache, "cache")
    results = callers(lambda: django_ylock.cache.get_or_set("report", compute, timeout=60, lock_timeout=30))
    assert compute.calls == 1 and results == [{"report": 1}] * CALLERS
    assert django_ylock.cache.get_or_set("report", lambda: {"report": "again"}) == {"report": 1}


def test_django_a_computation_that_raises_lets_exactly_one_other_caller_retry(django_cache):
    compute = Computation(django_cache, "cache", fail_first=True)
    results = callers(lambda: django_ylock.cache.get_or_set("report", compute, timeout=60, lock_timeout=30))
    assert compute.calls == 2
    errors = [r for r in results if isinstance(r, Exception)]
    assert [str(e) for e in errors] == ["the report failed"]
    assert [r for r in results if not isinstance(r, Exception)] == [{"report": 2}] * (CALLERS - 1)


def test_django_cached_none_is_a_value_and_versions_have_their_own_lock(django_cache):
    from django.core.cache import cache

    assert django_ylock.cache.get_or_set("nothing", lambda: None) is None
    assert django_ylock.cache.get_or_set("nothing", lambda: "recomputed") is None
    assert django_ylock.cache.get_or_set("nothing", lambda: "v2", version=2) == "v2"
    assert cache.get("nothing", "missing") is None and cache.get("nothing", version=2) == "v2"


def test_django_engine_down_computes_without_the_lock_and_logs(settings, caplog, django_cache):
    settings.YLOCK = {"ENGINES": {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5"}}}
    with caplog.at_level(logging.WARNING, logger="ylock.singleflight"):
        assert django_ylock.cache.get_or_set("down", lambda: 42, lock_timeout=1) == 42
    assert "computes without its lock" in caplog.text and "unavailable" in caplog.text
    assert django_ylock.cache.get_or_set("down", lambda: 0) == 42             # it was cached


def test_django_lock_timeout_computes_or_raises(django_cache, caplog):
    from django.core.cache import cache

    name = singleflight.lock_name(cache.make_key("slow"))
    busy = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with django_ylock.locks("cache")[name].write(timeout=5):
            busy.set()
            done.wait(30)
    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert busy.wait(10)
        with pytest.raises(ylock.LockTimeout):
            django_ylock.cache.get_or_set("slow", lambda: 1, lock_timeout=0.2, on_timeout="raise")
        with caplog.at_level(logging.WARNING, logger="ylock.singleflight"):
            assert django_ylock.cache.get_or_set("slow", lambda: 2, lock_timeout=0.2) == 2
        assert "still computing after lock_timeout=0.2" in caplog.text
    finally:
        done.set()
        thread.join()


def test_bad_input_is_rejected_by_name(django_cache):
    with pytest.raises(ylock.ConfigurationError, match="on_timeout"):
        django_ylock.cache.get_or_set("k", lambda: 1, on_timeout="wait")
    with pytest.raises(TypeError, match="compute must be a callable"):
        django_ylock.cache.get_or_set("k", 5)
    with pytest.raises(ValueError, match="cache key must be a non-empty str"):
        singleflight.lock_name("")


def test_any_key_becomes_a_valid_lock_name():
    long = "report/" + "x" * 500
    assert singleflight.lock_name(long) == singleflight.lock_name(long)           # the same lock every time
    assert singleflight.lock_name(long).startswith("sha256-") and len(singleflight.lock_name(long)) < 200
    assert singleflight.lock_name("report:2026-11") == "report:2026-11"          # readable in `ylock list`
    assert "/" not in singleflight.lock_name("a/b")


# -- Flask-Caching ----------------------------------------------------------------------------------


@pytest.fixture
def flask_app(redis_prefixed: str, redis_server: Any) -> Any:
    from flask import Flask
    from flask_caching import Cache

    from flask_ylock import YLock

    app = Flask(__name__)
    app.config.update(YLOCK_URL=redis_prefixed, CACHE_TYPE="RedisCache", CACHE_REDIS_URL=redis_server.url,
                      CACHE_KEY_PREFIX=f"f{uuid.uuid4().hex[:8]}")
    app.extensions["test_cache"] = Cache(app)
    app.extensions["test_ylock"] = YLock(app)
    yield app
    engine = ylock.engine_from_url(redis_prefixed)
    try:
        assert not [i for i in engine.describe() if i.owners]
    finally:
        engine.close()


def test_flask_caching_cold_key_is_computed_once_and_a_failure_retried_once(flask_app, redis_prefixed):
    cache, ext = flask_app.extensions["test_cache"], flask_app.extensions["test_ylock"]
    compute = Computation(redis_prefixed, "cache", fail_first=True)

    def read() -> Any:
        with flask_app.app_context():
            return ext.get_or_set(cache, "report", compute, timeout=60, lock_timeout=30)
    results = callers(read)
    assert compute.calls == 2
    assert [str(r) for r in results if isinstance(r, Exception)] == ["the report failed"]
    assert [r for r in results if not isinstance(r, Exception)] == [{"report": 2}] * (CALLERS - 1)
    with flask_app.app_context():
        from flask_ylock.cache import get_or_set

        assert get_or_set(cache, "report", lambda: "again") == {"report": 2}
        with pytest.raises(TypeError, match="Flask-Caching Cache"):
            get_or_set(object(), "report", lambda: 1)


def test_flask_caching_engine_down_computes_and_logs(redis_server, caplog):
    from flask import Flask
    from flask_caching import Cache

    from flask_ylock import YLock

    app = Flask(__name__)
    app.config.update(YLOCK_URL=f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5", CACHE_TYPE="SimpleCache")
    cache, ext = Cache(app), YLock(app)
    with app.app_context(), caplog.at_level(logging.WARNING, logger="ylock.singleflight"):
        assert ext.get_or_set(cache, "down", lambda: 7, lock_timeout=1) == 7
        assert ext.get_or_set(cache, "down", lambda: 0) == 7
    assert "unavailable" in caplog.text
