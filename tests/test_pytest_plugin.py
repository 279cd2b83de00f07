"""The pytest plugin as a user meets it: a fresh Django project (``django-admin
startproject``, pytest-django) and a fresh Flask app (its test client), each with a view
under ``locked``, tested for a 423, a 429, a 503 and a lost lock through the plugin's
fixtures, and eager Celery tasks for TaskLocked, EngineUnavailable and a lost lock, each
by ``python -m pytest`` in a subprocess with no server running. The views and tests are
docs/testing.md's own examples, plus a few checks of the projects' own.

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

ROOT = Path(__file__).resolve().parent.parent
#: Seconds of CPU (user + system) a whole user test run may take: "in under 5 s". CPU, not
#: the wall clock, which a loaded CI machine stretches; the wall time is in the message.
BUDGET = 5.0
#: The distributions whose pytest plugins a user's project has: ylock's own (through the
#: entry point site below) and pytest-django. The other plugins in this environment are
#: the suite's own tools (hypothesis's alone costs 1.5 s of CPU at start), which a user's
#: project does not install; the subprocess does not load them.
USER_PLUGINS = {"ylock", "ylock-pytest-entry-point", "pytest-django"}


def guide_block(first_line: str) -> str:
    """The python block of docs/testing.md that opens with ``first_line`` (a file name
    comment): the guide's examples are what the user projects below run."""
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    found = [b for b in blocks if b.startswith(first_line + "\n")]
    assert len(found) == 1, f"docs/testing.md has {len(found)} blocks opening with {first_line!r}"
    return found[0]


# What the projects add to the guide's examples: an async view, a healthy request, the
# settings fixture, and the production settings back after the tests that changed them.
DJANGO_VIEWS_EXTRA = '''

@django_ylock.locked("accounts", key="account_id")
async def atransfer(request, account_id):
    lock = django_ylock.current_lock(request)
    if lock.lost:
        return JsonResponse({"error": "lost the lock"}, status=409)
    return JsonResponse({"token": lock.token})
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

DJANGO_TESTS_EXTRA = '''

def test_ok_and_free_after_the_fault(client, ylock_django):
    response = client.post("/accounts/7/transfer")
    assert response.status_code == 200 and response.json()["token"] > 0
    with ylock_django.busy(django_ylock.locks("accounts")["7"]):
        assert client.post("/accounts/8/transfer").status_code == 200
    with ylock_django.unavailable():
        pass
    with ylock_django.lost(django_ylock.locks("accounts")["7"]):
        pass
    assert client.post("/accounts/7/transfer").status_code == 200


def test_lost_lock_async_view(client, ylock_django):
    with ylock_django.lost(django_ylock.locks("accounts")["7"]):
        assert client.post("/accounts/7/atransfer").status_code == 409


def test_settings_fixture(settings, ylock_engine):
    settings.YLOCK = ylock_engine.django_setting(settings.YLOCK)
    assert django_ylock.engine() is ylock_engine
    assert django_ylock.lock("orders").engine is ylock_engine


def test_production_settings_are_back():
    assert "redis" in repr(django_ylock.engine())
'''

FLASK_APP_EXTRA = '''

@app.get("/exports/<tenant>")
@ylock.limited("exports", permits=2, key="tenant")
def export(tenant):
    return jsonify(tenant=tenant)
'''

FLASK_TESTS_EXTRA = '''

from app import ylock


def test_ok_and_free_after_the_fault(engine):
    client = app.test_client()
    assert client.post("/accounts/7/transfer").json["token"] > 0
    with engine.busy("accounts", "7"):
        response = client.post("/accounts/7/transfer")
    assert response.headers["Retry-After"] == "1"
    with engine.lost("accounts", "7"):
        pass
    assert client.post("/accounts/7/transfer").status_code == 200


def test_no_permit_answers_429(engine):
    with app.app_context():
        acme = ylock.semaphores("exports", permits=2)["acme"]
    with engine.busy(acme):
        assert app.test_client().get("/exports/acme").status_code == 429
        assert app.test_client().get("/exports/other").status_code == 200


def test_production_engine_is_back(request):
    assert not [name for name in request.fixturenames if name.startswith("ylock")]   # none is autouse
    with app.app_context():
        assert "redis" in repr(ylock.engine())
'''

# production's engine in the project's settings: the tests never reach it (nothing
# listens on port 9); the guide's settings block reads it from the environment
DJANGO_SETTINGS = '''
INSTALLED_APPS += ["django_ylock"]
YLOCK = {
    "ENGINES": {"default": {"URL": "redis://127.0.0.1:9/0"}},
    "LOCKS": {"accounts": {"TIMEOUT": 0.2}},
}
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


def foreign_plugins() -> list[str]:
    """``-p no:<name>`` for every ``pytest11`` entry point of a distribution a user's
    project would not have (this suite's tools)."""
    from importlib.metadata import entry_points
    names = {e.name for e in entry_points(group="pytest11")
             if e.dist is None or e.dist.name not in USER_PLUGINS}
    return [arg for name in sorted(names) for arg in ("-p", f"no:{name}")]


def run_pytest(project: Path, site: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``python -m pytest`` in ``project`` with the plugins a user's project has;
    return the outcome, its wall and CPU seconds."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("YLOCK_URL", "DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=3",
                           *foreign_plugins()],
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
    (project / "mysite" / "views.py").write_text(guide_block("# views.py") + DJANGO_VIEWS_EXTRA)
    (project / "mysite" / "urls.py").write_text(DJANGO_URLS)
    (project / "pytest.ini").write_text("[pytest]\nDJANGO_SETTINGS_MODULE = mysite.settings\n")
    tests = guide_block("# test_views.py") + DJANGO_TESTS_EXTRA
    (project / "test_views.py").write_text(tests)
    check(*run_pytest(project, entry_point_site(tmp_path)), passed=tests.count("\ndef test_"))


def test_fresh_flask_app(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text(guide_block("# app.py") + FLASK_APP_EXTRA)
    tests = guide_block("# test_app.py") + FLASK_TESTS_EXTRA
    (project / "test_app.py").write_text(tests)
    (project / "pytest.ini").write_text("[pytest]\n")
    check(*run_pytest(project, entry_point_site(tmp_path)), passed=tests.count("\ndef test_"))


def test_fresh_celery_tasks(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasks.py").write_text(guide_block("# tasks.py"))
    tests = guide_block("# test_tasks.py")
    (project / "test_tasks.py").write_text(tests)
    (project / "pytest.ini").write_text("[pytest]\n")
    check(*run_pytest(project, entry_point_site(tmp_path)), passed=tests.count("\ndef test_"))


def test_plugin_imports_no_framework_when_loaded() -> None:
    code = textwrap.dedent("""
        import sys, time
        import pytest
        started = time.perf_counter()
        import pytest_ylock
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
