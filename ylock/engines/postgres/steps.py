"""The PostgreSQL engine's steps: acquiring a lock or a semaphore's permit, downgrading a
write hold, releasing, and giving back what a failed acquisition may have been granted.

Written once as generators of :mod:`~ylock.engines.postgres.ops` operations, run blocking
or awaited by the engine, in the session engines' frame
(:class:`~ylock.engines.sessions.steps.SessionSteps`). Every wait is bounded twice: on the
server (``lock_timeout`` = what is left of the caller's timeout) and on the client (each
exchange's deadline is the timeout plus ``socket_timeout``). A grant can race with a timeout or a cancellation, so
after a failed or abandoned wait the connection gives back whatever it holds of the key
before it is reused.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, Abandon, AcquireRequest, Steps
from ylock.engines.postgres.connection import Conn, Hold
from ylock.engines.postgres.ops import Cancel, Claim, Notified, Query, Sleep, Stmt
from ylock.engines.postgres.poolers import check_session
from ylock.engines.postgres.sql import advisory_key, channel, halves
from ylock.engines.sessions.pool import Pool
from ylock.engines.sessions.steps import Attempt, SessionSteps
from ylock.errors import EngineUnavailable, LockError, LockTimeout

_INT_MAX = 2**31 - 1


class HoldSteps(SessionSteps[Conn]):
    """The steps of one engine's holds: its key prefix, scope and pool."""

    def __init__(self, pool: Pool[Conn], *, prefix: str, scope: str, socket_timeout: float, app_name: str,
                 local_settings: str, where: Callable[[], str]) -> None:
        super().__init__(pool, socket_timeout=socket_timeout, where=where)
        self.prefix = prefix
        self.xact = scope == "transaction"
        self.app_name = app_name
        self.local_settings = local_settings
        self.registered: dict[int, int | None] = {}   # keys named in the names table (semaphores: permits)

    # -- acquiring --------------------------------------------------------------------------------------

    def abandon(self, conn: Conn, r: AcquireRequest, kind: str) -> Steps:
        """Cancel the statement in flight, read its end, then give back what it was granted."""
        yield Cancel(conn, time.monotonic() + self.socket_timeout)
        yield from self.give_back(conn, r, kind)

    def _lease_ms(self, r: AcquireRequest) -> int:
        return max(1, min(_INT_MAX, int(r.lease * 1000)))

    def _wait_ms(self, deadline: float | None) -> int:
        if deadline is None:
            return 0
        left = int((deadline - time.monotonic()) * 1000 + 0.999)
        return 0 if left > _INT_MAX else max(1, left)

    def _begin(self) -> list[Stmt]:
        """Transaction scope: what opens a hold's transaction (sent with its first statement):
        the session settings, local to the transaction (a pooler's server connection is
        shared: nothing may outlive the hold on it)."""
        return [Stmt("BEGIN"), Stmt(f"SELECT {self.local_settings}1")]

    def _granted(self, conn: Conn, r: AcquireRequest, hold: Hold, key: int, mode: str, token: int, pid: int) -> None:
        if not self.xact:
            check_session(conn, pid, self.where, r.group, r.name)
        conn.key = key
        self.pool.bind(conn, hold, mode, token)

    def _lock(self, conn: Conn, r: AcquireRequest, hold: Hold) -> Steps:
        key = advisory_key(self.prefix, LOCK, r.group, r.name)
        shared = r.mode == READ
        if self.xact and key not in self.registered:
            yield Query(conn, [Stmt("register", [key, r.group, r.name])], self._end(time.monotonic()))
            self.registered[key] = None
        args: list[Any] = [key, r.group, r.name, r.owner, self._lease_ms(r)]
        try_now = r.deadline is not None and time.monotonic() >= r.deadline
        if r.queued is not None and not try_now:
            # Watched: the server waits on its own, so only a try tells whether the acquisition
            # will wait; the watchers hear of it before the wait starts.
            attempt = yield from self._lock_once(conn, r, hold, key, Stmt("try_s" if shared else "try_x", args,
                                                                          r.context))
            if attempt.token is not None:
                return attempt
            r.queued(None)
        if try_now:
            stmt = Stmt("try_s" if shared else "try_x", args, r.context)
        else:
            stmt = Stmt("wait_s" if shared else "wait_x", [*args, self._wait_ms(r.deadline)], r.context)
        return (yield from self._lock_once(conn, r, hold, key, stmt))

    def _lock_once(self, conn: Conn, r: AcquireRequest, hold: Hold, key: int, stmt: Stmt) -> Steps:
        """Run one try or wait for the lock ``key`` on ``conn``: its :class:`Attempt`."""
        stmts = [*self._begin(), stmt] if self.xact else [stmt]
        try:
            results = yield Query(conn, stmts, self._end(r.deadline))
        except LockTimeout:
            return Attempt(None, True)             # lock_timeout: a grant may have raced it
        rows = results[-1]
        if not rows:
            if self.xact:
                yield Query(conn, [Stmt("ROLLBACK")], self._end(time.monotonic()))
            return Attempt(None, False)
        token, pid = int(rows[0][0] or 0), int(rows[0][1] or 0)
        self._granted(conn, r, hold, key, r.mode, token, pid)
        return Attempt(token, False)

    def downgrade(self, conn: Conn, r: AcquireRequest) -> Steps:
        """The write holder takes the read lock on its own connection: granted at once."""
        end = time.monotonic() + self.socket_timeout
        if not conn.busy.acquire(blocking=False):
            yield Claim(conn, end)                 # a heartbeat is on it: wait (one round trip at most)
        give = Stmt("give", [conn.key, *halves(conn.key), True, None])      # the read lock only
        try:
            try:
                yield Query(conn, [Stmt("down", [conn.key, max(1, int(self.socket_timeout * 1000))], r.context)],
                            end)
            except LockTimeout:
                yield Query(conn, [give], time.monotonic() + self.socket_timeout)
                return None
            except EngineUnavailable:
                if conn.broken:
                    return None                    # the write hold went with its connection
                raise
            except Abandon:
                # Cancelled: the statement is granted at once, so read its end and give the
                # read lock back (the write hold stays, on this connection).
                yield Cancel(conn, time.monotonic() + self.socket_timeout, cancel=False)
                if not conn.broken:
                    with contextlib.suppress(LockError, EngineUnavailable):
                        yield Query(conn, [give], time.monotonic() + self.socket_timeout)
                raise
            conn.modes.add(READ)
            return conn.token
        finally:
            conn.busy.release()

    def give_back(self, conn: Conn, r: AcquireRequest, kind: str) -> Steps:
        """After a failed, timed-out or abandoned acquisition: release whatever the
        connection holds of this key (the grant can race with the failure), then pool it.
        A connection that cannot be cleaned is closed: the server drops its locks."""
        if conn.broken:
            self.pool.discard(conn)
            return
        if kind == LOCK:
            key = advisory_key(self.prefix, LOCK, r.group, r.name)
            stmts = [Stmt("give", [key, *halves(key), r.mode == READ, self.app_name])]
        else:
            key = advisory_key(self.prefix, SEMAPHORE, r.group, r.name)
            queue = advisory_key(self.prefix, "queue", r.group, r.name)
            stmts = [Stmt("give", [key, *halves(key), True, self.app_name]),
                     Stmt("give", [queue, *halves(queue), False, self.app_name])]
            if conn.listening:
                stmts.append(Stmt("UNLISTEN *"))
        if self.xact:
            stmts = [Stmt("ROLLBACK"), *stmts]
        for attempt in range(2):
            try:
                yield Query(conn, stmts, time.monotonic() + self.socket_timeout)
                conn.listening = False
                break
            except (LockError, EngineUnavailable) as exc:
                # A cancel request that arrived late cancels the next statement: once more.
                if conn.broken or attempt or "57014" not in str(exc.__cause__ or ""):
                    conn.close()
                    break
        self.pool.checkin(conn)

    # -- semaphores ---------------------------------------------------------------------------------------

    def _permit(self, conn: Conn, r: AcquireRequest, hold: Hold) -> Steps:
        key = advisory_key(self.prefix, SEMAPHORE, r.group, r.name)
        queue = advisory_key(self.prefix, "queue", r.group, r.name)
        if self.registered.get(key) != r.permits:
            yield Query(conn, [Stmt("sem_register", [key, queue, r.group, r.name, r.permits])],
                        self._end(time.monotonic()))
            self.registered[key] = r.permits
        args: list[Any] = [queue, key, *halves(key), r.permits, r.owner, self._lease_ms(r)]
        stmts = [Stmt("sem_try", args, r.context)]
        if self.xact:
            stmts = [*self._begin(), *stmts]
        results = yield Query(conn, stmts, self._end(r.deadline))
        queued, token, pid = results[-1][0]
        if int(queued or 0) and token is None and r.deadline is not None and time.monotonic() >= r.deadline:
            return Attempt(None, True)             # full, and no time to wait: give the queue back
        if token is None and r.queued is not None:
            r.queued(None)                         # the try found no permit: the watchers hear of the wait
        if not int(queued or 0) and token is None:
            if r.deadline is not None and time.monotonic() >= r.deadline:
                if self.xact:
                    yield Query(conn, [Stmt("ROLLBACK")], self._end(time.monotonic()))
                return Attempt(None, False)
            try:
                results = yield Query(conn, [Stmt("sem_wait", [*args, self._wait_ms(r.deadline)], r.context)],
                                      self._end(r.deadline))
            except LockTimeout:
                return Attempt(None, True)
            queued, token, pid = results[-1][0]
        if token is None:
            # We are the head of the queue: admitted when a holder leaves (we hear its NOTIFY,
            # or find out at a poll: a holder that vanished notifies nobody).
            if not self.xact:
                yield Query(conn, [Stmt(f'LISTEN "{channel(key)}"')], self._end(time.monotonic()))
                conn.listening = True
            intervals = r.polling.intervals()
            while True:
                results = yield Query(conn, [Stmt("sem_admit", args, r.context)], self._end(time.monotonic()))
                queued, token, pid = results[-1][0]
                if token is not None:
                    break
                left = None if r.deadline is None else r.deadline - time.monotonic()
                if left is not None and left <= 0:
                    return Attempt(None, True)     # the caller gives Q back
                wait = next(intervals) if left is None else min(next(intervals), left)
                if conn.listening:
                    yield Notified(conn, wait)
                else:
                    yield Sleep(wait)
        conn.channel, conn.queue_key = channel(key), queue
        self._granted(conn, r, hold, key, PERMIT, int(token), int(pid or 0))
        return Attempt(int(token), False)

    # -- releasing --------------------------------------------------------------------------------------

    def _release(self, conn: Conn, kind: str, mode: str, last: bool, end: float) -> Steps:
        stmts: list[Stmt]
        if self.xact:
            if not last:
                return True                        # a transaction lock is released with the others
            stmts = [Stmt("SELECT pg_notify($1, '')", [conn.channel])] if kind == SEMAPHORE else []
            stmts.append(Stmt("COMMIT"))
        elif kind == SEMAPHORE:
            stmts = [Stmt("sem_rel", [conn.key, conn.channel, self.app_name])]
        else:
            stmts = [Stmt("rel", [conn.key, mode == READ, last, self.app_name])]
        if conn.listening and last:
            stmts.append(Stmt("UNLISTEN *"))
        results = yield Query(conn, stmts, end)
        conn.listening = False
        return self.xact or results[0][0][0] == b"t"

    # -- tickets ----------------------------------------------------------------------------------------

    def _adopted(self, conn: Conn, hold: Hold, token: int, end: float) -> Steps:
        """The connection's application name says who holds it."""
        yield Query(conn, [Stmt("SELECT set_config('application_name', $1, false)", [f"{token}:{hold.owner}"])], end)
        return True
