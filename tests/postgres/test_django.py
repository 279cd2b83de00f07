"""``@locked`` on the ``django://default`` engine, in a Django process of its own whose
DATABASES point at the test session's PostgreSQL (the plugin's own tests run on sqlite):
exclusion between concurrent requests, the lock on connections of the engine's own (never
the request's), ``on_commit`` in both scopes, the system checks, and a bad alias."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.dj import database_project
from tests.dj.database_project import COUNTER_VIEWS, HAMMER

SETTINGS = """
SECRET_KEY = "tests-only"
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ylock"]
ROOT_URLCONF = "pgviews"
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "ylock", "USER": "ylock",
                          "HOST": "127.0.0.1", "PORT": "{port}", "OPTIONS": {{"sslmode": "disable"}}}}}}
YLOCK = {{"ENGINES": {{"default": {{"URL": "django://default"}},
                      "xact": {{"URL": "django://default?scope=transaction"}}}},
         "LOCKS": {{"ledger": {{"GROUP": "{group}", "TIMEOUT": 10}},
                   "xledger": {{"ENGINE": "xact", "GROUP": "{group}x", "TIMEOUT": 10}}}}}}
"""

VIEWS = COUNTER_VIEWS + """

def holders(alias, name):
    engine = django_ylock.engine(alias)
    group = django_ylock.lock(name).group
    return [list(i.owners) for i in engine.describe(group) if i.owners]


def whose(alias, name):
    # the backend that holds the lock (by its application name) vs the request's own backend
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        mine = cursor.fetchone()[0]
        cursor.execute("SELECT pid, state FROM pg_stat_activity WHERE application_name LIKE %s",
                       ["%:" + django_ylock.request_lock.request_owner(REQUEST[0])])
        return mine, cursor.fetchall()


REQUEST = [None]


def make_view(alias, name):
    @django_ylock.locked(name, key=False, on_commit=True)
    def view(request):
        REQUEST[0] = request
        seen = {"in_atomic": connection.in_atomic_block, "held_in_view": holders(alias, name)}
        seen["request_backend"], seen["lock_backends"] = whose(alias, name)
        transaction.on_commit(lambda: seen.setdefault("held_at_commit", holders(alias, name)))
        view.seen = seen
        return JsonResponse({"ok": True})
    return view


session_view = make_view("default", "ledger")
xact_view = make_view("xact", "xledger")

urlpatterns = [path("locked", locked_bump), path("unlocked", unlocked_bump),
               path("commit", session_view), path("xcommit", xact_view)]
"""

RUN = """
import json, os, sys, threading
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from django.test import Client
import django_ylock
import pgviews

out = {}
call_command("check", "--deploy", "--fail-level", "ERROR", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("DROP TABLE IF EXISTS dj_counter; CREATE TABLE dj_counter (v int); "
                   "INSERT INTO dj_counter VALUES (0)")

""" + HAMMER + """

out["locked"] = hammer("/locked", 10)
out["unlocked"] = hammer("/unlocked", 10)
for url, view in (("/commit", pgviews.session_view), ("/xcommit", pgviews.xact_view)):
    assert Client().get(url).status_code == 200
    seen = dict(view.seen)
    seen["held_after"] = pgviews.holders("default" if url == "/commit" else "xact",
                                         "ledger" if url == "/commit" else "xledger")
    out[url] = seen
out["engine"] = repr(django_ylock.engine("default"))
out["pooler"] = django_ylock.engine("default").detect_pooler()
print("RESULT " + json.dumps(out))
"""


def run_django(tmp_path: Path, port: int, group: str, run: str = RUN, settings: str = SETTINGS) -> dict:
    return database_project.run_django(tmp_path, settings=settings.format(port=port, group=group), views=VIEWS,
                                       run=run, prefix="pg", timeout=120)


def test_locked_views_on_the_django_database_engine(postgres_server, group, tmp_path):
    out = run_django(tmp_path, postgres_server.port, group)
    assert out["locked"] == 40                     # 4 clients x 10 requests, none lost
    assert out["unlocked"] < 40                    # the control: without the lock updates are lost
    assert out["engine"].startswith("<DjangoDatabaseEngine django://default (postgresql://ylock@127.0.0.1:")
    assert out["pooler"] is None
    for url, state in (("/commit", "idle"), ("/xcommit", "idle in transaction")):
        seen = out[url]
        assert seen["in_atomic"] is True                        # on_commit: the view ran in a transaction
        assert len(seen["held_in_view"]) == 1 and seen["held_at_commit"] == seen["held_in_view"]
        assert seen["held_after"] == []                          # released once the transaction committed
        (pid, lock_state), = seen["lock_backends"]
        assert pid != seen["request_backend"] and lock_state == state   # the engine's own connection


def test_a_bad_alias_fails_the_checks(postgres_server, group, tmp_path):
    settings = SETTINGS.replace('"URL": "django://default"}', '"URL": "django://nosuchdb"}')
    run = """
    import django
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError
    try:
        django.setup()
        call_command("check", verbosity=0)
    except (SystemCheckError, Exception) as exc:
        print("RESULT " + __import__("json").dumps(str(exc)))
    """
    out = run_django(tmp_path, postgres_server.port, group, run, settings)
    assert "nosuchdb" in out and "DATABASES" in out


@pytest.mark.parametrize("url, message", [("django://default/x", "django://ALIAS"),
                                          ("django://u@default", "django://ALIAS")])
def test_malformed_django_urls(url, message):
    import ylock

    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(url)
