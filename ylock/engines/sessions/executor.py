"""The frame of a session engine's executor: each operation its steps yield done blocking
(:meth:`SessionExecutor.do`) or awaited (:meth:`SessionExecutor.ado`), and what a failed
exchange leaves of its connection. An engine's executor says how a query is sent on its
wire (:meth:`~SessionExecutor.query_io`), how a connection is opened, which server errors
end the session, and does the operations of its own."""
from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from ylock.engines.nonblocking import IO, Exchange, NoAnswer, adrive, drive
from ylock.engines.sessions.connection import SessionConn
from ylock.engines.sessions.ops import Claim, Open, Wait


class SessionExecutor:
    """Do the steps' operations for one engine. A subclass sets :attr:`Query` (its query
    operation: ``conn``, what to send, ``end``) and :attr:`server` (named in errors)."""

    Query: ClassVar[Any] = None
    server: ClassVar[str] = ""
    #: Close the connection after an exchange failed with an error that is neither the
    #: server's answer nor the wire's (a bug): it may be in the middle of a message.
    close_on_other_errors = True

    def query_io(self, op: Any) -> IO[Any]:
        """The exchange that sends ``op`` (a :attr:`Query`) and reads its answers."""
        raise NotImplementedError

    def open(self, end: float) -> SessionConn:
        """Open a lock connection and set it up, blocking, within ``end``."""
        raise NotImplementedError

    async def aopen(self, end: float) -> SessionConn:
        """:meth:`open` on the running event loop."""
        raise NotImplementedError

    def gone(self, exc: BaseException) -> bool:
        """Return whether ``exc`` means the connection (its session) is gone."""
        raise NotImplementedError

    def answered(self, exc: BaseException) -> bool:
        """Return whether ``exc`` is the server's answer (the connection is still fine)."""
        raise NotImplementedError

    def do_other(self, op: Any) -> Any:
        """Do an operation of the engine's own, blocking."""
        raise TypeError(f"not an operation of the {self.server} engine: {op!r}")

    async def ado_other(self, op: Any) -> Any:
        """Do an operation of the engine's own on the running event loop."""
        raise TypeError(f"not an operation of the {self.server} engine: {op!r}")

    def do(self, op: Any) -> Any:
        """Do ``op``, blocking."""
        if type(op) is self.Query:
            conn = op.conn
            ex = conn.pending = Exchange(self.query_io(op))
            try:
                result: Any = drive(ex, op.end)
            except BaseException as exc:
                self.failed(conn, exc)
                raise
            conn.pending = None
            conn.answered = True
            return result
        if type(op) is Open:
            return self.open(op.end)
        if type(op) is Wait:
            return op.mailbox.wait(op.timeout)
        if type(op) is Claim:
            if not op.conn.busy.acquire(timeout=max(0.0, op.end - time.monotonic())):
                raise NoAnswer("the connection stayed busy")
            return None
        return self.do_other(op)

    async def ado(self, op: Any) -> Any:
        """Do ``op`` on the running event loop."""
        if type(op) is self.Query:
            conn = op.conn
            ex = conn.pending = Exchange(self.query_io(op))
            try:
                result: Any = await adrive(ex, op.end)
            except asyncio.CancelledError:
                raise                              # the exchange stays pending: the steps end it
            except BaseException as exc:
                self.failed(conn, exc)
                raise
            conn.pending = None
            conn.answered = True
            return result
        if type(op) is Open:
            return await self.aopen(op.end)
        if type(op) is Wait:
            return await op.mailbox.await_(op.timeout)
        if type(op) is Claim:
            while not op.conn.busy.acquire(blocking=False):     # the watchdog's heartbeat: short
                if time.monotonic() > op.end:
                    raise NoAnswer("the connection stayed busy")
                await asyncio.sleep(0.001)
            return None
        return await self.ado_other(op)

    def failed(self, conn: SessionConn, exc: BaseException) -> None:
        """An exchange failed: decide whether the connection can still be used."""
        if isinstance(exc, NoAnswer):
            conn.cut = True
            conn.close()                           # in the middle of a message: useless
        elif self.gone(exc):
            conn.close()
        elif self.answered(exc):
            conn.pending = None                    # an error answer: the connection is fine
            conn.answered = True
        elif self.close_on_other_errors or not isinstance(exc, Exception):
            conn.close()                           # interrupted (KeyboardInterrupt...) or a bug
