"""Real PostgreSQL servers for tests, from Debian's ``postgresql`` package.

:class:`PostgresServer` runs ``initdb`` and then ``postgres`` itself in the foreground (no
``pg_ctl``, no system cluster): on 127.0.0.1 at a free port, with its data directory, unix
socket and log in a private temporary directory. The binaries are taken from
``/usr/lib/postgresql/<version>/bin`` (the newest version installed; ``YLOCK_POSTGRES_BIN``
names another directory): Debian puts neither ``initdb`` nor ``postgres`` on ``PATH``, so a
``pg_ctl`` or ``postgres`` found there is a hand-made link and is not relied upon.

PostgreSQL refuses to run as root. When this process is root the server runs as an
unprivileged user (``YLOCK_POSTGRES_USER``, else the ``postgres`` user the Debian package
creates, else ``nobody``): the temporary directory is given to that user, and the
directories above it must let it through (``/tmp`` does; pytest's ``tmp_path``, under a
``0700`` directory of root's, does not, and is refused with a clear error).

The server answering on the port must be ours: readiness is checked with ``SHOW
data_directory``. A server that cannot start raises :class:`~ylock.testing.ServerError` with
the tail of its log, never a skip.
"""
from __future__ import annotations

import glob
import os
import pwd
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ylock.testing import ServerError
from ylock.testing.database import DatabaseServer, unprivileged_user

if TYPE_CHECKING:
    import psycopg

def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.parent.name))


def bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: ``YLOCK_POSTGRES_BIN``, else the
    newest ``/usr/lib/postgresql/*/bin``."""
    override = os.environ.get("YLOCK_POSTGRES_BIN")
    if override:
        if not os.access(os.path.join(override, "postgres"), os.X_OK):
            raise ServerError(f"YLOCK_POSTGRES_BIN={override} has no postgres binary")
        return Path(override)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    for initdb in reversed(found):
        directory = Path(initdb).parent
        if os.access(initdb, os.X_OK) and os.access(directory / "postgres", os.X_OK):
            return directory
    raise ServerError("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb; "
                      "Debian: apt-get install postgresql)")


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (None: run as ourselves)."""
    return unprivileged_user("YLOCK_POSTGRES_USER", "postgres", "PostgreSQL", "postgresql")


def _traversable(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may enter every directory above ``path`` (mode bits only)."""
    groups = {user.pw_gid} | set(os.getgrouplist(user.pw_name, user.pw_gid))
    for parent in path.resolve().parents:
        st = parent.stat()
        if st.st_uid == user.pw_uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return False
    return True


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc): the postmaster's backends and helpers."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.split("/")[2]))
    return children


def _state(pid: int) -> str:
    """The one-letter state of a process ("T": stopped), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class PostgresServer(DatabaseServer):
    """One PostgreSQL server on 127.0.0.1 at a free port, in its own directory.

    ``user`` is the superuser ``initdb`` creates (it need not exist on the system), ``dbname``
    the database the :attr:`url` names (created on first start), ``password`` turns on
    ``scram-sha-256`` for TCP connections (without it TCP connections are trusted).
    ``settings`` are extra ``postgres -c name=value`` options, over the defaults made for tests:
    no fsync (commits still reach the OS: an immediate shutdown, like a crash of the server
    but not of the machine, keeps them), 300 connections, log to ``postgres.log`` in the directory.
    """

    binary = "postgres"
    bind_errors = ("could not bind", "Address already in use")

    def __init__(self, *, port: int | None = None, directory: str | None = None, user: str = "ylock",
                 password: str | None = None, dbname: str = "ylock", settings: dict[str, Any] | None = None,
                 ) -> None:
        self.port = port or 0
        self.user = user
        self.password = password
        self.dbname = dbname
        self.settings = dict(settings or {})
        self.own_dir = directory is None     # made here: removed by cleanup() and on leaving ``with``
        self.dir = Path(directory or tempfile.mkdtemp(prefix="ylock-postgres-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._initialized = False

    # -- where things are -------------------------------------------------------------------
    @property
    def url(self) -> str:
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.dir

    @property
    def log(self) -> Path:
        return self.dir / "postgres.log"

    def read_log(self) -> str:
        text = super().read_log()
        initdb_log = self.dir / "initdb.log"
        if not self._initialized and initdb_log.exists():
            text = "initdb: " + initdb_log.read_text(errors="replace")[-self.log_tail:] + "\n" + text
        return text

    def __repr__(self) -> str:
        return f"<PostgresServer 127.0.0.1:{self.port} {self.dir}>"

    # -- starting ----------------------------------------------------------------------------
    def _popen_user(self) -> dict[str, Any]:
        user = _run_as()
        if user is None:
            return {}
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _prepare(self) -> None:
        """Create the directory (owned by the server's user) and run initdb, once (not at all
        when the directory already holds a data directory: that one is started again)."""
        if self._initialized or (self.data_dir / "PG_VERSION").exists():
            self._initialized = True
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        user = _run_as()
        if user is not None:
            if not _traversable(self.dir, user):
                raise ServerError(f"user {user.pw_name!r} cannot reach {self.dir}: a directory above it "
                                  "is closed to it (use a directory under /tmp)")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.dir.chmod(0o700)
        args = [str(bin_dir() / "initdb"), "-D", str(self.data_dir), "-U", self.user, "-E", "UTF8",
                "--locale=C", "--no-sync", "--no-instructions", "--auth-local=trust"]
        pwfile = self.dir / "pwfile"
        if self.password:
            pwfile.write_text(self.password + "\n")
            if user is not None:
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            args += [f"--pwfile={pwfile}", "--auth-host=scram-sha-256"]
        else:
            args += ["--auth-host=trust"]
        try:
            with open(self.dir / "initdb.log", "wb") as out:
                result = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                        cwd=self.dir, timeout=120, **self._popen_user())
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServerError(f"initdb failed ({result.returncode}):\n"
                              f"{(self.dir / 'initdb.log').read_text(errors='replace')[-self.log_tail:]}")
        self._initialized = True

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(HOME=str(self.dir), LC_ALL="C", LANG="C")
        return env

    def _args(self) -> list[str]:
        settings: dict[str, Any] = {
            "listen_addresses": "127.0.0.1", "port": self.port, "unix_socket_directories": str(self.socket_dir),
            "max_connections": 300, "fsync": "off", "full_page_writes": "off",
            "shared_buffers": "32MB", "logging_collector": "off", "log_destination": "stderr",
            "log_line_prefix": "%m [%p] %q%a ", "log_min_messages": "warning", "autovacuum": "off",
            **self.settings}
        args = [str(bin_dir() / "postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        return args

    def _popen(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as log:
            return subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._env(), cwd=self.dir, start_new_session=True, **self._popen_user())

    def _started(self) -> None:
        self._create_database()

    def _postmaster_status(self) -> str:
        """The status line of ``postmaster.pid`` ("starting", "ready"...) if the file is our
        postmaster's, else ""."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return ""
        if self.proc is None or len(lines) < 8 or lines[0].strip() != str(self.proc.pid):
            return ""
        return lines[7].strip()

    def _wait_ready(self, timeout: float) -> bool:
        import psycopg

        def ours() -> bool | None:
            # Connect only once the postmaster says it listens and is ready: connecting to a
            # port someone else holds could hang until connect_timeout.
            if self._postmaster_status() != "ready":
                return None
            with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                                 dbname="postgres", connect_timeout=5, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
            # The server answering must be the one we started (ports are shared).
            return row is not None and os.path.realpath(row[0]) == os.path.realpath(self.data_dir)
        return self.wait_answer(timeout, ours, (psycopg.OperationalError,), pause=0.02)

    def _create_database(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                             dbname="postgres", connect_timeout=5, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.dbname]).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname)))

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new psycopg connection to :attr:`url`, in autocommit mode unless told otherwise
        (keyword arguments are libpq parameters or psycopg's ``connect()`` options)."""
        import psycopg

        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(self.url, **kwargs)

    # -- processes ---------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """The postmaster's pid, then its children's (backends, checkpointer, walwriter...)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *_children(self.proc.pid)]

    def pause(self) -> None:
        """Freeze the whole server, as a frozen machine: SIGSTOP to the postmaster, then to
        every one of its children (backends and auxiliary processes).

        Stopping the postmaster alone would leave open connections answering; stopping the
        backends alone would let new connections in. Frozen whole, the kernel still accepts TCP
        connections (the listen backlog) and acknowledges what clients send, but nothing
        answers: no query result, no cancel request (the postmaster handles those), no
        authentication. Server-side timeouts (``statement_timeout``, ``lock_timeout``,
        ``idle_session_timeout``...) do not fire while frozen either: a client must time out
        by itself. Returns once every process is stopped."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)
        self._wait_state([self.proc.pid], "T")
        # The postmaster is stopped: it forks no more, so its children are a fixed set now.
        children = _children(self.proc.pid)
        for pid in children:
            _signal(pid, signal.SIGSTOP)
        self._wait_state(children, "T")
        self.paused = True

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT to the children, then to the postmaster)."""
        assert self.proc is not None
        for pid in _children(self.proc.pid):
            _signal(pid, signal.SIGCONT)
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    @staticmethod
    def _wait_state(pids: list[int], state: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for pid in pids:
            while _state(pid) not in (state, "", "Z", "X") and time.monotonic() < deadline:
                time.sleep(0.001)

    def stop(self, mode: signal.Signals = signal.SIGQUIT) -> None:
        """Stop the server (a paused one too) and wait for it and its children.

        ``mode`` is the shutdown signal for the postmaster: SIGQUIT (default) is an
        immediate shutdown (like a crash: the next start replays the WAL, committed data is
        kept), SIGINT a fast one (a clean checkpoint), SIGTERM a smart one. Whatever is left
        after 10 s is killed."""
        if self.proc is None:
            return
        pid = self.proc.pid
        if self.proc.poll() is None:
            children = _children(pid)
            for child in children:
                _signal(child, signal.SIGCONT)
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(mode)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                for child in [pid, *_children(pid)]:
                    _signal(child, signal.SIGKILL)
                self.proc.wait(10)
            # An exited postmaster has reaped its children, unless it was killed: then they
            # exit on noticing its death; make sure of it.
            for child in children:
                if _state(child) not in ("", "Z", "X"):
                    _signal(child, signal.SIGKILL)
        self.paused = False

    def restart(self, down: float = 0.0, mode: signal.Signals = signal.SIGINT) -> None:
        """Stop (fast shutdown by default, see :meth:`stop`), stay down ``down`` seconds, and
        start again on the same port with the same data directory: data is kept."""
        self.stop(mode)
        time.sleep(down)
        self._start_again(30, 0.1)
