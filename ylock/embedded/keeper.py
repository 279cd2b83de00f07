"""The keeper: the embedded server's parent, which starts it, restarts it if it dies while
users remain and stops it when none do (see :mod:`ylock.embedded`); and ``main``, the
command line it runs from (``python -m ylock.embedded``). Standard library only."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

if sys.platform != "win32":
    import fcntl

from .files import Paths, ServerInfo, read_state, remove_file, server_config, write_state
from .process import STOP_TIMEOUT, process_start
from .server import server_info
from .wire import ErrorReply, NoServer, Unresponsive, query_info, send_command

_QUICK_DEATH = 5.0          # a server that dies this soon after starting counts as failing
_QUICK_DEATHS = 3           # ... and after this many in a row the keeper gives up

# Runs in the server's process before it becomes redis-server (execv keeps the pid): the
# kernel sends it SIGTERM when the keeper dies, so no server outlives its keeper. A shim
# rather than preexec_fn: the keeper has threads when it restarts a server.
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(70)\n"                                                             # keeper already gone
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class _StartFailed(Exception):
    pass


class _Terminated(Exception):
    pass



class _Keeper:
    """The server's parent: restarts it if it dies while users remain, stops it when none do."""

    def __init__(self, paths: Paths, binary: str, timeout: float) -> None:
        self.paths = paths
        self.binary = binary
        self.timeout = timeout
        self.users_fd = os.open(paths.users, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_id = ""
        self.started_at = 0.0
        self.quick_deaths = 0
        self.events: queue.Queue[tuple[str, subprocess.Popen[bytes] | None]] = queue.Queue()
        self.idle = threading.Event()
        self.created = process_start(os.getpid()) or 0.0

    @staticmethod
    def log(message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ylock keeper[{os.getpid()}]: {message}\n")
            sys.stderr.flush()

    def start(self, deadline: float, say: Callable[[str], None] | None = None) -> None:
        """Start the server, wait until it answers, record the state. Under the start lock."""
        paths = self.paths
        if os.path.dirname(paths.socket) != paths.dir:
            _private_dir(os.path.dirname(paths.socket))
        remove_file(paths.socket)
        with open(os.open(paths.conf + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600),
                  "wb") as fh:
            fh.write(server_config(paths))
        os.replace(paths.conf + ".tmp", paths.conf)
        command = [self.binary, paths.conf]
        if sys.platform.startswith("linux"):
            command = [sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *command]
        self.proc = proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=sys.stderr.fileno(), close_fds=True, cwd=paths.dir)
        if say is not None:
            say(f"server {proc.pid}")
        threading.Thread(target=self._reap, args=(proc,), name="ylock-reaper", daemon=True).start()
        while True:
            code = proc.poll()
            if code is not None:
                raise _StartFailed(f"redis-server exited with status {code} (see {paths.log})")
            try:
                info = query_info(paths.socket, 1.0)
                if info.get("process_id") == str(proc.pid) and send_command(paths.socket, ["PING"], 1.0) == b"PONG":
                    break
            except (NoServer, ErrorReply, Unresponsive):    # not yet listening, or still loading
                pass
            if time.monotonic() >= deadline:
                raise _StartFailed(f"redis-server did not answer on {paths.socket} in time")
            time.sleep(0.005)
        self.run_id = info["run_id"]
        self.started_at = time.monotonic()
        write_state(paths.state, ServerInfo(
            db=paths.db, socket=paths.socket, pid=proc.pid, run_id=self.run_id, started=time.time(),
            keeper_pid=os.getpid(), server_created=process_start(proc.pid) or 0.0, keeper_created=self.created))
        self.log(f"redis-server {proc.pid} serves {paths.db} on {paths.socket}")

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self.events.put(("died", proc))

    def _wait_idle(self) -> None:
        fcntl.flock(self.users_fd, fcntl.LOCK_EX)     # granted when no process holds it shared
        self.idle.set()
        self.events.put(("idle", None))

    def run(self) -> int:
        threading.Thread(target=self._wait_idle, name="ylock-idle", daemon=True).start()
        while True:
            kind, proc = self.events.get()
            if kind == "idle":
                with self._locked():
                    self.log("no process uses the server any more: stopping it")
                    self.stop()
                    os.close(self.users_fd)    # before the start lock: a starter then finds it free
                return 0
            if proc is self.proc and not self._restart():
                return 0

    def _restart(self) -> bool:
        assert self.proc is not None
        code = self.proc.returncode
        quick = time.monotonic() - self.started_at < _QUICK_DEATH
        self.quick_deaths = self.quick_deaths + 1 if quick else 0
        with self._locked():
            if not self._mine():
                self.log(f"redis-server {self.proc.pid} exited ({code}); another server replaced it")
                return False
            if self._nobody() or self.idle.is_set():
                self.log(f"redis-server {self.proc.pid} exited ({code}) and no process uses it")
                self._forget()
                return False
            if self.quick_deaths >= _QUICK_DEATHS:
                self.log(f"redis-server {self.proc.pid} exited ({code}); {self.quick_deaths} quick deaths: "
                         "giving up (the next process to use the database starts it again)")
                self._forget()
                return False
            self.log(f"redis-server {self.proc.pid} exited ({code}) while in use: restarting it")
            try:
                self.start(time.monotonic() + self.timeout)
            except (_StartFailed, OSError) as exc:
                self.log(f"restart failed: {exc}")
                self.stop()
                return False
        return True

    def stop(self) -> None:
        """Stop our server (the file is saved on SIGTERM) and forget it if it is the recorded one."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.log(f"redis-server {proc.pid} did not stop within {STOP_TIMEOUT}s: killing it")
                proc.kill()
                proc.wait()
        if self._mine():
            self._forget()

    def stop_without_lock(self) -> None:
        """On SIGTERM: stop the server at once; clear the state if the start lock comes soon."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if self._mine():
                self._forget()
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            return

    def _forget(self) -> None:
        remove_file(self.paths.state)
        remove_file(self.paths.socket)   # Redis removes it at a clean stop; not when killed

    def _mine(self) -> bool:
        state = read_state(self.paths.state)
        return state is not None and state.run_id == self.run_id

    def _nobody(self) -> bool:
        """Does no process hold the users file? (A second description: ours conflicts too.)"""
        fd = os.open(self.paths.users, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Blocking is safe: a starter never waits for the users file while holding this.
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise _StartFailed(f"{path} must be a directory of this user, closed to others (for the socket)")


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _keep(db: str, socket_path: str, binary: str, lock_fd: int, timeout: float) -> int:
    """The keeper's process: detach, start the server, tell the starter, then keep it."""
    if os.fork() > 0:
        os._exit(0)                 # the starter reaps this one; the keeper is nobody's child
    deadline = time.monotonic() + timeout
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.chdir("/")

    def say(line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(1, line.replace("\n", " ").encode(errors="replace") + b"\n")

    paths = Paths.of(db, socket_path)
    keeper = _Keeper(paths, binary, timeout)
    say(f"keeper {os.getpid()}")
    try:
        try:
            keeper.start(deadline, say)
        except (_StartFailed, OSError) as exc:
            keeper.log(f"start failed: {exc}")
            say(f"error {exc}")
            keeper.stop()
            return 1
        finally:
            # The starter's start lock, shared until now so that a starter that dies
            # half-way leaves nobody else to start a second server.
            with contextlib.suppress(OSError):
                os.close(lock_fd)
        say("ready")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        return keeper.run()
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        keeper.log("SIGTERM: stopping the server")
        keeper.stop_without_lock()
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ylock.embedded",
                                     description="The embedded redis-server of a ylock database file.")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="print what the state file records (exit 1: nothing)")
    status.add_argument("db")
    keep = commands.add_parser("keep", help="internal: start and keep the server (run by ensure_server)")
    keep.add_argument("db")
    keep.add_argument("--socket", required=True)
    keep.add_argument("--server", required=True)
    keep.add_argument("--lock-fd", type=int, required=True)
    keep.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.command == "keep":
        return _keep(args.db, args.socket, args.server, args.lock_fd, args.timeout)
    info = server_info(args.db)
    print(json.dumps(asdict(info), indent=1) if info is not None else "no server recorded")
    return 0 if info is not None else 1


