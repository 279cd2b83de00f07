"""``flask ylock list|inspect|release|stats`` against the session's real redis-server."""
from __future__ import annotations

import json

import pytest

import ylock
from tests.helpers import Runner, wait_until
from ylock.owner import current_owner
from ylock.testing import free_port


def hold(app, ext, name: str, mode: str = "write"):
    """Hold lock ``name`` of the accounts family in this thread; return the lock."""
    with app.app_context():
        lock = ext.locks("accounts")[name]
    (lock.lock if mode == "write" else lock.rlock)(timeout=5)
    return lock


def test_list_shows_holders_and_waiters(make_app, group: str) -> None:
    app, ext = make_app()
    runner = app.test_cli_runner()
    assert runner.invoke(args=["ylock", "list", "--group", group]).output.strip() == "no locks held or waited for"
    lock = hold(app, ext, "acct-1")
    waiter = Runner(lambda: ext_lock(app, ext, "acct-1").try_lock(10))
    waiter.start()
    wait_until(lambda: json.loads(runner.invoke(args=["ylock", "list", "--group", group, "--json"]).output)[0]
               ["waiters"], what="the waiter to queue")
    result = runner.invoke(args=["ylock", "list", "--group", group, "--json"])
    assert result.exit_code == 0
    [info] = json.loads(result.output)
    assert info["engine"] == "default" and info["group"] == group and info["name"] == "acct-1"
    assert info["mode"] == "write" and info["owners"] == [current_owner()] and info["token"] == lock.token
    [queued] = info["waiters"]
    assert queued.startswith("write:")
    table = runner.invoke(args=["ylock", "list", "--group", group]).output.splitlines()
    assert table[0].split() == ["ENGINE", "GROUP", "NAME", "MODE", "OWNERS", "WAITERS", "TTL", "TOKEN"]
    assert table[1].split()[:6] == ["default", group, "acct-1", "write", current_owner(), queued]
    lock.unlock()
    assert waiter.outcome() is True


def ext_lock(app, ext, name: str):
    with app.app_context():
        return ext.locks("accounts")[name]


def test_inspect_one_lock(make_app, group: str) -> None:
    app, ext = make_app()
    runner = app.test_cli_runner()
    lock = hold(app, ext, "acct-2", mode="read")
    try:
        result = runner.invoke(args=["ylock", "inspect", group, "acct-2"])
        assert result.exit_code == 0
        lines = result.output.splitlines()
        assert lines[0] == f"{group}/acct-2 on default" and lines[1].split() == ["mode:", "read"]
        assert lines[2].split() == ["owners:", current_owner()]
        as_json = json.loads(runner.invoke(args=["ylock", "inspect", group, "acct-2", "--json"]).output)
        assert as_json["mode"] == "read" and as_json["engine"] == "default"
        missing = runner.invoke(args=["ylock", "inspect", group, "nope"])
        assert missing.exit_code == 0 and missing.output.strip() == f"{group}/nope on default: free, nobody waiting"
        assert runner.invoke(args=["ylock", "inspect", group, "nope", "--json"]).output.strip() == "null"
    finally:
        lock.runlock()


def test_release_asks_first(make_app, group: str) -> None:
    app, ext = make_app()
    runner = app.test_cli_runner()
    lock = hold(app, ext, "acct-3")
    refused = runner.invoke(args=["ylock", "release", group, "acct-3"], input="n\n")
    assert refused.exit_code == 1 and "Aborted" in refused.output
    assert json.loads(runner.invoke(args=["ylock", "list", "--group", group, "--json"]).output) != []
    done = runner.invoke(args=["ylock", "release", group, "acct-3"], input="y\n")
    assert done.exit_code == 0 and f"released {group}/acct-3" in done.output
    assert json.loads(runner.invoke(args=["ylock", "list", "--group", group, "--json"]).output) == []
    again = runner.invoke(args=["ylock", "release", group, "acct-3", "--yes"])
    assert again.exit_code == 0 and "nothing to release" in again.output
    # The holder learns it at release time.
    with pytest.raises(ylock.LockLost):
        lock.unlock()


def test_stats_counts_per_group(make_app, group: str) -> None:
    app, ext = make_app()
    runner = app.test_cli_runner()
    first, second = hold(app, ext, "a", "read"), hold(app, ext, "b")
    try:
        result = runner.invoke(args=["ylock", "stats", "--json"])
        stats = json.loads(result.output)
        assert stats["groups"][group] == {"held": 2, "readers": 1, "waiters": 0}
        assert "exporters" in stats["process"]
        table = runner.invoke(args=["ylock", "stats"]).output
        assert any(line.split() == [group, "2", "1", "0"] for line in table.splitlines())
    finally:
        first.runlock()
        second.unlock()


def test_an_unreachable_engine_is_a_clear_error(make_app) -> None:
    app, _ = make_app(YLOCK_URL=f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5&connect_timeout=0.5")
    result = app.test_cli_runner().invoke(args=["ylock", "list"])
    assert result.exit_code == 1 and "is unreachable" in result.output
    unknown = app.test_cli_runner().invoke(args=["ylock", "list", "--engine", "nope"])
    assert unknown.exit_code == 1 and "no engine 'nope' in ENGINES" in unknown.output
