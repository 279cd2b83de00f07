"""The system checks of @idempotent and YLOCK["IDEMPOTENCY"]: stable ids, a message naming
the problem and a hint (what manage.py check prints)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import run_checks

import django_ylock
from django_ylock import conf

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def ylock_checks() -> dict[str, str]:
    return {m.id: f"{m.msg} | {m.hint}" for m in run_checks(tags=["ylock"]) if m.id.startswith("django_ylock.")}


@pytest.fixture
def project(settings: Any) -> Iterator[Any]:
    settings.ROOT_URLCONF = "tests.idempotency.urls"
    settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}}
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0"}}
    yield settings


def test_a_redis_cache_or_the_redis_engine_pass(project: Any) -> None:
    assert ylock_checks() == {}


def test_a_project_without_idempotent_views_is_not_checked(project: Any) -> None:
    project.ROOT_URLCONF = "tests.web.django_urls"
    project.CACHES = LOCMEM
    assert ylock_checks() == {}
    project.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}, "IDEMPOTENCY": {"TTL": 600}}
    assert list(ylock_checks()) == ["django_ylock.E014"]         # set up for them: checked


def test_every_kind_of_view_is_found(project: Any) -> None:
    from django_ylock.idempotency import decorated_views

    assert len(decorated_views()) == 7      # fbv, waiting, engine, async, cbv (dispatch), drf (post), @api_view
    assert len({decorator for decorator, _ in decorated_views()}) == 7


def test_a_per_process_cache_is_an_error_unless_debug(project: Any) -> None:
    project.CACHES = LOCMEM
    found = ylock_checks()
    assert list(found) == ["django_ylock.E014"]
    assert "cache='default': LocMemCache keeps idempotency records in each process" in found["django_ylock.E014"]
    assert "RedisCache" in found["django_ylock.E014"]
    project.DEBUG = True
    assert ylock_checks() == {}
    project.DEBUG = False
    project.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    assert "DummyCache" in ylock_checks()["django_ylock.E014"]


def test_a_cache_without_compare_and_set_or_no_such_alias_is_an_error(project: Any) -> None:
    project.CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "t"}}
    assert "DatabaseCache cannot keep idempotency records" in ylock_checks()["django_ylock.E015"]
    project.CACHES = {"other": LOCMEM["default"]}
    found = ylock_checks()["django_ylock.E015"]
    assert "cache='default': there is no such alias in CACHES" in found and "'other'" in found


def test_an_engine_without_a_place_for_records_is_an_error(project: Any) -> None:
    project.YLOCK = {"ENGINES": {"default": {"URL": "local://"}, "zk": {"URL": "zookeeper://127.0.0.1:1/x"}},
                     "LOCKS": {"idempotency": {"ENGINE": "zk"}}}
    found = ylock_checks()
    assert "the zookeeper engine" in found["django_ylock.E015"] and "cannot keep idempotency records" in \
        found["django_ylock.E015"]


def test_a_ttl_shorter_than_the_lease_is_a_warning(project: Any) -> None:
    project.ROOT_URLCONF = "tests.idempotency.short_urls"
    found = ylock_checks()
    assert list(found) == ["django_ylock.W005"]
    assert "ttl=10 s is shorter than the lease of its key locks (30 s" in found["django_ylock.W005"]
    project.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"idempotency": {"LEASE": 5}}}
    assert ylock_checks() == {}


@pytest.mark.parametrize("value, message", [
    ({"TTL": "a day"}, "YLOCK['IDEMPOTENCY']['TTL'] must be a number of seconds"),
    ({"CACHE": ""}, "YLOCK['IDEMPOTENCY']['CACHE'] must be a CACHES alias"),
    ({"REQUIRED": 1}, "YLOCK['IDEMPOTENCY']['REQUIRED'] must be True or False"),
    ({"HEADERS": "X"}, "YLOCK['IDEMPOTENCY'] has unknown key 'HEADERS'"),
    ("on", "YLOCK['IDEMPOTENCY'] must be a dict"),
])
def test_a_bad_setting_is_e013_naming_the_key(project: Any, value: Any, message: str) -> None:
    project.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}, "IDEMPOTENCY": value}
    found = ylock_checks()
    assert list(found) == ["django_ylock.E013"] and message in found["django_ylock.E013"]
    assert [p.code for p in conf.current().problems] == ["E013"]   # ready() stops the app on these


def test_the_setting_gives_the_defaults(project: Any, counter: str, redis_server: Any) -> None:
    from django.test import Client

    project.YLOCK = {"ENGINES": {"default": {"URL": redis_server.url + "?prefix=chk"}},
                     "IDEMPOTENCY": {"HEADER": "X-Request-Id", "CACHE": None, "REQUIRED": False}}
    assert Client().post("/fbv/pay", "{}", content_type="application/json").status_code == 201
    first = Client().post("/fbv/pay", "{}", content_type="application/json", HTTP_X_REQUEST_ID="r1" + counter[-5:])
    again = Client().post("/fbv/pay", "{}", content_type="application/json", HTTP_X_REQUEST_ID="r1" + counter[-5:])
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content


@pytest.mark.parametrize("arguments, message", [
    ({"ttl": 0}, "@idempotent ttl must be a number of seconds >= 1"),
    ({"cache": 5}, "@idempotent cache must be a CACHES alias"),
    ({"lease": -1}, "@idempotent lease must be a number of seconds"),
    ({"lock": "x/y"}, "@idempotent lock 'x/y' cannot name a lock family"),
    ({"header": ""}, "@idempotent header must be a non-empty string"),
])
def test_bad_arguments_fail_where_applied(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        django_ylock.idempotent(**arguments)
    assert message in str(raised.value)


def test_a_view_in_atomic_requests_is_a_warning(project: Any) -> None:
    project.ROOT_URLCONF = "tests.idempotency.atomic_urls"
    database = project.DATABASES["default"]
    before = database.get("ATOMIC_REQUESTS", False)
    database["ATOMIC_REQUESTS"] = True       # in place: overriding DATABASES would rebuild the connections
    try:
        found = ylock_checks()
    finally:
        database["ATOMIC_REQUESTS"] = before
    assert list(found) == ["django_ylock.W006"]
    assert "tests.idempotency.atomic_urls.in_transaction runs in the transaction of ATOMIC_REQUESTS ('default')" \
        in found["django_ylock.W006"] and "non_atomic_requests" in found["django_ylock.W006"]
