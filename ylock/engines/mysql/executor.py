"""The MySQL engine's executor: each operation of :mod:`~ylock.engines.mysql.ops` done
blocking or awaited (the frame: :class:`~ylock.engines.sessions.executor.SessionExecutor`) on
the wire of :mod:`~ylock.engines.mysql.wire`; and opening a lock connection (PyMySQL's
handshake, then the session's settings and identity in one round trip, the tables on the
first)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ylock.engines.mysql.connection import (
    Conn,
    Server,
    Target,
    check_version,
    handshake,
    read_only_error,
)
from ylock.engines.mysql.ops import Query
from ylock.engines.mysql.proxies import client_port, refusal
from ylock.engines.mysql.sql import Statements
from ylock.engines.mysql.wire import Broken, ServerError, drive
from ylock.engines.sessions.executor import SessionExecutor
from ylock.threads import start_thread

#: Server errors after which the session is gone: killed, timed out idle, shut down.
GONE = (1053, 1927, 4031, 2006, 2013)

#: What every lock connection sets and asks first. Waits are bounded by the engine's own
#: deadlines, not the server's statement timeouts (MariaDB's max_statement_time would end a
#: long GET_LOCK wait; MySQL's max_execution_time is set in a second statement there); READ
#: COMMITTED: the engine's reads never take gap locks.
SETUP = ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;\n"
         "SET SESSION innodb_lock_wait_timeout = {wait}, lock_wait_timeout = {wait} "
         "/*M!100000 , max_statement_time = 0 */;\n"
         "SELECT CONNECTION_ID(), VERSION(), @@read_only, "
         "(SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID())")


class Executor(SessionExecutor):
    """Do the steps' operations for one engine: where it connects and its statements."""

    Query: ClassVar[Any] = Query
    server = "MySQL"

    def __init__(self, target: Target, sql: Statements, connect_timeout: float, socket_timeout: float,
                 keepalive: float, where: Callable[[], str], check_proxy: bool = True) -> None:
        self.target = target
        self.sql = sql
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self.keepalive = keepalive
        self.where = where
        self.check_proxy = check_proxy
        self.refused = False
        self.ready = False                     # the tables exist (made on the first connection)
        self.mariadb: bool | None = None       # the server's flavour, once a connection said it

    def query_io(self, op: Query) -> Any:
        return op.conn.wire.query(op.sql.encode())

    def gone(self, exc: BaseException) -> bool:
        return isinstance(exc, Broken) or (isinstance(exc, ServerError) and exc.errno in GONE)

    def answered(self, exc: BaseException) -> bool:
        return isinstance(exc, ServerError)

    async def aopen(self, end: float) -> Conn:
        """:meth:`open` in a thread of its own: it is PyMySQL's handshake, rare, and bounded by
        its deadline (not in the loop's shared executor, where it could queue behind others
        past its deadline); a connection that arrives after the task was cancelled is closed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Conn] = loop.create_future()

        def deliver(conn: Conn | None, exc: BaseException | None) -> None:
            if future.done():
                if conn is not None:
                    conn.close()
            elif exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(conn)  # type: ignore[arg-type]

        def run() -> None:
            try:
                conn = self.open(end)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                loop.call_soon_threadsafe(deliver, None, exc)
            else:
                try:
                    loop.call_soon_threadsafe(deliver, conn, None)
                except RuntimeError:               # the loop is closed: nobody will take it
                    conn.close()
        start_thread(run, "ylock-mysql-connect")
        return await future

    def open(self, end: float) -> Conn:
        """Connect (within ``end``) and set the session up; on the engine's first connection
        create its tables, and when something stands between us and the server, look for
        connection multiplexing first (:mod:`~ylock.engines.mysql.proxies`). Return a
        :class:`Conn` ready for the pool."""
        if self.refused:
            raise refusal(self.where())
        wire, local_port = handshake(self.target, end, self.keepalive)
        # The handshake had connect_timeout; the session's setup is one more round trip.
        end = time.monotonic() + self.socket_timeout
        try:
            wait = max(1, int(self.socket_timeout + 0.999))
            setup = SETUP.format(wait=wait)
            if not self.ready:
                setup = f"{self.sql.setup()};\n{setup}"
            results = drive(wire.query(setup.encode()), end)
            cid, version, read_only, client = results[-1][0]
            server = Server(int(cid or 0), (version or b"").decode(), False, read_only not in (b"0", None),
                            (client or b"").decode())
            mariadb = check_version(server.version, self.where())
            server = server._replace(mariadb=mariadb)
            self.mariadb = mariadb
            if not mariadb:
                drive(wire.query(b"SET SESSION max_execution_time = 0"), end)
            if server.read_only:
                raise read_only_error(self.where())
            self.ready = True
            conn = Conn(wire, server, local_port)
            if self.check_proxy and client_port(server.client) != local_port:
                from ylock.engines.mysql.proxies import probe

                if probe(conn, lambda: self.open_bare(end), end):
                    self.refused = True
                    raise refusal(self.where())
                self.check_proxy = False
            return conn
        except BaseException:
            wire.close()
            raise

    def open_bare(self, end: float) -> Conn:
        """A connection with nothing set (the proxy probe's second one)."""
        wire, local_port = handshake(self.target, end, self.keepalive)
        try:
            results = drive(wire.query(b"SELECT CONNECTION_ID()"), end)
        except BaseException:
            wire.close()
            raise
        return Conn(wire, Server(int(results[0][0][0] or 0), "", False, False, ""), local_port)


def close_quietly(conn: Conn) -> None:
    with contextlib.suppress(Exception):
        conn.close()
