"""The pytest plugin as a user meets it: a fresh Django project (``django-admin
startproject``, pytest-django) and a fresh Flask app (its test client), each with a view
under ``locked``, tested for a 423, a 429, a 503 and a lost lock through the plugin's
fixtures, by ``python -m pytest`` in a subprocess with no server running.

The plugin comes in through its ``pytest11`` entry point, as setup.cfg declares it: the
subprocess sees a distribution whose entry points are setup.cfg's (the editable install
of the session may predate the declaration).
"""
from __future__ import annotations

import configparser
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Seconds of CPU (user + system) a whole user test run may take: "in under 5 s". CPU, not
#: the wall clock, which a loaded CI machine stretches; the wall time is in the message.
BUDGET = 5.0

DJANGO_SETTINGS = '''
INSTALLED_APPS += ["django_ylock"]
# production's engine: the tests never reach it (nothing listens on port 9)
YLOCK = {
    "ENGINES": {"default": {"URL": "redis://127.0.0.1:9/0"}},
    "LOCKS": {"accounts": {"TIMEOUT": 0.2}},
}
'''

DJANGO_VIEWS = '''
import django_ylock
from django.http import JsonResponse


@django_ylock.locked("accounts", key="account_id")
def transfer(request, account_id):
    lock = django_ylock.locks("accounts")[str(account_id)]
    # ... the work the lock protects ...
    if lock.lost:     # another request may have had the lock meanwhile: undo, refuse
        return JsonResponse({"error": "lost the lock"}, status=409)
    return JsonResponse({"token": lock.token})


@django_ylock.locked("accounts", key="account_id")
async def atransfer(request, account_id):
    lock = django_ylock.locks("accounts")[str(account_id)]
    if lock.lost:
        return JsonResponse({"error": "lost the lock"}, status=409)
    return JsonResponse({"token": lock.token})


@django_ylock.limited("exports", permits=2, key="tenant")
def export(request, tenant):
    return JsonResponse({"tenant": tenant})
'''

DJANGO_URLS = '''
from django.urls import path

from mysite import views

urlpatterns = [
    path("accounts/<int:account_id>/transfer", views.transfer),
    path("accounts/<int:account_id>/atransfer", views.atransfer),
    path("exports/<str:tenant>", views.export),
]
'''

DJANGO_TESTS = '''
import django_ylock
import pytest
import ylock


def test_ok(client, ylock_django):
    response = client.post("/accounts/7/transfer")
    assert response.status_code == 200 and response.json()["token"] > 0


def test_busy_answers_423(client, ylock_django):
    with ylock_django.busy(django_ylock.locks("accounts")["7"]):
        response = client.post("/accounts/7/transfer")
        assert client.post("/accounts/8/transfer").status_code == 200
    assert response.status_code == 423
    assert response["Retry-After"] == "1"
    assert client.post("/accounts/7/transfer").status_code == 200


def test_no_permit_answers_429(client, ylock_django):
    with ylock_django.busy(django_ylock.semaphores("exports", permits=2)["acme"]):
        assert client.get("/exports/acme").status_code == 429
        assert client.get("/exports/other").status_code == 200


def test_engine_down_answers_503(client, ylock_django):
    with ylock_django.unavailable():
        assert client.post("/accounts/7/transfer").status_code == 503
    assert client.post("/accounts/7/transfer").status_code == 200


def test_lost_lock(client, ylock_django):
    with ylock_django.lost(django_ylock.locks("accounts")["7"]):
        assert client.post("/accounts/7/transfer").status_code == 409
    assert client.post("/accounts/7/transfer").status_code == 200


def test_lost_lock_async_view(client, ylock_django):
    with ylock_django.lost(django_ylock.locks("accounts")["7"]):
        assert client.post("/accounts/7/atransfer").status_code == 409


def test_lost_lock_in_plain_code(ylock_django):
    lock = django_ylock.lock("orders")
    with pytest.raises(ylock.LockLost):
        with lock.write(timeout=1):
            ylock_django.lose(lock)
            assert lock.lost


def test_settings_fixture_and_override(settings, ylock_engine):
    settings.YLOCK = ylock_engine.django_setting(settings.YLOCK)
    assert django_ylock.engine() is ylock_engine
    assert django_ylock.lock("orders").engine is ylock_engine


def test_production_settings_are_back():
    assert "redis" in repr(django_ylock.engine())
'''

