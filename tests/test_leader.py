"""Leadership (``ylock.leader``) and ``ylock run``, with real processes on a real
redis-server and ZooKeeper: exactly one of two competing runners runs its command, the other
takes over within the lease once the first is SIGKILLed, a runner whose lock is
force-released stops its command (SIGTERM, then SIGKILL) and exits with the lost code."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import ylock
from tests.helpers import Runner, wait_until
from ylock.leader import EXIT_BUSY, EXIT_LOST, EXIT_NOT_FOUND, Leadership

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# The command the runners run: logs "TAG PID TOKEN EVENT TIME" lines to a file, ticks every
# 20 ms; on SIGTERM it logs "term" and then ignores it ("stubborn") or exits 7 ("polite").
CHILD = r"""
import os, signal, sys, time
path, tag, manner = sys.argv[1:4]
def log(event):
    with open(path, "a") as f:
        f.write(f"{tag} {os.getpid()} {os.environ['YLOCK_TOKEN']} {event} {time.time():.3f}\n")
def on_term(signum, frame):
    log("term")
    if manner == "polite":
        sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
log("start")
while True:
    log("tick")
    time.sleep(0.02)
"""


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(params=["redis", "zookeeper"])
def url(request: pytest.FixtureRequest, group: str) -> str:
    """Each engine, with a short lease: Redis's is ``--lease``, ZooKeeper's the session."""
    if request.param == "redis":
        return f"{request.getfixturevalue('redis_server').url}?prefix={group}"
    return request.getfixturevalue("zookeeper_server").url(f"/{group}") + f"?session_timeout={ZK_SESSION:g}"


LEASE = 1.5
#: ZooKeeper's "lease" is the session: 3 s, so that its quorum guard (half of it) does not call
#: a hold lost while the shared server's log fsync waits behind another process's on a loaded
#: machine (1.5 s sessions gave the guard 0.75 s).
ZK_SESSION = 3.0


def runner(url: str, group: str, path: Path, tag: str, *options: str,
           manner: str = "stubborn") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", f"{group}/job",
                             "--lease", str(LEASE), *options, "--", sys.executable, "-c", CHILD, str(path), tag,
                             manner], cwd=ROOT, text=True, stderr=subprocess.PIPE)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_one_runner_runs_and_the_other_takes_over_after_a_sigkill(url: str, group: str, tmp_path: Path,
                                                                   procs: list) -> None:
    log = tmp_path / "log"
    first = runner(url, group, log, "A", "--wait")
    procs.append(first)
    wait_until(lambda: any(line[3] == "tick" for line in lines(log)), timeout=15, what="A's command to run")
    second = runner(url, group, log, "B", "--wait", manner="polite")
    procs.append(second)
    time.sleep(1.0)                                   # B waits while A leads: B's command must not run
    assert {line[0] for line in lines(log)} == {"A"}
    busy = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", f"{group}/job",
                           "--", "true"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert busy.returncode == EXIT_BUSY and f"{group}/job is busy" in busy.stderr
    a_pid, a_token = int(lines(log)[0][1]), int(lines(log)[0][2])

    first.send_signal(signal.SIGKILL)
    killed = time.time()
    first.wait(5)
    wait_until(lambda: not alive(a_pid), timeout=5, what="A's command to die with its runner")
    wait_until(lambda: any(line[0] == "B" for line in lines(log)), timeout=10, what="B to take over")
    b_start = next(line for line in lines(log) if line[0] == "B")
    took = float(b_start[4]) - killed
    # Within the lease (Redis: the key expires; ZooKeeper: the session), plus a poll,
    # plus starting the command (a second or two on a loaded machine: the bound tells a
    # lease-driven takeover from a stuck one); never while A's command still ran.
    expiry = ZK_SESSION if url.startswith("zookeeper") else LEASE
    assert expiry / 2 < took < expiry + 4.0, took         # not before the dead holder's lease ran out
    assert int(b_start[2]) > a_token                                    # a newer fencing token
    last_a = max(float(line[4]) for line in lines(log) if line[0] == "A")
    assert last_a < float(b_start[4])                                   # exclusion: no overlap
    second.send_signal(signal.SIGTERM)                                  # forwarded: the command stops
    assert second.wait(10) == 7                                         # with its own exit code


def test_a_force_released_runner_stops_its_command_and_exits_lost(url: str, group: str, tmp_path: Path,
                                                                 procs: list) -> None:
    log = tmp_path / "log"
    proc = runner(url, group, log, "A", "--grace", "0.5")
    procs.append(proc)
    wait_until(lambda: any(line[3] == "tick" for line in lines(log)), timeout=15, what="the command to run")
    child = int(lines(log)[0][1])
    released_at = time.time()
    release = subprocess.run(f"yes | {sys.executable} -m ylock.cli --url '{url}' release {group} job", shell=True,
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert release.returncode == 0 and f"released {group}/job on default" in release.stdout, release.stderr
    assert proc.wait(15) == EXIT_LOST
    stderr = proc.stderr.read()                                          # type: ignore[union-attr]
    assert f"lost the lock {group}/job" in stderr and "SIGKILL" in stderr
    events = [line for line in lines(log) if line[1] == str(child)]
    term = next(float(line[4]) for line in events if line[3] == "term")   # SIGTERM first ...
    assert not alive(child)                                              # ... then SIGKILL
    assert term - released_at < LEASE + 2.0                             # Redis: the next renewal
    # dead after the grace period (0.5 s), plus the SIGKILL's delivery on a loaded machine
    assert max(float(line[4]) for line in events) - term < 0.5 + 1.0


def test_run_passes_the_exit_code_the_token_and_forwarded_signals(redis_server, group: str, tmp_path: Path) -> None:
    url = f"{redis_server.url}?prefix={group}"
    script = 'import os, sys; print(os.environ["YLOCK_LOCK"], os.environ["YLOCK_TOKEN"]); sys.exit(3)'
    done = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", f"{group}/job", "--",
                           sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3, done.stderr
    where, token = done.stdout.split()
    assert where == f"{group}/job" and int(token) > 0
    engine = ylock.engine_from_url(url)
    assert list(engine.describe(group)) == []                            # released afterwards

    log = tmp_path / "log"
    proc = runner(url, group, log, "A", manner="polite")
    wait_until(lambda: any(line[3] == "tick" for line in lines(log)), timeout=15, what="the command to run")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 7                                            # the command's own exit code
    assert [line[3] for line in lines(log)][-1] == "term"
    assert list(engine.describe(group)) == []

    missing = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", f"{group}/job", "--",
                              "no-such-command-ylock"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert missing.returncode == EXIT_NOT_FOUND and "cannot run no-such-command-ylock" in missing.stderr
    usage = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", "no-slash", "--",
                            "true"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "GROUP/NAME" in usage.stderr
    lease = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", url, "run", "--lock", f"{group}/job",
                            "--lease", "nan", "--", "true"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert lease.returncode == 2 and "--lease must be a finite number" in lease.stderr


# -- the Python API ------------------------------------------------------------------------------------

@pytest.fixture(params=["redis", "zookeeper"])
def engine(request: pytest.FixtureRequest, group: str) -> Iterator[ylock.Engine]:
    if request.param == "redis":
        built = ylock.engine_from_url(f"{request.getfixturevalue('redis_server').url}?prefix={group}")
    else:
        built = ylock.engine_from_url(request.getfixturevalue("zookeeper_server").url(f"/{group}")
                                      + f"?session_timeout={ZK_SESSION:g}")
    yield built
    built.close()


def test_a_term_learns_it_was_lost(engine: ylock.Engine, group: str) -> None:
    called = threading.Event()
    seen: list[object] = []

    def on_lost(term: object) -> None:
        seen.append(term)
        called.set()

    leadership = Leadership(ylock.Lock(engine, group, "leader", lease=LEASE), on_lost=on_lost)
    with pytest.raises(ylock.LockLost):
        with leadership.lead(timeout=5) as term:
            assert term.token == leadership.lock.token and term.token is not None
            assert not term.lost.is_set()
            rival = Runner(lambda: Leadership(ylock.Lock(engine, group, "leader")).run_while_leader(
                lambda t: t.token, timeout=0))
            rival.start()
            with pytest.raises(ylock.LockTimeout):
                rival.outcome()                                          # one leader at a time
            engine.force_release(group, "leader")
            assert term.lost.wait(LEASE)                                 # Redis: next renewal; ZooKeeper: at once
            assert called.wait(5) and seen == [term] and "lost" in repr(term)
            with pytest.raises(ylock.LockLost):
                term.check()
    # The next leader gets a newer token; run_while_leader returns what the function returns.
    assert Leadership(ylock.Lock(engine, group, "leader")).run_while_leader(lambda t: t.token, timeout=5) > term.token


def test_run_while_leader_raises_when_the_term_was_lost(engine: ylock.Engine, group: str) -> None:
    def work(term: object) -> str:
        engine.force_release(group, "leader")
        assert term.lost.wait(LEASE)                                      # type: ignore[attr-defined]
        return "done"

    with pytest.raises(ylock.LockLost):
        Leadership(ylock.Lock(engine, group, "leader", lease=LEASE)).run_while_leader(work, timeout=5)
    with pytest.raises(ValueError, match="lock must be a ylock.Lock"):
        Leadership("orders")                                              # type: ignore[arg-type]
