"""The PostgreSQL engine's protocol: :class:`PostgresEngine`, its options, and the one
place where driver and server errors become ylock's (see the package docstring); what it
shares with the MySQL engine is :class:`~ylock.engines.sessions.engine.SessionEngine`'s."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from ylock import options as opt
from ylock.engines.base import LOCK, SEMAPHORE, Listing, check_limit
from ylock.engines.postgres.connection import Conn, conninfo, session_settings
from ylock.engines.postgres.executor import Executor
from ylock.engines.postgres.inspection import lock_infos
from ylock.engines.postgres.ops import Stmt
from ylock.engines.postgres.poolers import STATEMENT_MODE, detect_io, pooler_error, statement_mode, verdict
from ylock.engines.postgres.sql import Statements, advisory_key, channel, halves
from ylock.engines.postgres.steps import HoldSteps
from ylock.engines.postgres.wire import Broken, ServerError, drive
from ylock.engines.sessions.engine import SessionEngine
from ylock.engines.sessions.pool import Pool
from ylock.errors import EngineUnavailable, LockError, LockTimeout

logger = logging.getLogger("ylock.engines.postgres")


class PostgresEngine(SessionEngine):
    """Locks and semaphores on PostgreSQL advisory locks (see :mod:`ylock.engines.postgres`)."""

    scheme = "postgres"
    server = "PostgreSQL"
    url_schemes = ("postgresql", "postgres")
    url_options = {"scope": str, "max_connections": int, "idle_connections": int, "socket_timeout": float,
                   "connect_timeout": float, "keepalive": float, "prefix": str, "pooler": str}

    def __init__(self, url: str, *, scope: str = "session", max_connections: int = 10, idle_connections: int = 2,
                 socket_timeout: float = 2.0, connect_timeout: float = 2.0, keepalive: float = 10.0,
                 prefix: str = "ylock", pooler: str = "check", **libpq: Any) -> None:
        super().__init__()
        self.scope = opt.choice(scope, "PostgreSQL engine option scope", ("session", "transaction"),
                                code=opt.E_ENGINE_URL)
        self._limits(max_connections=max_connections, idle_connections=idle_connections,
                     socket_timeout=socket_timeout, connect_timeout=connect_timeout, keepalive=keepalive)
        self.pooler = opt.choice(pooler, "PostgreSQL engine option pooler", ("check", "session"),
                                 code=opt.E_ENGINE_URL)
        self.prefix = self._check_prefix(prefix, 40)
        self.url = url
        self.conninfo, self.app_name, self._display = conninfo(url, libpq, self.keepalive, self.url_options)
        self.sql = Statements(prefix, self.scope)
        self._reset_state()

    def _make_state(self) -> tuple[Pool[Conn], Executor, HoldSteps]:
        pool: Pool[Conn] = Pool(self.max_connections, self.idle_connections, self.connect_timeout,
                                self.url_for_display, server=self.server, logger=logger,
                                session=self.scope == "session")
        executor = Executor(self.sql, self.conninfo, session_settings(self.keepalive), self.url_for_display,
                            check_pooler=self.pooler == "check")
        steps = HoldSteps(pool, prefix=self.prefix, scope=self.scope, socket_timeout=self.socket_timeout,
                          app_name=self.app_name, local_settings=session_settings(self.keepalive, local=True),
                          where=self.url_for_display)
        return pool, executor, steps

    def url_for_display(self) -> str:
        return self._display

    # -- errors: the one place they are translated (the frame: SessionEngine._translate) --------------

    def _translate_server(self, exc: Exception, where: str, group: str | None, name: str | None) -> Exception:
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

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _utility(self, stmts: Sequence[Stmt], group: str | None = None, name: str | None = None) -> Any:
        return self._borrowed(stmts, group, name)[0]

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
