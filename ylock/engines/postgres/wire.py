"""The PostgreSQL engine's wire: libpq (through ``psycopg.pq``) driven without blocking, so
that one code path serves the blocking API and asyncio, and every wait has a deadline.

Why not ``psycopg.Connection``: a blocking ``execute`` has no client-side timeout (a
frozen server holds it forever, and ``statement_timeout`` does not fire on a frozen
server), and an asyncio ``wait_for`` around ``AsyncConnection.execute`` took 11 s to give
up in the notes' experiment (it cancels, waits for the cancel, then closes). The lock
path needs neither psycopg's adapters nor its cursors: its statements take and return a
few numbers and strings as text.

So each exchange with the server is written once as a generator of *waits*, the way
psycopg writes its own (``psycopg.generators``): it yields ``(fd, READ|WRITE)`` and is
sent back what became ready. The drivers that run
them (:func:`drive`, :func:`adrive`, :func:`drive_many`) are :mod:`ylock.engines.nonblocking`'s,
shared with the MySQL engine.
"""
from __future__ import annotations

import select
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import pq

from ylock.engines.nonblocking import IO, READ, WRITE, Exchange, NoAnswer, adrive, drive, drive_many

__all__ = ["IO", "READ", "WRITE", "Exchange", "NoAnswer", "adrive", "drive", "drive_many", "Row", "ServerError",
           "Broken", "connect_io", "query_io", "cancel_io", "notified_io", "stale"]

#: A row as text: one bytes (or None for NULL) per column.
Row = tuple[bytes | None, ...]


class ServerError(Exception):
    """The server answered a statement with an error. ``sqlstate`` says which (e.g. 55P03:
    lock_timeout), ``fatal`` whether the server ended the session with it."""

    def __init__(self, sqlstate: str, message: str, fatal: bool) -> None:
        super().__init__(f"{message} (SQLSTATE {sqlstate})" if sqlstate else message)
        self.sqlstate = sqlstate
        self.message = message
        self.fatal = fatal


class Broken(Exception):
    """The connection failed (refused, reset, closed by the server without an error)."""


def _error(result: Any) -> ServerError:
    state = result.error_field(pq.DiagnosticField.SQLSTATE) or b""
    text = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or result.error_message or b"error"
    severity = result.error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED) or b""
    return ServerError(state.decode("ascii", "replace"), text.decode("utf-8", "replace").strip(),
                       severity in (b"FATAL", b"PANIC"))


def _message(pg: Any) -> str:
    return bytes(pg.error_message or b"").decode("utf-8", "replace").strip() or "connection failed"


# -- the exchanges ----------------------------------------------------------------------


def connect_io(conninfo: bytes) -> IO[Any]:
    """Open a connection (``PQconnectStart``/``PQconnectPoll``); return the ``PGconn`` in
    non-blocking mode. On any failure the half-open connection is closed."""
    pg = pq.PGconn.connect_start(conninfo)
    try:
        while True:
            if pg.status == pq.ConnStatus.BAD:
                raise Broken(_message(pg))
            status = pg.connect_poll()
            if status == pq.PollingStatus.OK:
                break
            if status == pq.PollingStatus.READING:
                yield pg.socket, READ
            elif status == pq.PollingStatus.WRITING:
                yield pg.socket, WRITE
            else:
                raise Broken(_message(pg))
        pg.nonblocking = 1
        return pg
    except BaseException:
        pg.finish()
        raise


def _flush(pg: Any) -> IO[None]:
    while pg.flush():
        ready = yield pg.socket, READ | WRITE
        if ready & READ:
            pg.consume_input()


def _results(pg: Any) -> IO[list[Any]]:
    """Read every result of the command(s) sent, up to the end (a pipeline: its sync)."""
    results: list[Any] = []
    while True:
        pg.consume_input()
        while pg.is_busy():
            yield pg.socket, READ
            pg.consume_input()
        result = pg.get_result()
        if result is None:
            if pg.status == pq.ConnStatus.BAD:
                raise Broken(_message(pg))
            if pg.pipeline_status:      # between two commands of a pipeline: read on
                continue
            return results
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)


def query_io(pg: Any, sends: Sequence[Callable[[Any], None]]) -> IO[list[list[Row]]]:
    """Send commands (each ``send(pg)`` queues one: a prepared statement, a parameterised
    one, a simple query) and return the rows of each. More than one command goes in one
    pipeline (one round trip; an error stops the rest); none at all is a bare Sync message:
    the cheapest exchange there is (it changes nothing on the server, not even what
    ``pg_stat_activity`` says the session ran last, but resets its idle timers). Raise
    :class:`ServerError` for the first error, :class:`Broken` when the connection failed."""
    piped = len(sends) != 1
    try:
        if piped:
            pg.enter_pipeline_mode()
        for send in sends:
            send(pg)
        if piped:
            pg.pipeline_sync()
        yield from _flush(pg)
        results = yield from _results(pg)
        if piped:
            pg.exit_pipeline_mode()
    except OSError as exc:
        raise Broken(str(exc)) from exc
    except psycopg.Error as exc:        # libpq: "server closed the connection unexpectedly"...
        raise Broken(f"{type(exc).__name__}: {exc}") from exc
    out: list[list[Row]] = []
    for result in results:
        status = result.status
        if status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR, pq.ExecStatus.BAD_RESPONSE):
            raise _error(result)
        if status == pq.ExecStatus.PIPELINE_ABORTED:
            continue
        out.append([tuple(result.get_value(r, c) for c in range(result.nfields)) for r in range(result.ntuples)])
    if pg.status == pq.ConnStatus.BAD:
        raise Broken(_message(pg))
    return out


def cancel_io(pg: Any) -> IO[None]:
    """Ask the server to cancel the command running on ``pg`` (a cancel request on a
    connection of its own, without blocking: ``PQcancelStart``/``PQcancelPoll``)."""
    cancel = pg.cancel_conn()
    try:
        cancel.start()
        while True:
            status = cancel.poll()
            if status == pq.PollingStatus.OK:
                return
            if status == pq.PollingStatus.READING:
                yield cancel.socket, READ
            elif status == pq.PollingStatus.WRITING:
                yield cancel.socket, WRITE
            else:
                raise Broken(bytes(cancel.error_message or b"").decode("utf-8", "replace") or "cancel failed")
    finally:
        cancel.finish()


def notified_io(pg: Any) -> IO[bool]:
    """Wait until a notification (LISTEN/NOTIFY) arrives; return True (drained)."""
    while True:
        pg.consume_input()
        if pg.status == pq.ConnStatus.BAD:
            raise Broken(_message(pg))
        got = False
        while pg.notifies() is not None:
            got = True
        if got:
            return True
        yield pg.socket, READ


def stale(pg: Any) -> bool:
    """Return True if an idle connection turns out closed or unusable, without a round trip:
    read whatever the server sent meanwhile (a restart's or a terminate's goodbye)."""
    if pg.status != pq.ConnStatus.OK or pg.transaction_status != pq.TransactionStatus.IDLE:
        return True
    poller = select.poll()
    poller.register(pg.socket, select.POLLIN)
    if poller.poll(0):
        try:
            pg.consume_input()
        except Exception:  # noqa: BLE001 - any failure means: do not use it
            return True
        while pg.notifies() is not None:
            pass
        return bool(pg.status != pq.ConnStatus.OK)
    return False
