"""The ``ylock`` command line on real servers: its verbs, exit codes and errors; the same
output from ``ylock``, ``manage.py ylock`` and ``flask ylock``; and the deployment's stats,
published by real worker processes (and a forked one) and merged by a third process."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command

import ylock
import ylock.metrics
from tests.helpers import Runner, wait_until, waiters
from ylock import cli
from ylock.engines.local import LocalEngine
from ylock.testing import free_port

ROOT = Path(__file__).resolve().parents[1]


def ylock_cli(*args: str, input: str | None = None, env: dict[str, str] | None = None,
              stdin: int | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run the ``ylock`` script (as ``python -m ylock.cli``: the console script's ``main``)."""
    return subprocess.run([sys.executable, "-m", "ylock.cli", *args], cwd=ROOT, input=input, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def url(redis_server, group) -> str:
    """The session's redis-server, under a key prefix of this test's own."""
    return f"{redis_server.url}?prefix={group}"


def test_list_inspect_and_release_with_a_piped_confirmation(url: str, group: str) -> None:
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "orders", lease=30)
    lock.lock()
    def read_once() -> bool:
        reader = ylock.Lock(engine, group, "orders")
        # Queued until the piped release below, after six CLI runs: each a Python start,
        # which takes seconds on a loaded machine (10 s in all was not always enough).
        if not reader.try_rlock(60):
            return False
        reader.runlock()
        return True
    waiter = Runner(read_once)
    waiter.start()
    wait_until(lambda: waiters(engine, group, "orders"), what="a queued reader")
    try:
        listed = ylock_cli("--url", url, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = json.loads(listed.stdout)
        assert row["engine"] == "default" and row["group"] == group and row["name"] == "orders"
        assert row["mode"] == "write" and row["owners"] == [ylock.current_owner()] and row["token"] == lock.token
        assert len(row["waiters"]) == 1 and row["waiters"][0].startswith("read:")
        table = ylock_cli("--url", url, "list", "--group", group).stdout.splitlines()
        assert table[0].split() == list(ylock.report.COLUMNS)
        assert table[1].split()[:5] == ["default", group, "orders", "write", ylock.current_owner()]
        detail = ylock_cli("--url", url, "inspect", group, "orders").stdout
        assert f"{group}/orders on default" in detail and "mode:    write" in detail and "waiters: 1" in detail
        one = json.loads(ylock_cli("--url", url, "inspect", group, "orders", "--json").stdout)
        assert one["token"] == lock.token and one["engine"] == "default"
        assert ylock_cli("--url", url, "inspect", group, "free", "--json").stdout.strip() == "null"

        # Declined, and no answer at all (end of input): nothing released, exit 1.
        declined = ylock_cli("--url", url, "release", group, "orders", input="n\n")
        assert declined.returncode == 1 and declined.stdout.splitlines()[-1] == "not released"
        silent = ylock_cli("--url", url, "release", group, "orders", stdin=subprocess.DEVNULL)
        assert silent.returncode == 1 and "not released: no answer" in silent.stdout
        assert lock.held() and not lock.lost and [i.mode for i in engine.describe(group)] == ["write"]

        # `yes | ylock release ...`: a real pipe, not a terminal.
        piped = subprocess.run(f"yes | {sys.executable} -m ylock.cli --url '{url}' release {group} orders",
                               shell=True, cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout.splitlines() == [
            f"Force-release {group}/orders on default? Its holders lose it. [y/N] y",
            f"released {group}/orders on default"]
        assert "force-released" in piped.stderr and f"{group}/orders" in piped.stderr   # logged, with the user
        assert waiter.outcome() is True          # the queued reader got it
        again = ylock_cli("--url", url, "release", group, "orders", "--yes")
        assert again.returncode == 0
        assert again.stdout.strip() == f"nothing to release: {group}/orders on default was not held"
        # nothing was taken from anyone: no "force-released" line on stderr contradicting stdout
        assert "force-released" not in again.stderr and again.stderr.strip() == "", again.stderr
    finally:
        with pytest.raises(ylock.LockLost):
            lock.unlock()


def test_run_says_what_holds_the_lock_without_the_arguments(url: str, group: str) -> None:
    """While ``ylock run`` holds the lock, another process's describe() shows the command's
    name as the holder's context, and none of its arguments (they may be secrets)."""
    probe = ("import os, sys, ylock; e = ylock.engine_from_url(sys.argv[1]); "
             "print([o.get('what') for i in e.describe() for o in (i.context or {}).values()])")
    done = ylock_cli("--url", url, "run", "--lock", f"{group}/job", "--", sys.executable, "-c", probe, url,
                     "secret-argument")
    assert done.returncode == 0, done.stderr
    said = done.stdout.strip()
    assert f"ylock run {os.path.basename(sys.executable)}" in said, said
    assert "secret" not in said


def test_errors_are_one_line_with_exit_codes(redis_server, group: str) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=0.3&socket_timeout=0.3"
    for verb in (["list"], ["stats"], ["inspect", group, "x"], ["release", group, "x", "--yes"]):
        result = ylock_cli("--url", dead, *verb)
        assert result.returncode == 1, (verb, result.stderr)
        assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("ylock: error: engine 'default' (redis://127.0.0.1:") and \
            "is unreachable" in result.stderr and "Traceback" not in result.stderr
    bad = ylock_cli("--url", "mongodb://db/1", "list")
    assert bad.returncode == 1 and bad.stderr.startswith("ylock: error: unknown engine URL scheme 'mongodb'")
    option = ylock_cli("--url", redis_server.url + "?socket_timeout=soon", "list")
    assert option.returncode == 1 and "socket_timeout='soon' is invalid" in option.stderr
    no_url = ylock_cli("list", env={"YLOCK_URL": ""})
    assert no_url.returncode == 2 and "pass --url URL or set $YLOCK_URL" in no_url.stderr
    bad_name = ylock_cli("--url", redis_server.url, "inspect", group, "a/b")
    assert bad_name.returncode == 2 and "Traceback" not in bad_name.stderr and "name" in bad_name.stderr
    usage = ylock_cli("--url", redis_server.url, "frobnicate")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    from_env = ylock_cli("list", "--group", group, "--json", env={"YLOCK_URL": redis_server.url})
    assert from_env.returncode == 0 and json.loads(from_env.stdout) == []


def _ttl_free(text: str) -> str:
    """The lease left, a hold's age and a publication's age tick between two commands (a hold
    taken 0.9 s ago shows "for 0s" to the first and "for 1s" to the next): blank them out."""
    text = re.sub(r'"(ttl|age|published)": [0-9.]+', r'"\1": T', text)
    text = re.sub(r"\bfor \d+s\b", "for T", text)
    return re.sub(r"\b\d+s ago\b", "T", re.sub(r"\b\d+\.\ds\b", "T", text))


def test_the_three_command_lines_print_the_same(url: str, group: str, settings, capsys, tmp_path) -> None:
    from flask import Flask

    from flask_ylock import YLock

    settings.YLOCK = {"ENGINES": {"default": {"URL": url}}}
    app = Flask(f"same_{group}", instance_path=str(tmp_path))
    app.config.update(YLOCK_URL=url)
    YLock(app)
    flask_cli = app.test_cli_runner()

    def ylock_script(*args: str) -> str:
        assert cli.main(["--url", url, *args]) == 0
        return capsys.readouterr().out

    def manage(*args: str) -> str:
        from io import StringIO
        out = StringIO()
        call_command("ylock", *args, stdout=out)
        return out.getvalue()

    def flask(*args: str) -> str:
        result = flask_cli.invoke(args=["ylock", *args])
        assert result.exit_code == 0, result.output
        return result.output

    engine = ylock.engine_from_url(url)
    held = ylock.Locks(engine, group)
    held.lock("a")
    held.rlock("b")
    try:
        for args in (["list"], ["list", "--json"], ["list", "--group", group], ["inspect", group, "a"],
                     ["inspect", group, "b", "--json"], ["inspect", group, "nope"], ["stats"]):
            outputs = {_ttl_free(run(*args)) for run in (ylock_script, manage, flask)}
            assert len(outputs) == 1, (args, outputs)
        stats = [json.loads(_ttl_free(run("stats", "--json"))) for run in (ylock_script, manage, flask)]
        assert stats[0]["groups"][group] == {"held": 2, "readers": 1, "waiters": 0, "processes": 0, "counts": {}}
        assert stats[0] == stats[1] == stats[2]
    finally:
        held.unlock("a")
        held.runlock("b")


# -- the deployment's statistics ---------------------------------------------------------------------

WORKER = r"""
import sys, time
import ylock, ylock.metrics as metrics
from ylock.metrics import shared

url, group, n, role = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
metrics.configure({"STATS_PERIOD": 0.2, "STATS_TTL": 30})
engine = ylock.engine_from_url(url)
locks = ylock.Locks(engine, group, lease=10)
for i in range(n):
    with locks.write(f"item-{i % 3}"):
        time.sleep(0.001)
if role == "hold":
    locks.lock("busy")
    expected = {"acquired": n + 1, "released": n}
else:
    assert not locks.try_lock("busy", 0.05)
    expected = {"acquired": n, "released": n, "timed_out": 1}

def published():
    data = engine.read_stats().get(shared.process_id())
    window = shared.decode(data) if data else None
    counts = window and window["groups"].get(group, {}).get("counts")
    return counts and {k: v for k, v in counts.items() if k != "renewed"}   # the held lock's renewals

deadline = time.monotonic() + 20
while published() != expected:
    assert time.monotonic() < deadline, (published(), expected)
    time.sleep(0.02)
print("ready", shared.process_id(), flush=True)
sys.stdin.read()
if role == "hold":
    locks.unlock("busy")
"""


def _worker(url: str, group: str, n: int, role: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url, group, str(n), role], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline().split()      # type: ignore[union-attr]
    assert line[:1] == ["ready"], f"worker failed: {line}"
    return proc, line[1]


def test_stats_merge_every_process_published_on_redis(url: str, group: str, tmp_path: Path) -> None:
    holder, holder_id = _worker(url, group, 7, "hold")
    trier, trier_id = _worker(url, group, 5, "try")
    try:
        script = ylock_cli("--url", url, "stats", "--json")
        assert script.returncode == 0, script.stderr
        stats = json.loads(script.stdout)
        mine = stats["groups"][group]
        renewed = mine["counts"].pop("renewed", 0)           # the held lock's, as time goes by
        assert mine["counts"] == {"acquired": 13, "released": 12, "timed_out": 1}
        assert mine["held"] == 1 and mine["waiters"] == 0 and mine["processes"] == 2
        assert mine["wait"]["count"] == 14 and mine["hold"]["count"] == 12 and mine["release"]["count"] == 12
        assert mine["wait"]["max"] >= 0.05                    # the trier's timeout
        assert set(stats["processes"]) == {holder_id, trier_id}
        one, two = stats["processes"][holder_id], stats["processes"][trier_id]
        assert one["pid"] == holder.pid and two["pid"] == trier.pid and one["found_on"] == ["default"]
        assert one["groups"][group]["counts"] == {"acquired": 8, "released": 7,
                                                  **({"renewed": renewed} if renewed else {})}
        assert two["groups"][group]["counts"] == {"acquired": 5, "released": 5, "timed_out": 1}
        # count, sum and max merge exactly; percentiles stay within the maximum
        for span in ("wait", "hold", "release"):
            parts = [p["groups"][group][span] for p in (one, two)]
            assert mine[span]["sum"] == pytest.approx(sum(p["sum"] for p in parts), rel=1e-12)
            assert mine[span]["max"] == max(p["max"] for p in parts)
            assert mine[span]["p50"] <= mine[span]["p99"] <= mine[span]["max"]
        assert stats["window"] == 300 and "approximate" in stats["percentiles"]
        assert 0 <= one["age"] < 30

        # The Django command, from another process, reads the same.
        (tmp_path / "stats_settings.py").write_text(
            f"from tests.dj.settings import *\nYLOCK = {{'ENGINES': {{'default': {{'URL': {url!r}}}}}}}\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
               "DJANGO_SETTINGS_MODULE": "stats_settings"}
        django = subprocess.run([sys.executable, "-m", "django", "ylock", "stats", "--json"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
        assert django.returncode == 0, django.stderr
        from_django = json.loads(django.stdout)
        from_django["groups"][group]["counts"].pop("renewed", None)
        assert from_django["groups"][group] == mine
        def groups_of(found: dict) -> dict:
            out = {p: v["groups"] for p, v in found["processes"].items()}
            for groups in out.values():
                groups[group]["counts"].pop("renewed", None)
            return out
        assert groups_of(from_django) == groups_of(stats)

        table = ylock_cli("--url", url, "stats").stdout
        row = next(line.split() for line in table.splitlines() if line.startswith(group))
        assert row[1:7] == ["1", "0", "0", "13", "1", "0"] and row[-1] == "2"
        assert holder_id in table and trier_id in table and "published by 2 processes" in table
    finally:
        for proc in (holder, trier):
            proc.stdin.close()                 # type: ignore[union-attr]
            assert proc.wait(20) == 0


FORKER = r"""
import ctypes, os, sys, time
import ylock, ylock.metrics as metrics
from ylock.metrics import shared

url, group = sys.argv[1], sys.argv[2]
metrics.configure({"STATS_PERIOD": 0.1, "STATS_TTL": 30})
engine = ylock.engine_from_url(url)
lock = ylock.Lock(engine, group, "n")

def wait_published(acquired):
    deadline = time.monotonic() + 20
    while True:
        data = engine.read_stats().get(shared.process_id())
        window = shared.decode(data) if data else None
        if window and window["groups"].get(group, {}).get("counts", {}).get("acquired") == acquired:
            return
        assert time.monotonic() < deadline
        time.sleep(0.02)

for _ in range(3):
    with lock: pass
wait_published(3)
# os.fork() runs Python's fork hooks; a fork made from C (uWSGI's workers) does not
pid = os.fork() if sys.argv[3] == "os" else int(ctypes.PyDLL(None).fork())
if pid == 0:
    for _ in range(2):
        with lock: pass
    wait_published(2)
    print("child", shared.process_id(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", shared.process_id(), flush=True)
"""


@pytest.mark.parametrize("fork", ["os", "c"])
def test_a_forked_worker_publishes_its_own_stats(url: str, group: str, fork: str) -> None:
    result = subprocess.run([sys.executable, "-c", FORKER, url, group, fork], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    ids = dict(line.split() for line in result.stdout.splitlines())
    assert ids["child"] != ids["parent"]
    stats = json.loads(ylock_cli("--url", url, "stats", "--json").stdout)
    assert stats["processes"][ids["parent"]]["groups"][group]["counts"]["acquired"] == 3
    assert stats["processes"][ids["child"]]["groups"][group]["counts"]["acquired"] == 2   # not the parent's too
    assert stats["groups"][group]["counts"]["acquired"] == 5 and stats["groups"][group]["processes"] == 2


class StuckEngine(LocalEngine):
    """A local engine whose server hangs, then fails, whenever statistics are published."""

    def __init__(self, url: str = "local://") -> None:
        super().__init__(url)
        self.entered = threading.Event()
        self.let_go = threading.Event()
        self.threads: set[str] = set()

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.let_go.wait(10)
        raise ylock.EngineUnavailable("stats server down")


def test_publishing_is_off_the_lock_path_and_a_failing_engine_breaks_nothing(group: str) -> None:
    engine = StuckEngine()
    ylock.metrics.configure({"STATS_PERIOD": 0.05, "STATS_TTL": 5})
    try:
        lock = ylock.Lock(engine, group)
        with lock:
            pass
        assert engine.entered.wait(10)          # the publisher is stuck inside the engine ...
        started = time.monotonic()
        for _ in range(200):
            with lock:                          # ... and lock calls go on regardless
                pass
        assert time.monotonic() - started < 2.0
        assert engine.threads == {"ylock-stats-publisher"}
        failed = ylock.metrics.PUBLISHER.failed
        engine.let_go.set()
        wait_until(lambda: ylock.metrics.PUBLISHER.failed > failed, what="the failure to be counted")
        assert "stats server down" in ylock.metrics.PUBLISHER.last_error
        assert engine in ylock.metrics.PUBLISHER.engines()
        with lock:
            assert lock.held()
    finally:
        engine.let_go.set()
        ylock.metrics.shutdown()
    assert not ylock.metrics.PUBLISHER.enabled and ylock.metrics.PUBLISHER._thread is None


def test_configure_without_settings_publishes_nothing_and_settings_are_checked() -> None:
    try:
        ylock.metrics.configure(None)           # what Flask does without YLOCK_METRICS
        assert not ylock.metrics.PUBLISHER.enabled
        ylock.metrics.configure({"STATS_PERIOD": None})
        assert not ylock.metrics.PUBLISHER.enabled
    finally:
        ylock.metrics.shutdown()
    with pytest.raises(ylock.ConfigurationError, match=r"METRICS\['STATS_TTL'\] must be longer than STATS_PERIOD"):
        ylock.metrics.validate({"STATS_PERIOD": 10, "STATS_TTL": 5})
    with pytest.raises(ylock.ConfigurationError, match=r"METRICS\['STATS_PERIOD'\] must be a number"):
        ylock.metrics.validate({"STATS_PERIOD": "often"})
