"""The MySQL engine's protocol: :class:`MySQLEngine`, its options, and the one place where
driver and server errors become ylock's (see the package docstring); what it shares with the
PostgreSQL engine is :class:`~ylock.engines.sessions.engine.SessionEngine`'s."""
from __future__ import annotations

import logging
import time
from typing import Any

from ylock import options as opt
from ylock.engines.base import LOCK, SEMAPHORE, Listing, LockInfo, check_limit
from ylock.engines.mysql.connection import Conn, Target, driver_error, parse_target, read_only_error
from ylock.engines.mysql.executor import Executor
from ylock.engines.mysql.inspection import lock_infos
from ylock.engines.mysql.proxies import client_port, probe, verdict
from ylock.engines.mysql.sql import Statements, lock_key
from ylock.engines.mysql.steps import HoldSteps
from ylock.engines.mysql.wire import Broken, ServerError
from ylock.engines.sessions.engine import SessionEngine
from ylock.engines.sessions.pool import Pool
from ylock.errors import EngineUnavailable, LockError

logger = logging.getLogger("ylock.engines.mysql")

#: Server errors that mean the server cannot serve us now (connections, resources, shutdown).
_UNAVAILABLE = {1040: "too many connections: raise the server's max_connections, or lower the engines' "
                      "max_connections",
                1203: "the user has too many connections (max_user_connections)",
                1053: "the server is shutting down", 1927: "the session was killed", 4031: "the session timed out",
                2006: "the server has gone away", 2013: "the connection was lost",
                1205: "a row lock wait timed out", 1213: "a deadlock was detected"}
#: Refusals that are the deployment's to fix: read-only servers, privileges.
_READ_ONLY = (1290, 1836, 1792)
_DENIED = (1142, 1143, 1227, 1095, 1044)


