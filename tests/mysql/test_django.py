"""``@locked`` on ``django://default`` when ``DATABASES["default"]`` is MariaDB, in a Django
process of its own (PyMySQL standing in for mysqlclient): exclusion between concurrent
requests (the control without the lock loses updates), the lock on the engine's own
connections (never the request's), ``on_commit``, ``check --deploy`` quiet on a direct
connection and W004 through a proxy, and a fenced update refused to a stale token."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.dj import database_project
from tests.dj.database_project import COUNTER_VIEWS, HAMMER, ROOT
from ylock.testing.proxy import TcpProxy

SETTINGS = """
import pymysql

pymysql.install_as_MySQLdb()
SECRET_KEY = "tests-only"
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ylock", "tests.fencing.bankapp"]
ROOT_URLCONF = "myviews"
DATABASES = {{"default": {{"ENGINE": "django.db.backends.mysql", "NAME": "{database}", "USER": "{user}",
                          "PASSWORD": "{password}", "HOST": "127.0.0.1", "PORT": "{port}"}}}}
YLOCK = {{"ENGINES": {{"default": {{"URL": "django://default"}}}},
         "LOCKS": {{"ledger": {{"GROUP": "{group}", "TIMEOUT": 10}}}}}}
"""

VIEWS = COUNTER_VIEWS + """

@django_ylock.locked("ledger", key=False, on_commit=True)
def committed(request):
    group = django_ylock.lock("ledger").group
    engine = django_ylock.engine("default")
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        mine = cursor.fetchone()[0]
        cursor.execute("SELECT conn FROM ylock_holds WHERE grp = %s AND IS_USED_LOCK(mark) IS NOT NULL", [group])
        holders = [row[0] for row in cursor.fetchall()]
    seen = {"in_atomic": connection.in_atomic_block, "request": mine, "lock": holders,
            "held": [list(i.owners) for i in engine.describe(group) if i.owners]}
    transaction.on_commit(lambda: seen.setdefault("at_commit", [list(i.owners) for i in engine.describe(group)
                                                              if i.owners]))
    committed.seen = seen
    return JsonResponse({"ok": True})


urlpatterns = [path("locked", locked_bump), path("unlocked", unlocked_bump), path("commit", committed)]
"""

RUN = """
import io, json, threading
import django
django.setup()
from django.core.management import call_command
from django.db import connection, connections
from django.db.models import F
from django.test import Client
import django_ylock
import ylock
import myviews
from tests.fencing.bankapp.models import Account

out = {}
report = io.StringIO()
call_command("check", "--deploy", "--tag", "ylock", stdout=report, stderr=report)
out["check"] = report.getvalue()
call_command("migrate", "fencing_bank", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("DROP TABLE IF EXISTS dj_counter")
    cursor.execute("CREATE TABLE dj_counter (v int)")
    cursor.execute("INSERT INTO dj_counter VALUES (0)")

""" + HAMMER + """

out["locked"] = hammer("/locked", 10)
out["unlocked"] = hammer("/unlocked", 10)
assert Client().get("/commit").status_code == 200
out["commit"] = dict(myviews.committed.seen)
out["held_after"] = [list(i.owners) for i in django_ylock.engine("default").describe(django_ylock.lock("ledger").group)
                     if i.owners]
out["engine"] = repr(django_ylock.engine("default"))

account = Account.objects.create(balance=0)
lock = django_ylock.locks("ledger")[f"account-{account.pk}"]
with lock.write(timeout=5):
    stale = lock.token
with lock.write(timeout=5):
    django_ylock.fenced_update(Account.objects.filter(pk=account.pk), lock, balance=F("balance") + 100)
try:
    django_ylock.fenced_update(Account.objects.filter(pk=account.pk), stale, balance=10)
    out["stale"] = "written"
except ylock.FencedOut:
    out["stale"] = "FencedOut"
account.refresh_from_db()
out["balance"] = account.balance
print("RESULT " + json.dumps(out))
"""


def run_django(tmp_path: Path, server, group: str, port: int | None = None) -> dict:
    settings = SETTINGS.format(port=port or server.port, group=group, database=server.database, user=server.user,
                               password=server.password)
    return database_project.run_django(tmp_path, settings=settings, views=VIEWS, run=RUN, prefix="my", timeout=180)


def test_locked_views_and_fenced_writes_with_mariadb_as_database_and_lock_engine(mariadb_server, group, tmp_path):
    out = run_django(tmp_path, mariadb_server, group)
    assert out["locked"] == 40                     # 4 clients x 10 requests, none lost
    assert out["unlocked"] < 40                    # the control: without the lock updates are lost
    assert out["engine"].startswith("<DjangoMySQLEngine django://default (mysql://ylock@127.0.0.1:")
    assert "W004" not in out["check"] and "W002" not in out["check"], out["check"]
    seen = out["commit"]
    assert seen["in_atomic"] is True and len(seen["held"]) == 1 and seen["at_commit"] == seen["held"]
    assert seen["lock"] and seen["request"] not in seen["lock"]        # the engine's own connection
    assert out["held_after"] == []                                       # released after the commit
    assert out["stale"] == "FencedOut" and out["balance"] == 100         # the stale write changed nothing
    assert mariadb_server.password not in out["check"]


def test_w004_warns_about_a_proxy_in_front_of_mariadb(mariadb_server, group, tmp_path):
    with TcpProxy(mariadb_server.port) as proxy:
        out = run_django(tmp_path, mariadb_server, group, port=proxy.port)
    assert "W004" in out["check"] and "proxy=session" in out["check"], out["check"]
    assert out["locked"] == 40                     # a TCP proxy keeps sessions: the locks hold


def test_the_example_project_demo_runs_on_mariadb(mariadb_server, tmp_path):
    """The example project as docs/getting-started.md runs it on MySQL/MariaDB:
    ``DATABASE_URL=mysql://...`` and ``YLOCK_URL=django://default`` (the locks on the same
    server): three processes deposit concurrently, no update lost with the lock, the paused
    holder's fenced save refused."""
    import re

    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL")}
    # 10 threads per process wait for the cached report: more lock connections than the default 10.
    env.update(DATABASE_URL=mariadb_server.url, YLOCK_URL="django://default?max_connections=20",
               EXAMPLE_VAR=str(tmp_path))

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "example_project/manage.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert manage("migrate", "-v", "0").returncode == 0
    result = manage("ylock_demo", "--workers", "3", "--requests", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lock engine: django://default (mysql://" in result.stdout and "Traceback" not in result.stderr
    with_lock = re.search(r"with ylock: balance\s+(\d+) of 60 ->\s+(\d+) lost", result.stdout)
    assert with_lock and with_lock.groups() == ("60", "0"), result.stdout
    assert re.search(r"fenced_save\(\): stale write \(token \d+ < \d+\) refused \(ylock.FencedOut\) -> "
                     r"balance\s+100 of 100: nothing lost", result.stdout), result.stdout
