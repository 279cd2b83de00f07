"""A real PgBouncer for tests, from Debian's ``pgbouncer`` package, in front of a
:class:`~ylock.testing.postgres.PostgresServer`.

:class:`PgBouncer` writes a configuration and an auth file into a private temporary
directory and runs ``pgbouncer`` in the foreground on 127.0.0.1 at a free port, in the
pool mode asked for (``transaction``, ``session`` or ``statement``). It reaches the
server through the server's unix socket (``via="socket"``, as a pooler on the database's
machine usually does) or its TCP port (``via="tcp"``). Authentication is ``trust`` (the
test server trusts its connections too); every database name is forwarded to the server.

PgBouncer refuses to run as root: when this process is root it runs as the same
unprivileged user as the PostgreSQL helper (``YLOCK_POSTGRES_USER``, else ``postgres``,
else ``nobody``), and its directory is that user's.

The binary is ``pgbouncer`` on ``PATH``, else ``/usr/sbin/pgbouncer`` (where Debian puts
it); ``YLOCK_PGBOUNCER`` names another. One that cannot start raises
:class:`~ylock.testing.ServerError` with its log, never a skip. The pooler answering on the
port must be ours: readiness is checked through its admin console (``SHOW CONFIG``: our
log file).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ylock.testing import ServerError, ServerProcess, free_port
from ylock.testing.postgres import PostgresServer, _run_as, _traversable


def binary() -> str:
    """The pgbouncer executable: ``YLOCK_PGBOUNCER``, ``pgbouncer`` on PATH, or Debian's."""
    override = os.environ.get("YLOCK_PGBOUNCER")
    if override:
        if not os.access(override, os.X_OK):
            raise ServerError(f"YLOCK_PGBOUNCER={override} is not an executable")
        return override
    for candidate in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ServerError("PgBouncer is not installed (pgbouncer; Debian: apt-get install pgbouncer)")


class PgBouncer(ServerProcess):
    """PgBouncer on 127.0.0.1 at a free port in front of ``server``, in ``pool_mode``.

    ``settings`` are extra ``[pgbouncer]`` settings over the defaults made for tests
    (``default_pool_size`` 20, ``server_reset_query`` as PgBouncer's default, ``DISCARD
    ALL``, which it runs in session mode only). ``users``: roles of the server, besides its
    superuser, that may log in through it."""

    def __init__(self, server: PostgresServer, pool_mode: str = "transaction", *, via: str = "socket",
                 settings: dict[str, Any] | None = None, users: tuple[str, ...] = ()) -> None:
        if pool_mode not in ("session", "transaction", "statement"):
            raise ValueError(f"pool_mode must be session, transaction or statement, got {pool_mode!r}")
        if via not in ("socket", "tcp"):
            raise ValueError(f"via must be socket or tcp, got {via!r}")
        self.server = server
        self.pool_mode = pool_mode
        self.via = via
        self.settings = dict(settings or {})
        self.users = (server.user, *users)
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="ylock-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "pgbouncer.log"

    @property
    def url(self) -> str:
        """The test server's URL, with the pooler's port."""
        return self.url_for(self.server.user)

    def url_for(self, user: str) -> str:
        """The URL of the test server's database through the pooler, as ``user`` (one of
        ``users``: trusted, no password)."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{self.server.dbname}"

    def __repr__(self) -> str:
        return f"<PgBouncer {self.pool_mode} 127.0.0.1:{self.port} -> {self.server!r}>"

    def _config(self) -> str:
        host = str(self.server.socket_dir) if self.via == "socket" else "127.0.0.1"
        settings: dict[str, Any] = {
            "listen_addr": "127.0.0.1", "listen_port": self.port, "unix_socket_dir": "",
            "auth_type": "trust", "auth_file": self.dir / "users.txt", "pool_mode": self.pool_mode,
            "default_pool_size": 20, "max_client_conn": 500, "logfile": self.log,
            "pidfile": self.dir / "pgbouncer.pid", "admin_users": self.server.user,
            "ignore_startup_parameters": "extra_float_digits", "server_login_retry": 1,
            **self.settings}
        lines = ["[databases]", f"* = host={host} port={self.server.port}", "", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in settings.items()]
        return "\n".join(lines) + "\n"

    def start(self, attempts: int = 5, timeout: float = 30.0) -> PgBouncer:
        """Start it; retry on another port if the picked one was taken. Returns self."""
        user = _run_as()
        if user is not None:
            if not _traversable(self.dir, user):
                raise ServerError(f"user {user.pw_name!r} cannot reach {self.dir}")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        popen_user: dict[str, Any] = ({} if user is None else
                                      {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []})
        for _ in range(attempts):
            self.port = free_port()
            (self.dir / "users.txt").write_text("".join(f'"{user}" ""\n' for user in self.users))
            (self.dir / "pgbouncer.ini").write_text(self._config())
            if user is not None:
                for name in ("users.txt", "pgbouncer.ini"):
                    os.chown(self.dir / name, user.pw_uid, user.pw_gid)
            offset = self.log_size()
            with open(self.dir / "stderr.log", "ab") as err:
                self.proc = subprocess.Popen([binary(), str(self.dir / "pgbouncer.ini")], stdout=err, stderr=err,
                                             stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
                                             **popen_user)
            if self._wait_ready(timeout):
                return self
            self.stop()
            if "Address already in use" not in self.log_since(offset):
                break
        raise ServerError(f"pgbouncer did not start on 127.0.0.1:{self.port}; log:\n{self.read_log()}")

    def _wait_ready(self, timeout: float) -> bool:
        import psycopg

        def ours() -> bool:
            with self.admin() as conn:
                rows = conn.execute("SHOW CONFIG").fetchall()
            # The pooler answering must be ours (ports are shared): it names our log file.
            return any(row[0] == "logfile" and row[1] == str(self.log) for row in rows)
        return self.wait_answer(timeout, ours, (psycopg.OperationalError,))

    def admin(self) -> Any:
        """A psycopg connection to PgBouncer's admin console (``SHOW POOLS``, ``SHOW SERVERS``...)."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.server.user, dbname="pgbouncer",
                               connect_timeout=5, autocommit=True, prepare_threshold=None)

    def show(self, what: str) -> list[dict[str, Any]]:
        """The rows of ``SHOW <what>`` on the admin console, as dicts."""
        with self.admin() as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def read_log(self) -> str:
        text = super().read_log()
        if text.strip() and text != "(no log)":
            return text
        # Before it opens its log file (a bad configuration), it says why on stderr.
        try:
            return (self.dir / "stderr.log").read_text(errors="replace")[-self.log_tail:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop it (SIGKILL: its server connections close, so the backends end)."""
        super().stop()

    def cleanup(self) -> None:
        """Stop, and remove its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