class MySQLEngine(SessionEngine):
    """Locks and semaphores on MySQL 8 and MariaDB 10.6+ (see :mod:`ylock.engines.mysql`)."""

    scheme = "mysql"
    server = "MySQL"
    url_schemes = ("mysql", "mariadb")
    url_options = {"max_connections": int, "idle_connections": int, "socket_timeout": float,
                   "connect_timeout": float, "keepalive": float, "prefix": str, "proxy": str}
    _executor: Executor

    def __init__(self, url: str | Target, *, max_connections: int = 10, idle_connections: int = 2,
                 socket_timeout: float = 2.0, connect_timeout: float = 2.0, keepalive: float = 10.0,
                 prefix: str = "ylock", proxy: str = "check", **driver: Any) -> None:
        super().__init__()
        self._limits(max_connections=max_connections, idle_connections=idle_connections,
                     socket_timeout=socket_timeout, connect_timeout=connect_timeout, keepalive=keepalive)
        self.proxy = opt.choice(proxy, "MySQL engine option proxy", ("check", "session"), code=opt.E_ENGINE_URL)
        self.prefix = self._check_prefix(prefix, 20)
        self.target = url if isinstance(url, Target) else parse_target(url, driver, tuple(self.url_options))
        self.url = self.target.display()
        self.sql = Statements(prefix)
        self._reset_state()

    def _make_state(self) -> tuple[Pool[Conn], Executor, HoldSteps]:
        pool: Pool[Conn] = Pool(self.max_connections, self.idle_connections, self.connect_timeout,
                                self.url_for_display, server=self.server, logger=logger)
        executor = Executor(self.target, self.sql, self.connect_timeout, self.socket_timeout, self.keepalive,
                            self.url_for_display, check_proxy=self.proxy == "check")
        steps = HoldSteps(pool, self.sql, prefix=self.prefix, database=self.target.database,
                          socket_timeout=self.socket_timeout, where=self.url_for_display)
        return pool, executor, steps

    def url_for_display(self) -> str:
        return self.url

    # -- errors: the one place they are translated (the frame: SessionEngine._translate) --------------

    def _translate_server(self, exc: Exception, where: str, group: str | None, name: str | None) -> Exception:
        errno, message = None, str(exc)
        driver = driver_error(exc)
        if isinstance(exc, ServerError):
            errno, message = exc.errno, exc.message
        elif driver is not None:
            errno, message = driver[0], driver[1]
        if errno in _READ_ONLY:
            error = read_only_error(where, group, name)
            error.__cause__ = exc
            return error
        if errno == 1045:
            return EngineUnavailable(f"MySQL at {where} refused the credentials: {message}", group=group, name=name)
        if errno == 1049:
            return EngineUnavailable(f"MySQL at {where}: the database {self.target.database!r} does not exist "
                                     f"({message})", group=group, name=name)
        if errno in _UNAVAILABLE:
            return EngineUnavailable(f"MySQL at {where} is unavailable: {message} ({_UNAVAILABLE[errno]})",
                                     group=group, name=name)
        if errno in _DENIED:
            return LockError(f"MySQL at {where} refused: {message} (the engine's user needs CREATE, INSERT, "
                             f"DELETE, UPDATE and SELECT on {self.target.database}.{self.prefix}_*, and to kill "
                             "the holders' sessions for force_release)", group=group, name=name)
        if isinstance(exc, (Broken, OSError)) or (driver is not None and not driver[2]):
            return EngineUnavailable(f"MySQL at {where} is unavailable: {message}", group=group, name=name)
        if isinstance(exc, ServerError) or driver is not None:
            return LockError(f"MySQL at {where} failed: {message}", group=group, name=name)
        return exc

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _checkout_wait(self) -> float:
        return self.connect_timeout + self.socket_timeout

    def _utility(self, sql: str, group: str | None = None, name: str | None = None) -> Any:
        results, conn = self._borrowed(sql, group, name)
        return results, conn.server.mariadb  # type: ignore[attr-defined]

    def ping(self) -> None:
        self._utility("SELECT 1")

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        check_limit(limit)
        # The flavour decides how the process list says how long a statement has waited.
        if self._executor.mariadb is None:
            self.ping()
        (holds, processes), _ = self._utility(self.sql.describe(group, bool(self._executor.mariadb)), group)
        return Listing.of(lock_infos(holds, processes, group), limit)

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        return next((i for i in self.describe(group) if i.name == name and i.kind == kind), None)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        """Kill the sessions that hold the lock (``KILL``; the engine's user may kill its own
        sessions, others need ``CONNECTION_ADMIN``), and wait up to one socket timeout for
        the server to drop their locks: queued waiters then get it in order; each killed
        holder loses only this lock (a connection carries one hold) and learns it at its
        next heartbeat."""
        lk = lock_key(self.prefix, self.target.database, SEMAPHORE if kind == SEMAPHORE else LOCK, group, name)
        (rows,), _ = self._utility(self.sql.holders(lk), group, name)
        if not rows:
            return False
        self._utility(";\n".join(f"KILL {int(row[0])}" for row in rows), group, name)
        deadline = time.monotonic() + self.socket_timeout
        while time.monotonic() < deadline:
            (left,), _ = self._utility(self.sql.still_held(lk), group, name)
            if left[0][0] == b"0":
                break
            time.sleep(0.005)
        return True

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        self._utility(self.sql.publish_stats(process, ttl, data))

    def read_stats(self) -> dict[str, bytes]:
        (_, rows), _ = self._utility(self.sql.read_stats())
        return {p.decode(): bytes.fromhex(d.decode()) for p, d in rows}

    def detect_pooler(self) -> str | None:
        """Look for a proxy between this engine and the server that would break its locks;
        return what was found (a sentence for a warning), or None. Opens two connections
        that lock nothing (use it from deployment checks, not on every request). See
        :mod:`~ylock.engines.mysql.proxies`."""
        end = time.monotonic() + 3 * self.connect_timeout + 6 * self.socket_timeout
        a = None
        try:
            a = self._executor.open_bare(end)
            (rows,) = _drive_query(a, "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
                                   end)
            proxied = client_port((rows[0][0] or b"").decode()) != a.local_port if rows else True
            multiplexed = proxied and probe(a, lambda: self._executor.open_bare(end), end)
        except Exception as exc:
            raise self._translate(exc) from exc
        finally:
            if a is not None:
                a.close()
        return verdict(proxied, multiplexed, self.proxy == "session", self.url_for_display())

    #: The hint of Django's W004 for this engine.
    pooler_hint = "connect to MySQL directly, or through a proxy that keeps sessions (then add ?proxy=session)"


def _drive_query(conn: Any, sql: str, end: float) -> Any:
    from ylock.engines.mysql.wire import drive

    return drive(conn.wire.query(sql.encode()), end)
