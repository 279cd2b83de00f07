"""A session engine's connections: a pool bounded by ``max_connections``, the table of which
connection carries which hold, and the heartbeats that renew them.

A server session's locks belong to it, and a session re-enters its own locks, so each owner
that holds or waits for a lock has a connection of its own for that lock; the pool keeps
``idle_connections`` of them for the next acquisition and closes the others. At the bound an
acquisition waits, first come first served, for one to come back."""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ylock.engines.base import Mailbox, Steps
from ylock.engines.nonblocking import drive_many
from ylock.engines.sessions.connection import Hold, SessionConn
from ylock.engines.sessions.ops import Open, Wait
from ylock.errors import EngineUnavailable

_SLOT = "slot"                      # handed to a waiter for a connection: "open one yourself"

C = TypeVar("C", bound=SessionConn)


class Pool(Generic[C]):
    """The lock connections of one engine in one process: idle ones, how many are open, who
    waits for one, and the held ones by what they carry (:class:`Hold`).

    ``server`` names the server in errors ("PostgreSQL"), ``logger`` is the engine's;
    ``session``: connections may carry state a proxy would hand on, so a healthy one is
    closed by :meth:`SessionConn.retire`."""

    def __init__(self, max_connections: int, idle_connections: int, connect_timeout: float,
                 where: Callable[[], str], *, server: str, logger: logging.Logger, session: bool = False) -> None:
        self.session = session
        self.max_connections = max_connections
        self.idle_connections = idle_connections
        self.connect_timeout = connect_timeout
        self.where = where
        self.server = server
        self.logger = logger
        self.mutex = threading.Lock()
        self.idle: list[C] = []
        self.open = 0
        self.slot_waiters: collections.deque[Mailbox] = collections.deque()
        self.held: dict[Hold, C] = {}

    def checkout(self, deadline: float | None) -> Steps:
        """Take an idle connection, open one, or wait (FIFO) until another is given back."""
        while True:
            mailbox = None
            with self.mutex:
                while self.idle:
                    conn = self.idle.pop()
                    if not conn.stale():
                        conn.reused, conn.answered = True, False
                        return conn
                    conn.close()
                    self.open -= 1
                if self.open < self.max_connections:
                    self.open += 1
                else:
                    mailbox = Mailbox()
                    self.slot_waiters.append(mailbox)
            if mailbox is not None:
                got = yield from self._wait_slot(mailbox, deadline)
                if got != _SLOT:
                    if not got.stale():
                        got.reused, got.answered = True, False
                        return got
                    got.close()                # its slot is ours now
            try:
                conn = yield Open(time.monotonic() + self.connect_timeout)
            except BaseException:
                self._free_slot()
                raise
            conn.answered = True
            return conn

    def _wait_slot(self, mailbox: Mailbox, deadline: float | None) -> Steps:
        got = None
        try:
            while got is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise EngineUnavailable(f"all {self.max_connections} connections of the {self.server} engine at "
                                            f"{self.where()} are in use (max_connections); none came back in time")
                got = yield Wait(mailbox, left)
            return got
        finally:
            if got is None:
                with self.mutex:
                    with contextlib.suppress(ValueError):
                        self.slot_waiters.remove(mailbox)
                late = mailbox.take()
                if isinstance(late, SessionConn):
                    self.checkin(late)  # type: ignore[arg-type]
                elif late == _SLOT:
                    self._free_slot()

    def _free_slot(self) -> None:
        """A connection was closed: hand its slot to a waiter, else count it gone."""
        with self.mutex:
            if self.slot_waiters:
                self.slot_waiters.popleft().put(_SLOT)
                return
            self.open -= 1

    def checkin(self, conn: C) -> None:
        """Give a connection back (to a waiter, the idle pool, or closed)."""
        if conn.hold is not None:
            self.held.pop(conn.hold, None)
        conn.unbind()
        if conn.busy.locked():
            with contextlib.suppress(RuntimeError):
                conn.busy.release()
        if not conn.reusable():
            self._close(conn)
            self._free_slot()
            return
        with self.mutex:
            if self.slot_waiters:
                self.slot_waiters.popleft().put(conn)
                return
            if len(self.idle) < self.idle_connections:
                self.idle.append(conn)
                return
            self.open -= 1
        self._close(conn)

    def _close(self, conn: C) -> None:
        if self.session:
            conn.retire()
        else:
            conn.close()

    def discard(self, conn: C) -> None:
        """Close a connection and give its slot back."""
        self._close(conn)
        self.checkin(conn)

    def bind(self, conn: C, hold: Hold, mode: str, token: int) -> None:
        """Record that ``conn`` now carries ``hold`` in ``mode`` (the engine has set what its
        protocol keeps per hold)."""
        conn.hold, conn.modes, conn.token = hold, {mode}, token
        self.held[hold] = conn

    def take(self, hold: Hold, mode: str, token: int) -> C | None:
        """Take the connection that carries ``hold`` in ``mode`` with ``token`` out of the
        table (its holder detached it); None if there is none."""
        with self.mutex:
            conn = self.held.get(hold)
            if conn is None or mode not in conn.modes or conn.token != token:
                return None
            del self.held[hold]
        return conn

    def renew(self, holds: Iterable[tuple[Hold, str]], end: float,
              failed: Callable[[C, BaseException], None]) -> list[bool | None]:
        """Send one heartbeat on each hold's connection (``holds``: what it carries and in
        which mode), all at once, and wait for them together until ``end``. Return for each
        whether it is still held (None: its owner is using the connection, so it is alive)."""
        holds = list(holds)
        results: list[bool | None] = [None] * len(holds)
        conns: dict[int, C] = {}
        index: list[tuple[int, int]] = []
        for i, (hold, mode) in enumerate(holds):
            conn = self.held.get(hold)
            if conn is None or mode not in conn.modes or conn.broken:
                results[i] = False
                continue
            if id(conn) not in conns:
                if not conn.busy.acquire(blocking=False):
                    continue                       # its owner is using it: it is alive
                conns[id(conn)] = conn
            index.append((i, id(conn)))
        outcomes = drive_many({cid: c.heartbeat() for cid, c in conns.items()}, end)
        for cid, conn in conns.items():
            outcome = outcomes.get(cid)
            if isinstance(outcome, BaseException):
                failed(conn, outcome)
                conn.close()                       # its session is gone or unanswering: the hold with it
                self.logger.info("ylock: heartbeat of %s failed: %s", conn.hold and tuple(conn.hold), outcome)
            conn.busy.release()
        for i, cid in index:
            results[i] = not conns[cid].broken
        return results

    def close(self) -> bool:
        """Close every connection, idle or held; return whether any carried a hold."""
        with self.mutex:
            idle, self.idle = self.idle, []
            held = list({id(c): c for c in self.held.values()}.values())
            self.held.clear()
            self.open -= len(idle) + len(held)
        for conn in idle + held:
            self._close(conn)
        return bool(held)
