"""``flask ylock list|inspect|release|stats|run`` against the session's real redis-server."""
from __future__ import annotations

import json
import sys

import pytest

import ylock
from tests.helpers import Runner, wait_until
from ylock.leader import EXIT_BUSY
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
    def take_once() -> bool:
        other = ext_lock(app, ext, "acct-1")
        if not other.try_lock(10):
            return False
        other.unlock()
        return True
    waiter = Runner(take_once)
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
    assert refused.exit_code == 1 and refused.output.splitlines()[-1] == "not released"
    silent = runner.invoke(args=["ylock", "release", group, "acct-3"], input="")
    assert silent.exit_code == 1 and "not released: no answer" in silent.output
    assert json.loads(runner.invoke(args=["ylock", "list", "--group", group, "--json"]).output) != []
    done = runner.invoke(args=["ylock", "release", group, "acct-3"], input="y\n")
    assert done.exit_code == 0 and done.output.splitlines() == [
        f"Force-release {group}/acct-3 on default? Its holders lose it. [y/N] y", f"released {group}/acct-3 on default"]
    assert json.loads(runner.invoke(args=["ylock", "list", "--group", group, "--json"]).output) == []
    again = runner.invoke(args=["ylock", "release", group, "acct-3", "--yes"])
    assert again.exit_code == 0
    assert again.output.strip() == f"nothing to release: {group}/acct-3 on default was not held"
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
        assert stats["groups"][group] == {"held": 2, "readers": 1, "waiters": 0, "processes": 0, "counts": {}}
        table = runner.invoke(args=["ylock", "stats"]).output
        assert any(line.split()[:7] == [group, "2", "1", "0", "0", "0", "0"] for line in table.splitlines())
    finally:
        first.runlock()
        second.unlock()


def test_an_unreachable_engine_is_a_clear_error(make_app) -> None:
    app, _ = make_app(YLOCK_URL=f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5&connect_timeout=0.5")
    result = app.test_cli_runner().invoke(args=["ylock", "list"])
    assert result.exit_code == 1 and "is unreachable" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    unknown = app.test_cli_runner().invoke(args=["ylock", "list", "--engine", "nope"])
    assert unknown.exit_code == 1 and "no engine 'nope' in ENGINES" in unknown.output


def test_run_a_command_while_holding_a_named_lock(make_app, group: str, tmp_path) -> None:
    app, ext = make_app(YLOCK_LOCKS={"nightly": {"GROUP": group, "NAME": "report", "LEASE": 5}})
    runner = app.test_cli_runner()
    script = ('import os, sys; open(sys.argv[1], "w").write(os.environ["YLOCK_LOCK"] + " " + '
              'os.environ["YLOCK_TOKEN"]); sys.exit(3)')
    ran = runner.invoke(args=["ylock", "run", "nightly", "--wait", "--", sys.executable, "-c", script,
                              str(tmp_path / "out")])
    assert ran.exit_code == 3, ran.output
    where, token = (tmp_path / "out").read_text().split()
    assert where == f"{group}/report" and int(token) > 0
    with app.app_context():
        holder = ext.lock("nightly")
    with ylock.owner_scope() as other:             # another owner (this thread would re-enter)
        holder.lock()
    try:
        busy = runner.invoke(args=["ylock", "run", "nightly", "--", sys.executable, "-c", "pass"])
        assert busy.exit_code == EXIT_BUSY
        both = runner.invoke(args=["ylock", "run", "nightly", "--wait", "--timeout", "1", "--", "true"])
        assert both.exit_code == 2 and "--wait and --timeout exclude each other" in both.output
    finally:
        with ylock.owner_scope(other):
            holder.unlock()