FLASK_APP = '''
from flask import Flask, jsonify
from flask_ylock import YLock

app = Flask(__name__)
# production's engine: the tests never reach it (nothing listens on port 9)
app.config.update(YLOCK_URL="redis://127.0.0.1:9/0", YLOCK_LOCKS={"accounts": {"TIMEOUT": 0.2}})
ylock = YLock(app)


@app.post("/accounts/<int:account_id>/transfer")
@ylock.locked("accounts", key="account_id")
def transfer(account_id):
    lock = ylock.locks("accounts")[str(account_id)]
    # ... the work the lock protects ...
    if lock.lost:     # another request may have had the lock meanwhile: undo, refuse
        return jsonify(error="lost the lock"), 409
    return jsonify(token=lock.token)


@app.get("/exports/<tenant>")
@ylock.limited("exports", permits=2, key="tenant")
def export(tenant):
    return jsonify(tenant=tenant)
'''

FLASK_TESTS = '''
import pytest

from app import app, ylock


@pytest.fixture
def engine(ylock_flask):
    return ylock_flask(app)


@pytest.fixture
def client():
    return app.test_client()


def test_ok(client, engine):
    assert client.post("/accounts/7/transfer").json["token"] > 0


def test_busy_answers_423(client, engine):
    with engine.busy("accounts", "7"):
        response = client.post("/accounts/7/transfer")
    assert response.status_code == 423
    assert response.headers["Retry-After"] == "1"


def test_no_permit_answers_429(client, engine):
    with app.app_context():
        acme = ylock.semaphores("exports", permits=2)["acme"]
    with engine.busy(acme):
        assert client.get("/exports/acme").status_code == 429
        assert client.get("/exports/other").status_code == 200


def test_engine_down_answers_503(client, engine):
    with engine.unavailable():
        assert client.post("/accounts/7/transfer").status_code == 503


def test_lost_lock(client, engine):
    with engine.lost("accounts", "7"):
        assert client.post("/accounts/7/transfer").status_code == 409
    assert client.post("/accounts/7/transfer").status_code == 200


def test_production_engine_is_back():
    with app.app_context():
        assert "redis" in repr(ylock.engine())
'''


def entry_point_site(tmp_path: Path) -> Path:
    """A folder holding a distribution with setup.cfg's ``pytest11`` entry points."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = cfg["options.entry_points"]["pytest11"].strip()
    site = tmp_path / "site"
    dist = site / "ylock_pytest_entry_point-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ylock-pytest-entry-point\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{declared}\n")
    return site


def run_pytest(project: Path, site: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``python -m pytest`` in ``project``; return the outcome, its wall and CPU seconds."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("YLOCK_URL", "DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=3"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, wall, cpu


def check(done: subprocess.CompletedProcess[str], wall: float, cpu: float, passed: int) -> None:
    report = f"exit {done.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, report
    assert f"{passed} passed" in done.stdout, report
    assert cpu < BUDGET, report
    print(report)       # the figures, for -s


def test_fresh_django_project(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run([sys.executable, "-m", "django", "startproject", "mysite", str(project)], check=True,
                   timeout=60)
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + DJANGO_SETTINGS)
    (project / "mysite" / "views.py").write_text(DJANGO_VIEWS)
    (project / "mysite" / "urls.py").write_text(DJANGO_URLS)
    (project / "pytest.ini").write_text("[pytest]\nDJANGO_SETTINGS_MODULE = mysite.settings\n")
    (project / "test_views.py").write_text(DJANGO_TESTS)
    check(*run_pytest(project, entry_point_site(tmp_path)), passed=DJANGO_TESTS.count("\ndef test_"))


def test_fresh_flask_app(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text(FLASK_APP)
    (project / "test_app.py").write_text(FLASK_TESTS)
    (project / "pytest.ini").write_text("[pytest]\n")
    check(*run_pytest(project, entry_point_site(tmp_path)), passed=FLASK_TESTS.count("\ndef test_"))


def test_plugin_imports_no_framework_when_loaded() -> None:
    code = textwrap.dedent("""
        import sys, time
        import pytest
        started = time.perf_counter()
        import ylock.testing.pytest_plugin
        took = time.perf_counter() - started
        frameworks = sorted({m.split(".")[0] for m in sys.modules} & {"django", "flask", "celery", "redis", "kazoo",
                                                                       "psycopg", "django_ylock", "flask_ylock"})
        print(frameworks, round(took * 1000))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    frameworks, _ = done.stdout.rsplit(" ", 1)
    assert frameworks == "[]", done.stdout


@pytest.mark.parametrize("fixture", ["ylock_engine", "ylock_django", "ylock_flask", "ylock_celery"])
def test_no_fixture_is_autouse(fixture: str) -> None:
    from ylock.testing import pytest_plugin

    marker = getattr(pytest_plugin, fixture)
    assert "autouse=True" not in repr(marker), marker
    assert getattr(getattr(marker, "_fixture_function_marker", None), "autouse", False) is False
