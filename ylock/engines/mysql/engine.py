"""The MySQL engine's protocol: :class:`MySQLEngine`, its options, and the one place where
driver and server errors become ylock's (see the package docstring)."""
from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from ylock import options as opt
from ylock.engines.base import (
    LOCK,
    SEMAPHORE,
    AcquireRequest,
    Engine,
    Listing,
    LockInfo,
    RenewItem,
    Steps,
    arun_steps,
    check_limit,
    run_steps,
    split_url_options,
)
from ylock.engines.mysql.connection import Hold, Target, driver_error, parse_target, read_only_error
from ylock.engines.mysql.executor import Executor
from ylock.engines.mysql.inspection import adopt_steps, lock_infos
from ylock.engines.mysql.ops import Query
from ylock.engines.mysql.pool import Pool
from ylock.engines.mysql.proxies import client_port, probe, verdict
from ylock.engines.mysql.sql import Statements, lock_key
from ylock.engines.mysql.steps import HoldSteps, kind_of
from ylock.engines.mysql.wire import Broken, NoAnswer, ServerError
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.holds import HOLDS

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


class MySQLEngine(Engine):
    """Locks and semaphores on MySQL 8 and MariaDB 10.6+ (see :mod:`ylock.engines.mysql`)."""

    scheme = "mysql"
    url_options = {"max_connections": int, "idle_connections": int, "socket_timeout": float,
                   "connect_timeout": float, "keepalive": float, "prefix": str, "proxy": str}

    def __init__(self, url: str | Target, *, max_connections: int = 10, idle_connections: int = 2,
                 socket_timeout: float = 2.0, connect_timeout: float = 2.0, keepalive: float = 10.0,
                 prefix: str = "ylock", proxy: str = "check", **driver: Any) -> None:
        super().__init__()
        where = "MySQL engine option"
        code = opt.E_ENGINE_URL
        self.max_connections = opt.number(max_connections, f"{where} max_connections", minimum=1, maximum=10_000,
                                          integer=True, code=code)
        self.idle_connections = opt.number(idle_connections, f"{where} idle_connections", minimum=0,
                                           maximum=10_000, integer=True, code=code)
        self.socket_timeout = opt.seconds(socket_timeout, f"{where} socket_timeout", maximum=3600, code=code)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600, code=code)
        self.keepalive = opt.seconds(keepalive, f"{where} keepalive", minimum=1, maximum=86400, above=None,
                                     code=code)
        self.proxy = opt.choice(proxy, f"{where} proxy", ("check", "session"), code=code)
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,19}", prefix):
            raise ConfigurationError(f"{where} prefix must be a lower-case SQL name (letters, digits, _; at most "
                                     f"20), got {prefix!r}", code=code)
        self.prefix = prefix
        self.target = url if isinstance(url, Target) else parse_target(url, driver, tuple(self.url_options))
        self.url = self.target.display()
        self.sql = Statements(prefix)
        self._reset_state()

    def _reset_state(self) -> None:
        """Start with no connections (a new engine, or a forked child's copy)."""
        self._pool = Pool(self.max_connections, self.idle_connections, self.connect_timeout, self.url_for_display)
        self._executor = Executor(self.target, self.sql, self.connect_timeout, self.socket_timeout, self.keepalive,
                                  self.url_for_display, check_proxy=self.proxy == "check")
        self._steps = HoldSteps(self._pool, self.sql, prefix=self.prefix, database=self.target.database,
                                socket_timeout=self.socket_timeout, where=self.url_for_display)
        # The executors, as attributes: a test or a benchmark wraps them to count round trips.
        self._do: Callable[[Any], Any] = self._executor.do
        self._ado: Callable[[Any], Awaitable[Any]] = self._executor.ado

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MySQLEngine:
        """Build an engine from a URL: ylock's options and the driver's (TLS, unix socket) are
        taken out of the query; keyword ``options`` win."""
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise ConfigurationError(f"invalid MySQL URL: {exc}", code=opt.E_ENGINE_URL) from None
        if scheme not in ("mysql", "mariadb"):
            raise ConfigurationError(f"not a MySQL URL (mysql:// or mariadb://), got scheme {scheme!r}",
                                     code=opt.E_ENGINE_URL)
        base, ours, rest = split_url_options(url, cls.url_options)
        return cls(base, **{**rest, **ours, **options})

    def url_for_display(self) -> str:
        return self.url

    # -- errors: the one place they are translated ----------------------------------------------------

    def _translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a driver's or the server's error."""
        where = self.url_for_display()
        if isinstance(exc, ConfigurationError) and exc.name is None and name is not None:
            named = ConfigurationError(exc.problem, code=exc.code, hint=exc.hint, group=group, name=name)
            named.__cause__ = exc.__cause__
            return named
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, NoAnswer):
            detail = str(exc) if "connect_timeout" in str(exc) else f"socket_timeout {self.socket_timeout:g} s"
            return EngineUnavailable(f"MySQL at {where} did not answer within its timeout ({detail}); the "
                                     "connection was closed", group=group, name=name)
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

    def _run(self, steps: Steps, group: str | None = None, name: str | None = None) -> Any:
        return run_steps(steps, self._do, lambda exc: self._translate(exc, group, name))

    async def _arun(self, steps: Steps, group: str, name: str) -> Any:
        return await arun_steps(steps, self._ado, lambda exc: self._translate(exc, group, name))

    # -- holds --------------------------------------------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> int | None:
        return self._run(self._steps.acquire(request), request.group, request.name)  # type: ignore[no-any-return]

    async def aacquire(self, request: AcquireRequest) -> int | None:
        return await self._arun(self._steps.acquire(request), request.group,  # type: ignore[no-any-return]
                                request.name)

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        return self._run(self._steps.release(group, name, owner, mode), group, name)  # type: ignore[no-any-return]

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return await self._arun(self._steps.release(group, name, owner, mode),  # type: ignore[no-any-return]
                                group, name)

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        """Ping each hold's connection, all at once, and wait for them together (one round
        trip's time for any number of holds): ``COM_PING`` resets the session's idle timer
        (``wait_timeout``: the lease) and proves the session alive."""
        holds = [(Hold(i.group, i.name, i.owner, kind_of(i.mode)), i.mode) for i in items]
        return self._pool.renew(holds, time.monotonic() + self.socket_timeout, self._executor.failed)

    #: A hold lives in its connection's server session: only this process can take it over.
    adopts_across_processes = False

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Hand the connection that carries ``old_owner``'s hold to ``new_owner``. A detached
        hold is not renewed: once its lease has passed, the server has ended its session and
        this returns False."""
        kind = kind_of(mode)
        conn = self._pool.take(Hold(group, name, old_owner, kind), mode, token)
        if conn is None:
            return False
        steps = adopt_steps(self._pool, self.sql, conn, Hold(group, name, new_owner, kind), token,
                            self.socket_timeout)
        return self._run(steps, group, name)  # type: ignore[no-any-return]

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _utility(self, sql: str, group: str | None = None, name: str | None = None) -> Any:
        def steps() -> Steps:
            conn = yield from self._pool.checkout(time.monotonic() + self.connect_timeout + self.socket_timeout)
            try:
                results = yield Query(conn, sql, time.monotonic() + self.socket_timeout)
            finally:
                self._pool.checkin(conn)
            return results, conn.server.mariadb
        return self._run(steps(), group, name)

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

    # -- life cycle ---------------------------------------------------------------------------------------

    def check_options(self) -> None:
        """Everything was checked when the engine was built."""

    def close(self) -> None:
        if self._pool.close():
            HOLDS.mark_lost(self, detail="the engine was closed: its lock connections with it")

    def _after_fork(self) -> None:
        # The parent's sockets are not ours: forget them (closing would say goodbye for it).
        self._reset_state()


def _drive_query(conn: Any, sql: str, end: float) -> Any:
    from ylock.engines.mysql.wire import drive

    return drive(conn.wire.query(sql.encode()), end)
