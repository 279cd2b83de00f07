"""Real MariaDB servers for tests, from Debian's ``mariadb-server`` package.

:class:`MariaDBServer` runs ``mariadb-install-db`` into a private temporary directory once,
then ``mariadbd --no-defaults`` in the foreground: on 127.0.0.1 at a free port, with its
data directory, unix socket, pid file and error log in that directory (nothing of
``/etc/mysql`` is read, no system service is touched). Binaries: ``mariadbd`` from
``/usr/sbin`` (``YLOCK_MARIADBD`` names another) and ``mariadb-install-db`` from ``PATH``.

MariaDB refuses to run as root unless told which user to run as: when this process is root
the server gets ``--user=mysql`` (the user the Debian package creates; ``YLOCK_MARIADB_USER``
names another), the directory is given to that user, and the directories above it must let
it through (``/tmp`` does).

Every start runs an init file that creates the test user (``user``/``password``, all
privileges, from any host) and the database :attr:`url` names. The server answering on the
port must be ours: readiness is checked with ``SELECT @@datadir``. A server that cannot
start raises :class:`~ylock.testing.ServerError` with the tail of its log, never a skip.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ylock.testing import ServerError
from ylock.testing.database import DatabaseServer, unprivileged_user


def _binary(name: str, env: str, default: str) -> str:
    found = os.environ.get(env) or shutil.which(name) or (default if os.access(default, os.X_OK) else None)
    if not found:
        raise ServerError(f"{name} is not installed (Debian: apt-get install mariadb-server)")
    return found


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (None: as ourselves)."""
    return unprivileged_user("YLOCK_MARIADB_USER", "mysql", "MariaDB", "mariadb-server")


class MariaDBServer(DatabaseServer):
    """One MariaDB server on 127.0.0.1 at a free port, in its own directory.

    ``settings`` are extra ``mariadbd --name=value`` options over the defaults made for
    tests: commits written to the OS at each commit but not synced (a killed server keeps
    them, a crashed machine would not), 300 connections, small buffers, no performance schema.
    """

    binary = "mariadbd"
    bind_errors = ("Address already in use", "Can't start server: Bind on TCP/IP port")
    start_timeout = 60.0

    def __init__(self, *, port: int | None = None, user: str = "ylock", password: str = "ylock-secret",
                 database: str = "ylock", settings: dict[str, Any] | None = None) -> None:
        self.port = port or 0
        self.user = user
        self.password = password
        self.database = database
        self.settings = dict(settings or {})
        self.dir = Path(tempfile.mkdtemp(prefix="ylock-mariadb-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._installed = False

    # -- where things are -------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"mysql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def socket(self) -> Path:
        return self.dir / "mariadb.sock"

    @property
    def log(self) -> Path:
        return self.dir / "mariadb.log"

    def __repr__(self) -> str:
        return f"<MariaDBServer 127.0.0.1:{self.port} {self.dir}>"

    # -- starting ----------------------------------------------------------------------------
    def _popen_user(self) -> dict[str, Any]:
        return {}

    def _prepare(self) -> None:
        if self._installed:
            return
        user = _run_as()
        self.dir.chmod(0o700)
        args = [_binary("mariadb-install-db", "YLOCK_MARIADB_INSTALL_DB", "/usr/bin/mariadb-install-db"),
                "--no-defaults", f"--datadir={self.data_dir}", "--skip-test-db", "--skip-name-resolve",
                "--auth-root-authentication-method=normal", "--innodb-use-native-aio=0", f"--tmpdir={self.dir}"]
        if user is not None:
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            args.append(f"--user={user.pw_name}")
        with open(self.dir / "install.log", "wb") as out:
            result = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, timeout=180,
                                    env={**os.environ, "LC_ALL": "C"})
        if result.returncode != 0:
            raise ServerError(f"mariadb-install-db failed ({result.returncode}):\n"
                              f"{(self.dir / 'install.log').read_text(errors='replace')[:self.log_tail]}")
        quoted = self.password.replace("\\", "\\\\").replace("'", "\\'")
        init = self.dir / "init.sql"
        init.write_text(f"CREATE USER IF NOT EXISTS '{self.user}'@'%' IDENTIFIED BY '{quoted}';\n"
                        f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION;\n"
                        f"CREATE DATABASE IF NOT EXISTS `{self.database}` CHARACTER SET utf8mb4;\n")
        if user is not None:
            os.chown(init, user.pw_uid, user.pw_gid)
        self._installed = True

    def _args(self) -> list[str]:
        settings: dict[str, Any] = {
            "datadir": self.data_dir, "port": self.port, "bind-address": "127.0.0.1", "socket": self.socket,
            "pid-file": self.dir / "mariadb.pid", "log-error": self.log, "init-file": self.dir / "init.sql",
            "tmpdir": self.dir, "skip-name-resolve": None, "max-connections": 300,
            "innodb-flush-log-at-trx-commit": 2, "innodb-doublewrite": 0, "innodb-buffer-pool-size": "32M",
            "innodb-log-file-size": "16M", "innodb-use-native-aio": 0, "performance-schema": "OFF",
            "skip-log-bin": None, "character-set-server": "utf8mb4", "collation-server": "utf8mb4_unicode_ci",
            **self.settings}
        user = _run_as()
        if user is not None:
            settings["user"] = user.pw_name
        args = [_binary("mariadbd", "YLOCK_MARIADBD", "/usr/sbin/mariadbd"), "--no-defaults"]
        for name, value in settings.items():
            args.append(f"--{name}" if value is None else f"--{name}={value}")
        return args

    def _popen(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
                                env={**os.environ, "LC_ALL": "C"})

    def _wait_ready(self, timeout: float) -> bool:
        import pymysql

        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if not self.socket.exists():
                time.sleep(0.02)
                continue
            try:
                conn = self.connect(connect_timeout=5, read_timeout=5)
            except pymysql.err.Error:
                time.sleep(0.05)
                continue
            with conn:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT @@datadir")
                    row = cursor.fetchone()
            # The server answering must be the one we started (ports are shared).
            return row is not None and os.path.realpath(row[0]) == os.path.realpath(self.data_dir)
        return False

    def connect(self, **kwargs: Any) -> Any:
        """A new PyMySQL connection to :attr:`url`'s database as the test user, autocommit
        (keyword arguments are PyMySQL's ``connect()`` options)."""
        import pymysql

        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 10)
        kwargs.setdefault("read_timeout", 30)
        return pymysql.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                               database=kwargs.pop("database", self.database), charset="utf8mb4", **kwargs)

    def query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own; return its rows."""
        with self.connect() as conn, conn.cursor() as cursor:
            cursor.execute(sql, args)
            return list(cursor.fetchall())

    # -- processes ---------------------------------------------------------------------------
    def pause(self) -> None:
        """Freeze the server (SIGSTOP, every thread): the kernel still accepts connections and
        acknowledges what clients send, but nothing answers and no server-side timeout fires."""
        super().pause()
        self.paused = True

    def resume(self) -> None:
        super().resume()
        self.paused = False

    def stop(self, mode: signal.Signals = signal.SIGKILL) -> None:
        """Stop the server (a paused one too) and wait for it: SIGKILL (default) is a crash of
        the server, not of the machine (committed data is kept: it reached the OS); SIGTERM a
        clean shutdown."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(mode)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.paused = False

    def restart(self, down: float = 0.0, mode: signal.Signals = signal.SIGKILL) -> None:
        """Stop (see :meth:`stop`), stay down ``down`` seconds, and start again on the same
        port with the same data directory."""
        self.stop(mode)
        time.sleep(down)
        self._start_again(60, 0.2)
