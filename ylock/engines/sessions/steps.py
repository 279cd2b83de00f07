"""The frame of a session engine's steps (generators of operations, run blocking or
awaited): an acquisition on a connection of its own, retried once on a new connection when
a pooled one had died while idle, given back when it fails; a release on the connection
that carries the hold, after the watchdog's heartbeat; a ticket's adoption. An engine's
steps say how a lock or a permit is taken on the server (:meth:`SessionSteps._lock`,
:meth:`~SessionSteps._permit`), downgraded, released and given back."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, Abandon, AcquireRequest, Steps
from ylock.engines.sessions.connection import Hold, SessionConn
from ylock.engines.sessions.ops import Claim
from ylock.engines.sessions.pool import Pool
from ylock.errors import EngineUnavailable, LockError

C = TypeVar("C", bound=SessionConn)


class Attempt(NamedTuple):
    """How one acquisition attempt on a connection ended: its ``token`` (None: not
    granted), and whether the connection may hold something of it anyway (``dirty``: a
    wait ended by a timeout, which a grant may have raced) and must give it back."""

    token: int | None
    dirty: bool


def kind_of(mode: str) -> str:
    """Return what a hold in ``mode`` is of: a semaphore (a permit) or a lock."""
    return SEMAPHORE if mode == PERMIT else LOCK


class SessionSteps(Generic[C]):
    """The steps of one engine's holds over its pool (see the module docstring)."""

    def __init__(self, pool: Pool[C], *, socket_timeout: float, where: Callable[[], str]) -> None:
        self.pool = pool
        self.socket_timeout = socket_timeout
        self.where = where

    # -- what an engine says ------------------------------------------------------------------

    def _lock(self, conn: C, r: AcquireRequest, hold: Hold) -> Steps:
        """Try or wait for the lock of ``r`` on ``conn``: an :class:`Attempt`."""
        raise NotImplementedError

    def _permit(self, conn: C, r: AcquireRequest, hold: Hold) -> Steps:
        """Try or wait for a permit of the semaphore of ``r`` on ``conn``: an :class:`Attempt`."""
        raise NotImplementedError

    def downgrade(self, conn: C, r: AcquireRequest) -> Steps:
        """The write holder of ``conn`` takes the read lock too: its token, or None."""
        raise NotImplementedError

    def give_back(self, conn: C, r: AcquireRequest, kind: str) -> Steps:
        """After a failed, timed-out or abandoned acquisition: let go of whatever the
        connection holds of it (a grant can race with the failure), then pool it. One that
        cannot be cleaned is closed: the server drops its locks."""
        raise NotImplementedError

    def abandon(self, conn: C, r: AcquireRequest, kind: str) -> Steps:
        """A cancelled acquisition (asyncio): end the exchange in flight on ``conn`` and
        leave nothing held."""
        raise NotImplementedError

    def _release(self, conn: C, kind: str, mode: str, last: bool, end: float) -> Steps:
        """Release ``mode`` on ``conn`` (``last``: its only mode), within ``end``: True if
        it was still held."""
        raise NotImplementedError

    def _adopted(self, conn: C, hold: Hold, token: int, end: float) -> Steps:
        """Say on the server that ``hold.owner`` now holds ``conn``'s hold: False if its
        session had ended."""
        raise NotImplementedError

    # -- the frame ------------------------------------------------------------------------------

    def _end(self, deadline: float | None) -> float | None:
        """Return the client's deadline of an exchange: the call's deadline plus one socket timeout."""
        return None if deadline is None else max(deadline, time.monotonic()) + self.socket_timeout

    def acquire(self, r: AcquireRequest) -> Steps:
        """Acquire ``r``: its token, or None when not granted within its deadline."""
        kind = kind_of(r.mode)
        hold = Hold(r.group, r.name, r.owner, kind)
        bound = self.pool.held.get(hold)
        if bound is not None:
            if r.mode == READ and bound.modes == {WRITE}:
                return (yield from self.downgrade(bound, r))
            raise LockError(f"{r.owner} already holds {'/'.join(sorted(bound.modes))} here", group=r.group,
                            name=r.name)
        conn: C | None = yield from self.pool.checkout(r.deadline)
        assert conn is not None
        try:
            while True:
                try:
                    attempt = yield from (self._lock(conn, r, hold) if kind == LOCK else self._permit(conn, r, hold))
                except EngineUnavailable:
                    if conn.reused and not conn.answered and conn.broken and not conn.cut:
                        # A pooled connection that died while idle (a server restart, an idle
                        # timeout): once more on a new one.
                        self.pool.checkin(conn)
                        conn = None
                        conn = yield from self.pool.checkout(r.deadline)
                        continue
                    raise
                if attempt.token is None:
                    if attempt.dirty:              # a wait that ended: the grant may have raced it
                        yield from self.give_back(conn, r, kind)
                    else:
                        self.pool.checkin(conn)
                conn = None
                return attempt.token
        except GeneratorExit:
            if conn is not None:
                self.pool.discard(conn)
            raise
        except Abandon:
            if conn is not None:
                yield from self.abandon(conn, r, kind)
            raise
        except BaseException:
            if conn is not None:
                if conn.pending is not None:
                    conn.close()
                yield from self.give_back(conn, r, kind)
            raise

    def release(self, group: str, name: str, owner: str, mode: str) -> Steps:
        """Release ``owner``'s hold in ``mode``: True if it was still held."""
        kind = kind_of(mode)
        conn = self.pool.held.get(Hold(group, name, owner, kind))
        if conn is None or mode not in conn.modes:
            return False
        end = time.monotonic() + self.socket_timeout
        last = len(conn.modes) == 1
        if not conn.busy.acquire(blocking=False):
            yield Claim(conn, end)                 # a heartbeat is on it: wait (one round trip at most)
        try:
            if conn.broken:
                return False
            try:
                return (yield from self._release(conn, kind, mode, last, end))
            except EngineUnavailable:
                if conn.cut:
                    raise                          # no answer: we closed it; the server frees the lock on noticing
                return False                       # the server had ended the session: the lock was gone
        finally:
            conn.modes.discard(mode)
            if last or conn.broken:
                self.pool.checkin(conn)
            else:
                conn.busy.release()

    def adopt(self, conn: C, hold: Hold, token: int) -> Steps:
        """Hand ``conn`` (taken out of the pool's table) to ``hold.owner``. Return False if
        its session had ended (its lease ran out: nobody renews a detached hold), the hold
        with it."""
        end = time.monotonic() + self.socket_timeout
        yield Claim(conn, end)
        try:
            adopted: Any = yield from self._adopted(conn, hold, token, end)
        except (EngineUnavailable, LockError):
            adopted = False
        if not adopted:
            self.pool.checkin(conn)                # its session ended: the hold with it
            return False
        conn.hold = hold
        self.pool.held[hold] = conn
        conn.busy.release()
        return True
