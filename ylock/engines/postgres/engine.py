"""The PostgreSQL engine's protocol: :class:`PostgresEngine`, its options, and the one
place where driver and server errors become ylock's (see the package docstring)."""
from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import psycopg

from ylock import options as opt
from ylock.engines.base import (
    LOCK,
    SEMAPHORE,
    AcquireRequest,
    Engine,
    Listing,
    RenewItem,
    Steps,
    arun_steps,
    check_limit,
    run_steps,
    split_url_options,
)
from ylock.engines.postgres.connection import Hold, conninfo, session_settings
from ylock.engines.postgres.executor import Executor
from ylock.engines.postgres.inspection import adopt_steps, lock_infos
from ylock.engines.postgres.ops import Query, Stmt
from ylock.engines.postgres.pool import Pool
from ylock.engines.postgres.poolers import STATEMENT_MODE, detect_io, pooler_error, statement_mode, verdict
from ylock.engines.postgres.sql import Statements, advisory_key, channel, halves
from ylock.engines.postgres.steps import HoldSteps, kind_of
from ylock.engines.postgres.wire import Broken, NoAnswer, ServerError, drive
from ylock.errors import ConfigurationError, EngineUnavailable, LockError, LockTimeout
from ylock.holds import HOLDS


class PostgresEngine(Engine):
    """Locks and semaphores on PostgreSQL advisory locks (see :mod:`ylock.engines.postgres`)."""

    scheme = "postgres"
    url_options = {"scope": str, "max_connections": int, "idle_connections": int, "socket_timeout": float,
                   "connect_timeout": float, "keepalive": float, "prefix": str, "pooler": str}

    def __init__(self, url: str, *, scope: str = "session", max_connections: int = 10, idle_connections: int = 2,
                 socket_timeout: float = 2.0, connect_timeout: float = 2.0, keepalive: float = 10.0,
                 prefix: str = "ylock", pooler: str = "check", **libpq: Any) -> None:
        super().__init__()
        where = "PostgreSQL engine option"
        code = opt.E_ENGINE_URL
        self.scope = opt.choice(scope, f"{where} scope", ("session", "transaction"), code=code)
        self.max_connections = opt.number(max_connections, f"{where} max_connections", minimum=1, maximum=10_000,
                                          integer=True, code=code)
        self.idle_connections = opt.number(idle_connections, f"{where} idle_connections", minimum=0,
                                           maximum=10_000, integer=True, code=code)
        self.socket_timeout = opt.seconds(socket_timeout, f"{where} socket_timeout", maximum=3600, code=code)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600, code=code)
        self.keepalive = opt.seconds(keepalive, f"{where} keepalive", minimum=1, maximum=86400, above=None,
                                     code=code)
        self.pooler = opt.choice(pooler, f"{where} pooler", ("check", "session"), code=code)
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", prefix):
            raise ConfigurationError(f"{where} prefix must be a lower-case SQL name (letters, digits, _; at most "
                                     f"40), got {prefix!r}", code=code)
        self.prefix = prefix
        self.url = url
        self.conninfo, self.app_name, self._display = conninfo(url, libpq, self.keepalive, self.url_options)
        self.sql = Statements(prefix, self.scope)
        self._reset_state()

    def _reset_state(self) -> None:
        """Start with no connections (a new engine, or a forked child's copy)."""
        self._pool = Pool(self.max_connections, self.idle_connections, self.connect_timeout, self.url_for_display,
                          session=self.scope == "session")
        self._executor = Executor(self.sql, self.conninfo, session_settings(self.keepalive), self.url_for_display,
                                  check_pooler=self.pooler == "check")
        self._steps = HoldSteps(self._pool, prefix=self.prefix, scope=self.scope, socket_timeout=self.socket_timeout,
                                app_name=self.app_name, local_settings=session_settings(self.keepalive, local=True),
                                where=self.url_for_display)
        # The executors, as attributes: a test or a benchmark wraps them to count round trips.
        self._do: Callable[[Any], Any] = self._executor.do
        self._ado: Callable[[Any], Awaitable[Any]] = self._executor.ado

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresEngine:
        """Build an engine from a URL: ylock's options are taken out of the query and parsed,
        libpq's stay (and are checked); keyword ``options`` win."""
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise ConfigurationError(f"invalid PostgreSQL URL {url!r}: {exc}", code=opt.E_ENGINE_URL) from exc
        if scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(f"not a PostgreSQL URL: {url!r}", code=opt.E_ENGINE_URL)
        base, ours, rest = split_url_options(url, cls.url_options)
        return cls(base, **{**rest, **ours, **options})

    def url_for_display(self) -> str:
        return self._display

    # -- errors: the one place they are translated ----------------------------------------------------

    def _translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a driver's or the server's error."""
        where = self.url_for_display()
        if isinstance(exc, ConfigurationError) and exc.name is None and name is not None:
            # Found while opening a connection (the pooler check, the server's version): the
            # connection serves this lock, so the error names it too.
            named = ConfigurationError(exc.problem, code=exc.code, hint=exc.hint, group=group, name=name)
            named.__cause__ = exc.__cause__
            return named
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, NoAnswer):
            return EngineUnavailable(f"PostgreSQL at {where} did not answer within its timeout (socket_timeout "
                                     f"{self.socket_timeout:g} s); the connection was closed", group=group, name=name)
        if isinstance(exc, Broken) and STATEMENT_MODE in str(exc):
            return statement_mode(where, group, name)
        if isinstance(exc, (Broken, OSError, psycopg.Error)):
            return EngineUnavailable(f"PostgreSQL at {where} is unavailable: {exc}", group=group, name=name)
        if isinstance(exc, ServerError):
            state = exc.sqlstate
            collided = pooler_error(exc, where, group, name) if self.scope == "session" else None
            if collided is not None:
                return collided
            if state == "55P03":
                return LockTimeout(f"lock_timeout: {exc.message}", group=group, name=name)
            if state[:2] in ("08", "28", "3D", "53") or state[:3] == "57P" or exc.fatal:
                hint = (" (the server's lock table is full: raise max_locks_per_transaction)"
                        if state == "53200" else "")
                return EngineUnavailable(f"PostgreSQL at {where} is unavailable: {exc}{hint}", group=group, name=name)
            if state == "42501":
                return LockError(f"PostgreSQL at {where} refused: {exc} (the engine's role needs CREATE on the "
                                 f"schema for its tables {self.prefix}_*, and to signal backends for force_release)",
                                 group=group, name=name)
            return LockError(f"PostgreSQL at {where} failed: {exc}", group=group, name=name)
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
        """Send one heartbeat on each hold's connection, all at once, and wait for them
        together (one round trip's time for any number of holds). A heartbeat is a bare Sync
        message: it resets the session's idle timer (the lease) and proves the session alive,
        and leaves what ``pg_stat_activity`` shows of it alone."""
        holds = [(Hold(i.group, i.name, i.owner, kind_of(i.mode)), i.mode) for i in items]
        return self._pool.renew(holds, time.monotonic() + self.socket_timeout, self._executor.failed)

    #: A hold lives in its connection's server session: only this process can take it over.
    adopts_across_processes = False

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Hand the connection that carries ``old_owner``'s hold to ``new_owner`` (its
        application name says who holds it). A detached hold is not renewed: once its lease
        has passed, the server has ended its session and this returns False."""
        kind = kind_of(mode)
        conn = self._pool.take(Hold(group, name, old_owner, kind), mode, token)
        if conn is None:
            return False
        steps = adopt_steps(self._pool, conn, Hold(group, name, new_owner, kind), token,
                                       self.socket_timeout)
        return self._run(steps, group, name)  # type: ignore[no-any-return]

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _utility(self, stmts: Sequence[Stmt], group: str | None = None, name: str | None = None) -> Any:
        def steps() -> Steps:
            conn = yield from self._pool.checkout(time.monotonic() + self.socket_timeout)
            try:
                results = yield Query(conn, stmts, time.monotonic() + self.socket_timeout)
            except BaseException:
                self._pool.checkin(conn)
                raise
            self._pool.checkin(conn)
            return results
        return self._run(steps(), group, name)

    def ping(self) -> None:
        self._utility([Stmt("ping")])

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        check_limit(limit)
        return Listing.of(lock_infos(self._utility([Stmt(self.sql.describe(), [group])], group)[0]), limit)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        key = advisory_key(self.prefix, SEMAPHORE if kind == SEMAPHORE else LOCK, group, name)
        wait_ms = max(1, int(self.socket_timeout * 500))
        stmts = [Stmt(self.sql.terminate(), [*halves(key), wait_ms])]
        if kind == SEMAPHORE:
            stmts.append(Stmt("SELECT pg_notify($1, '')", [channel(key)]))
        rows = self._utility(stmts, group, name)[0]
        return bool(rows)

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        self._utility([Stmt(self.sql.publish_stats(), [process, ttl, data.hex()])])

    def read_stats(self) -> dict[str, bytes]:
        rows = self._utility([Stmt(self.sql.prune_stats()), Stmt(self.sql.read_stats())])[1]
        return {p.decode(): bytes.fromhex(d.decode()) for p, d in rows}

    def detect_pooler(self) -> str | None:
        """Look for a connection pooler between this engine and PostgreSQL that would break
        session locks; return what was found (a sentence for a warning), or None.

        Connects twice more, and a few times more behind a proxy (use it from deployment
        checks, not on every request); sets nothing on the server. Proof of a pooler in
        transaction or statement mode: one client session runs on several server backends;
        of one that keeps sessions: a new client connection is handed the backend of one
        just closed; a proxy that is neither (the server sees other ports than ours) is
        reported as unknown. See :mod:`~ylock.engines.postgres.poolers`."""
        end = time.monotonic() + 5 * self.connect_timeout + 4 * self.socket_timeout
        try:
            found = drive(detect_io(self.conninfo), end)
        except Exception as exc:
            raise self._translate(exc) from exc
        return verdict(found, self.scope, self.pooler, self.url_for_display())

    # -- life cycle ---------------------------------------------------------------------------------------

    def check_options(self) -> None:
        """Everything was checked when the engine was built (libpq parsed the URL)."""

    def close(self) -> None:
        if self._pool.close():
            HOLDS.mark_lost(self, detail="the engine was closed: its lock connections with it")

    def _after_fork(self) -> None:
        # The parent's connections are not ours (psycopg does not close a PGconn collected
        # in another process than the one that made it): forget them.
        self._reset_state()
