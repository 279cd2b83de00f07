"""An invalid YLOCK stops the app at startup (servers run no system checks), while
``manage.py check`` still reports every problem with its id."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SETTINGS = '''
SECRET_KEY = "x"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ylock"]
DATABASES = {{}}
YLOCK = {ylock!r}
'''


def run(tmp_path: Path, ylock: object, *command: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "startup_settings.py").write_text(SETTINGS.format(ylock=ylock))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "startup_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    env.pop("YLOCK_URL", None)
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60)


@pytest.mark.parametrize("ylock, named", [
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"orders": {"TIMOUT": 5}}},
     "django_ylock.E005: YLOCK['LOCKS']['orders'] has unknown key 'TIMOUT'"),
    ({"ENGINE": {"default": {"URL": "local://"}}}, "django_ylock.E001: YLOCK has unknown key 'ENGINE'"),
    ({"ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0?socket_timeout=nan"}}}, "socket_timeout"),
])
def test_django_setup_refuses_an_invalid_setting(tmp_path: Path, ylock: object, named: str) -> None:
    done = run(tmp_path, ylock, "-c", "import django; django.setup(); print('started')")
    assert done.returncode != 0 and "started" not in done.stdout
    assert "ImproperlyConfigured" in done.stderr and named in done.stderr, done.stderr


def test_manage_py_check_still_reports_every_problem(tmp_path: Path) -> None:
    ylock = {"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"a": {"TIMOUT": 5}, "b": {"LEASE": -1}},
             "USER_LOCK": {"PATHS": "/api"}}
    done = run(tmp_path, ylock, "-m", "django", "check")
    assert done.returncode == 1
    for ident in ("django_ylock.E005", "django_ylock.E010"):
        assert ident in done.stderr, done.stderr
    assert done.stderr.count("django_ylock.E005") == 2


def test_a_valid_setting_starts(tmp_path: Path) -> None:
    done = run(tmp_path, {"ENGINES": {"default": {"URL": "local://"}}}, "-c",
               "import django; django.setup(); print('started')")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr
