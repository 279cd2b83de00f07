"""The PostgreSQL engine's executor: each operation of :mod:`~ylock.engines.postgres.ops`
done blocking or awaited (the frame: :class:`~ylock.engines.sessions.executor.SessionExecutor`),
on the wire of :mod:`~ylock.engines.postgres.wire`; and opening a lock connection."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ylock import options as opt
from ylock.engines.postgres.connection import Conn, proxied
from ylock.engines.postgres.ops import Cancel, Notified, Query, Sleep, Stmt
from ylock.engines.postgres.poolers import IDENTITY, needs_probe, pooler_error, probe_io, refusal, statement_mode
from ylock.engines.postgres.sql import PREPARED, WHO, Statements
from ylock.engines.postgres.wire import (
    Broken,
    NoAnswer,
    ServerError,
    adrive,
    cancel_io,
    connect_io,
    drive,
    notified_io,
    query_io,
)
from ylock.engines.sessions.executor import SessionExecutor
from ylock.errors import ConfigurationError

GONE = ("57P01", "57P02", "57P03", "57P05")    # the server ended the session
_DUPLICATE = ("23505", "42P07", "42710")       # two first uses created the tables at once


class Executor(SessionExecutor):
    """Do the steps' operations for one engine: its statements (prepared in session scope),
    its connection string and session settings."""

    Query: ClassVar[Any] = Query
    server = "PostgreSQL"
    close_on_other_errors = False

    def __init__(self, sql: Statements, conninfo: bytes, settings: str, where: Callable[[], str],
                 check_pooler: bool = False) -> None:
        self.sql = sql
        self.conninfo = conninfo
        self.where = where
        self.prepared = sql.scope == "session"
        # Look for a pooler on the first connection, before it sets anything (see poolers):
        # session scope refuses one in transaction mode (then every connection), both scopes
        # one in statement mode.
        self.check_pooler = check_pooler
        self.refused = False
        # Session scope behind a proxy (or ?pooler=session): a pooler in session mode may hand
        # us a server session a killed client left behind, with its locks and prepared
        # statements if the pooler's server_reset_query is off: drop them (it is ours now).
        self.scrub = self.prepared and not check_pooler
        self.texts = {name: make(sql).encode() for name, make in PREPARED.items()}
        self.who = (f"SELECT {settings if self.prepared else ''}{WHO}").encode()
        self.ready = False                     # the tables exist (checked on the first connection)

    def query_io(self, op: Query) -> Any:
        return query_io(op.conn.pg, self.sends(op.stmts))

    def open(self, end: float) -> Conn:
        return drive(self.open_io(), end)  # type: ignore[no-any-return]

    async def aopen(self, end: float) -> Conn:
        io = self.open_io()
        try:
            return await adrive(io, end)
        except BaseException:
            io.close()                         # closes a half-open connection
            raise

    def gone(self, exc: BaseException) -> bool:
        return isinstance(exc, Broken) or (isinstance(exc, ServerError) and (exc.fatal or exc.sqlstate in GONE))

    def answered(self, exc: BaseException) -> bool:
        return isinstance(exc, ServerError)

    def do_other(self, op: Any) -> Any:
        """Do an operation of this engine's own, blocking: a notification, a cancel, a sleep."""
        if type(op) is Notified:
            try:
                return drive(notified_io(op.conn.pg), time.monotonic() + op.timeout)
            except NoAnswer:
                return False
        if type(op) is Cancel:
            return self.cancel(op.conn, op.end, drive, op.cancel)
        if type(op) is Sleep:
            time.sleep(op.seconds)
            return None
        return super().do_other(op)

    async def ado_other(self, op: Any) -> Any:
        """:meth:`do_other` on the running event loop."""
        if type(op) is Notified:
            try:
                return await adrive(notified_io(op.conn.pg), time.monotonic() + op.timeout)
            except NoAnswer:
                return False
        if type(op) is Cancel:
            return await self.acancel(op.conn, op.end, op.cancel)
        if type(op) is Sleep:
            await asyncio.sleep(op.seconds)
            return None
        return await super().ado_other(op)

    def cancel(self, conn: Conn, end: float, run: Callable[..., Any], cancel: bool = True) -> Any:
        """Cancel the exchange in flight on ``conn`` (unless ``cancel`` is False: only finish
        it) and read its outcome: its rows, or the error it ended with (never raised: the
        caller gives back whatever it holds)."""
        if conn.pending is None or conn.broken:
            return None
        try:
            if cancel:
                run(cancel_io(conn.pg), end)
            return run(conn.pending, end)
        except ServerError as exc:
            self.failed(conn, exc)
            return exc
        except BaseException as exc:
            self.failed(conn, exc if isinstance(exc, Exception) else NoAnswer())
            conn.close()
            return exc
        finally:
            conn.pending = None

    async def acancel(self, conn: Conn, end: float, cancel: bool = True) -> Any:
        """:meth:`cancel`, awaited."""
        if conn.pending is None or conn.broken:
            return None
        try:
            if cancel:
                await adrive(cancel_io(conn.pg), end)
            return await adrive(conn.pending, end)
        except ServerError as exc:
            self.failed(conn, exc)
            return exc
        except BaseException as exc:
            conn.close()
            return exc
        finally:
            conn.pending = None

    def sends(self, stmts: Sequence[Stmt]) -> list[Callable[[Any], None]]:
        """Return how to send each statement: prepared in session scope, else unnamed (what a
        pooler in transaction mode lets through)."""
        sends: list[Callable[[Any], None]] = []
        for sql, params, said in stmts:
            values = None if params is None else [None if p is None else p if isinstance(p, bytes) else _b(p)
                                                  for p in params]
            if self.prepared and not said and sql in PREPARED:
                sends.append(_send_prepared(f"ylock_{sql}".encode(), values))
            else:
                text = self.texts.get(sql) or sql.encode()
                if said:
                    # What the owner is doing rides in a comment: pg_stat_activity shows the
                    # statement a session ran last, so describe() reads it from there (no write).
                    text = b"/* ylock:" + said.replace("*/", "*\\/").encode() + b" */ " + text
                sends.append(_send_params(text, values))
        return sends

    def open_io(self) -> Any:
        """Connect and set the session up: its settings and prepared statements, in one
        pipeline (one round trip); the tables first, on the engine's first connection; and
        before anything, on the engine's first connection if it is not a direct TCP one,
        look for a pooler that breaks its locks (:mod:`~ylock.engines.postgres.poolers`).
        Return a :class:`Conn` ready for the pool."""
        if self.refused:
            raise refusal(self.where())
        pg = yield from connect_io(self.conninfo)
        pg.notice_handler = _ignore_notice
        try:
            if self.check_pooler:
                rows = yield from query_io(pg, [_send_params(IDENTITY, None)])
                _, server_port, client_port, _ = rows[0][0]
                if needs_probe(pg, server_port, client_port):
                    other = yield from connect_io(self.conninfo)
                    try:
                        kind = yield from probe_io(pg, other)
                    finally:
                        other.finish()
                    if kind == "statement":
                        raise statement_mode(self.where())
                    if kind == "transaction" and self.prepared:
                        self.refused = True
                        raise refusal(self.where())
                    self.scrub = self.prepared
                self.check_pooler = False
            if not self.ready:
                setup = self.sql.setup().encode()
                for attempt in range(3):
                    try:
                        yield from query_io(pg, [lambda pg: pg.send_query(setup)])
                        break
                    except ServerError as exc:
                        if exc.sqlstate not in _DUPLICATE or attempt == 2:
                            raise
                self.ready = True
            sends = [_send_params(text, None) for text in _SCRUB] if self.scrub else []
            who = len(sends)
            sends.append(_send_params(self.who, None))
            if self.prepared:
                sends += [_send_prepare(f"ylock_{name}".encode(), self.texts[name]) for name in PREPARED]
            try:
                results = yield from query_io(pg, sends)
            except ServerError as exc:
                found = pooler_error(exc, self.where()) if self.prepared else None
                if found is not None:
                    raise found from exc
                raise
            pid, server_port, client_port, version = results[who][0][-4:]
            if int(version or 0) < 140000:
                raise ConfigurationError(f"PostgreSQL at {self.where()} is version {int(version or 0)}; "
                                         "ylock needs 14 or later", code=opt.E_ENGINE_URL)
            return Conn(pg, int(pid or 0), proxied(pg, server_port, client_port))
        except BaseException:
            pg.finish()
            raise


#: What a session-scope connection behind a proxy drops first (see Executor.scrub).
_SCRUB = (b"SELECT pg_advisory_unlock_all()", b"DEALLOCATE ALL", b"UNLISTEN *")


def _b(value: object) -> bytes:
    if value is True:
        return b"t"
    if value is False:
        return b"f"
    return str(value).encode()


def _send_prepared(name: bytes, values: list[bytes | None] | None) -> Callable[[Any], None]:
    return lambda pg: pg.send_query_prepared(name, values)


def _send_params(text: bytes, values: list[bytes | None] | None) -> Callable[[Any], None]:
    return lambda pg: pg.send_query_params(text, values)


def _send_prepare(name: bytes, text: bytes) -> Callable[[Any], None]:
    return lambda pg: pg.send_prepare(name, text)


def _ignore_notice(result: Any) -> None:
    """Notices (an unlock of what was not held, in a give-back) are expected: not printed."""
