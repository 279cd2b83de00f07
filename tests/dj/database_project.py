"""A Django project run in a process of its own whose ``DATABASES["default"]`` is a test
server (the session's PostgreSQL or MariaDB) and whose lock engine is ``django://default``:
what the SQL engines' Django tests (tests/postgres/test_django.py, tests/mysql/test_django.py)
share. Each test writes its settings, its views (:data:`COUNTER_VIEWS` and its own) and its
run script (with :data:`HAMMER`), and :func:`run_django` returns what the script printed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The head of a views module: a counter read, paused and written back by ``/locked``
#: (inside the ``ledger`` lock) and ``/unlocked``, which loses updates.
COUNTER_VIEWS = """
import time

from django.db import connection, transaction
from django.http import JsonResponse
from django.urls import path

import django_ylock


def bump():
    with connection.cursor() as cursor:                  # read, pause, write: loses updates unlocked
        cursor.execute("SELECT v FROM dj_counter")
        value = cursor.fetchone()[0]
        time.sleep(0.005)
        cursor.execute("UPDATE dj_counter SET v = %s", [value + 1])


@django_ylock.locked("ledger", key=False)
def locked_bump(request):
    bump()
    return JsonResponse({"ok": True})


def unlocked_bump(request):
    bump()
    return JsonResponse({"ok": True})
"""

#: A run script's function that requests ``url`` ``n`` times from each of four threads, the
#: counter at 0, and returns the counter.
HAMMER = """
def hammer(url, n):
    from django.db import connection, connections
    from django.test import Client

    with connection.cursor() as cursor:
        cursor.execute("UPDATE dj_counter SET v = 0")
    def work():
        client = Client()
        for _ in range(n):
            assert client.get(url).status_code == 200
        connections.close_all()
    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    with connection.cursor() as cursor:
        cursor.execute("SELECT v FROM dj_counter")
        return cursor.fetchone()[0]
"""


def run_django(tmp_path: Path, *, settings: str, views: str, run: str, prefix: str, timeout: float) -> dict:
    """Write ``<prefix>settings.py``, ``<prefix>views.py`` and ``run.py`` into ``tmp_path``,
    run the script with those settings, and return the JSON it printed after ``RESULT``."""
    (tmp_path / f"{prefix}settings.py").write_text(settings)
    (tmp_path / f"{prefix}views.py").write_text(textwrap.dedent(views))
    (tmp_path / "run.py").write_text(textwrap.dedent(run))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": f"{prefix}settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])  # type: ignore[no-any-return]
