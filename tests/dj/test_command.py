"""manage.py ylock: list (table, JSON), inspect, release, stats, errors."""
from __future__ import annotations

import json
import threading

import pytest
from django.core.management import CommandError, call_command

import django_ylock
import ylock
from tests.helpers import Runner, wait_until
from ylock.testing import free_port


def run(*args: str) -> str:
    import io
    out = io.StringIO()
    call_command("ylock", *args, stdout=out)
    return out.getvalue()


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
    assert set(row) == {"engine", "group", "name", "mode", "owners", "waiters", "ttl", "token"}
    assert json.loads(run("list", "--json", "--group", "nothing")) == []
    assert "no locks held" in run("list", "--group", "nothing")


def test_inspect(busy):
    text = run("inspect", "accounts", "7")
    assert "mode:    write" in text and "waiters: 1" in text
    assert "free" in run("inspect", "accounts", "8")


def test_release_needs_confirmation_and_reports_loss():
    holder_lost = threading.Event()
    ylock.events.subscribe(lambda e: holder_lost.set() if e.kind == "lost" and e.name == "9" else None)
    lock = django_ylock.locks("accounts")["9"]
    lock = ylock.Lock(lock.engine, "accounts", "9", lease=0.9)
    lock.lock()
    with pytest.raises(CommandError, match="--yes"):
        call_command("ylock", "release", "accounts", "9")     # no terminal: refuses
    assert "released accounts/9" in run("release", "accounts", "9", "--yes")
    assert "was not held" in run("release", "accounts", "9", "--yes")
    assert holder_lost.wait(10)
    with pytest.raises(ylock.LockLost):
        lock.unlock()


def test_stats_and_errors(settings):
    assert run("stats")
    with pytest.raises(CommandError, match="no engine 'nope'"):
        run("list", "--engine", "nope")
    settings.YLOCK = {"ENGINES": {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0",
                                              "OPTIONS": {"connect_timeout": 0.2}}}}
    with pytest.raises(CommandError, match="engine unreachable") as info:
        run("list")
    assert "\n" not in str(info.value)
