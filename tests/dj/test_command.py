"""manage.py ylock: list (table, JSON), inspect, release (asked, piped), stats, run, errors."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import django_ylock
import ylock
from tests.helpers import Runner, wait_until
from ylock.leader import EXIT_BUSY
from ylock.testing import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, **options: object) -> str:
    out = io.StringIO()
    call_command("ylock", *args, stdout=out, **options)
    return out.getvalue()


def manage(tmp_path: Path, url: str, *args: str, shell_prefix: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``manage.py ylock ARGS`` in a process of its own, on ``url`` (after ``shell_prefix |``)."""
    (tmp_path / "command_settings.py").write_text(
        f"from tests.dj.settings import *\nYLOCK = {{'ENGINES': {{'default': {{'URL': {url!r}}}}}}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "DJANGO_SETTINGS_MODULE": "command_settings"}
    argv = [sys.executable, "-m", "django", "ylock", *args]
    if shell_prefix:
        return subprocess.run(f"{shell_prefix} | {' '.join(map(repr, argv))}", shell=True, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def busy():
    """Hold accounts/7 for writing and queue a reader behind it."""
    lock = django_ylock.locks("accounts")["7"]
    lock.lock()
    waiter = Runner(lambda: django_ylock.locks("accounts")["7"].rlock(timeout=10) or
                    django_ylock.locks("accounts")["7"].runlock())
    waiter.start()
    wait_until(lambda: any(i.waiters for i in django_ylock.engine().describe("accounts")), what="queued reader")
    yield lock
    lock.unlock()
    waiter.outcome()


def test_list_table_and_json(busy):
    table = run("list")
    assert "GROUP" in table and "accounts" in table and "write" in table and str(busy.token) in table
    rows = json.loads(run("list", "--json"))
    row = next(r for r in rows if r["group"] == "accounts" and r["name"] == "7")
    assert row["mode"] == "write" and row["owners"] == [ylock.current_owner()]
    assert row["token"] == busy.token and 0 < row["ttl"] <= 30
    assert len(row["waiters"]) == 1 and row["waiters"][0].startswith("read:")
    assert set(row) >= {"engine", "group", "name", "mode", "owners", "waiters", "ttl", "token"}
    assert json.loads(run("list", "--json", "--group", "nothing")) == []
    assert "no locks held" in run("list", "--group", "nothing")


def test_inspect(busy):
    text = run("inspect", "accounts", "7")
    assert "mode:    write" in text and "waiters: 1" in text
    assert "free" in run("inspect", "accounts", "8")
    one = json.loads(run("inspect", "accounts", "7", "--json"))
    assert one["mode"] == "write" and one["token"] == busy.token and one["engine"] == "default"
    assert run("inspect", "accounts", "8", "--json").strip() == "null"


def test_release_needs_confirmation_and_reports_loss():
    holder_lost = threading.Event()
    ylock.events.subscribe(lambda e: holder_lost.set() if e.kind == "lost" and e.name == "9" else None)
    lock = django_ylock.locks("accounts")["9"]
    lock = ylock.Lock(lock.engine, "accounts", "9", lease=0.9)
    lock.lock()
    out = io.StringIO()
    with pytest.raises(SystemExit) as refused:
        call_command("ylock", "release", "accounts", "9", stdout=out, stdin=io.StringIO("n\n"))
    assert refused.value.code == 1 and out.getvalue().splitlines()[-1] == "not released"
    with pytest.raises(SystemExit) as silent:
        call_command("ylock", "release", "accounts", "9", stdout=io.StringIO())   # stdin: nothing to read
    assert silent.value.code == 1 and lock.held() and not lock.lost
    answered = run("release", "accounts", "9", stdin=io.StringIO("yes\n"))
    assert answered.splitlines() == ["Force-release accounts/9 on default? Its holders lose it. [y/N] yes",
                                     "released accounts/9 on default"]
    assert "was not held" in run("release", "accounts", "9", "--yes")
    assert holder_lost.wait(10)
    with pytest.raises(ylock.LockLost):
        lock.unlock()


def test_a_piped_confirmation_releases(redis_server, tmp_path):
    engine = ylock.engine_from_url(redis_server.url + "?prefix=dj")
    lock = ylock.Lock(engine, "accounts", "10")
    lock.lock()
    done = manage(tmp_path, redis_server.url + "?prefix=dj", "release", "accounts", "10", shell_prefix="yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "released accounts/10 on default"
    assert "force-released accounts/10" in done.stderr                   # logged with the user's name
    with pytest.raises(ylock.LockLost):
        lock.unlock()


def test_stats_json_and_table(settings):
    lock = django_ylock.locks("accounts")["11"]
    lock.rlock()
    try:
        stats = json.loads(run("stats", "--json"))
        assert stats["groups"]["accounts"]["held"] == 1 and stats["groups"]["accounts"]["readers"] == 1
        assert set(stats) == {"window", "percentiles", "groups", "processes"}
        table = run("stats")
        assert any(line.split()[:4] == ["accounts", "1", "1", "0"] for line in table.splitlines())
    finally:
        lock.runlock()


def test_run_a_command_while_holding_a_named_lock(settings, tmp_path):
    settings.YLOCK = {**settings.YLOCK, "LOCKS": {"nightly": {"GROUP": "jobs", "NAME": "report", "LEASE": 5}}}
    script = ('import os, sys; open(sys.argv[1], "w").write(os.environ["YLOCK_LOCK"] + " " + '
              'os.environ["YLOCK_TOKEN"]); sys.exit(3)')
    with pytest.raises(SystemExit) as ran:
        call_command("ylock", "run", "nightly", "--", sys.executable, "-c", script, str(tmp_path / "out"))
    assert ran.value.code == 3
    where, token = (tmp_path / "out").read_text().split()
    assert where == "jobs/report" and int(token) > 0
    holder = django_ylock.lock("nightly")
    with ylock.owner_scope() as other:             # another owner (this thread would re-enter)
        holder.lock()
    try:
        with pytest.raises(SystemExit) as busy:
            call_command("ylock", "run", "nightly", "--", sys.executable, "-c", "pass")
        assert busy.value.code == EXIT_BUSY
    finally:
        with ylock.owner_scope(other):
            holder.unlock()
    with pytest.raises(CommandError, match="the following arguments are required"):
        call_command("ylock", "run", "nightly")


def test_errors(settings):
    with pytest.raises(CommandError, match="no engine 'nope' in ENGINES"):
        run("list", "--engine", "nope")
    settings.YLOCK = {"ENGINES": {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0",
                                              "OPTIONS": {"connect_timeout": 0.2}}}}
    for verb in (["list"], ["stats", "--json"], ["inspect", "a", "b"]):
        with pytest.raises(CommandError, match="engine 'default' .* is unreachable") as info:
            run(*verb)
        assert "\n" not in str(info.value) and info.value.returncode == 1
