"""The MySQL engine's acquisitions and releases, written once as steps (generators of
:mod:`~ylock.engines.mysql.ops` operations) for the blocking API and asyncio.

An acquisition checks a connection out of the pool and sends one round trip (see
:meth:`~ylock.engines.mysql.sql.Statements.lock_attempt`): it queues for the lock's
turnstile in the server (``GET_LOCK``, FIFO, bounded by the call's deadline), takes its own
mark and writes its row, whose AUTO_INCREMENT id is the fencing token. A writer that finds
readers inside waits for each reader's mark, holding the turnstile (so nobody enters behind
it); a semaphore's head waits for a holder's mark, holding the queue. Every wait is a
``GET_LOCK`` bounded by what is left of the deadline, and every round trip by that deadline
plus one socket timeout.

A wait that ends without the lock (its deadline) gives back what the session took
(``RELEASE_ALL_LOCKS``: a connection carries one hold at most); a cancelled asyncio wait has
the server end its session (``KILL``, from another connection: a closed socket is noticed
only a second later), which drops whatever a racing grant gave it.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, AcquireRequest, Steps
from ylock.engines.mysql.connection import Conn, Hold
from ylock.engines.mysql.ops import Query
from ylock.engines.mysql.sql import Row, Statements, comment, lock_key
from ylock.engines.sessions.pool import Pool
from ylock.engines.sessions.steps import Attempt, SessionSteps
from ylock.errors import EngineUnavailable, LockError


def _holds(listed: bytes | None) -> list[tuple[int, str, bool]]:
    """Parse the holds an attempt lists: "token mark[ live],..." -> (token, mark, live)."""
    out = []
    for item in (listed or b"").decode().split(","):
        parts = item.split()
        if len(parts) >= 2:
            out.append((int(parts[0]), parts[1], len(parts) < 3 or parts[2] == "1"))
    return out


class HoldSteps(SessionSteps[Conn]):
    """The steps of one engine's holds: its statements, key space and pool."""

    def __init__(self, pool: Pool[Conn], sql: Statements, *, prefix: str, database: str, socket_timeout: float,
                 where: Callable[[], str]) -> None:
        super().__init__(pool, socket_timeout=socket_timeout, where=where)
        self.sql = sql
        self.prefix = prefix
        self.database = database

    def key(self, kind: str, group: str, name: str) -> str:
        return lock_key(self.prefix, self.database, kind, group, name)

    # -- acquiring --------------------------------------------------------------------------------

    def downgrade(self, conn: Conn, r: AcquireRequest) -> Steps:
        """The writer's turnstile keeps everyone out, so its read lock needs nothing of the
        server until the write lock is released."""
        conn.modes.add(READ)
        return conn.token
        yield  # a generator, with no round trip

    def abandon(self, conn: Conn, r: AcquireRequest, kind: str) -> Steps:
        return (yield from self.kill(conn))

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _said(self, r: AcquireRequest, lk: str, kind: str, since: float, head: bool = False) -> str:
        info: dict[str, object] = {"k": lk, "c": kind, "m": r.mode, "o": r.owner, "g": r.group, "n": r.name,
                                   "t": since}
        if r.context:
            info["s"] = r.context
        if head:
            info["h"] = 1
        if kind == SEMAPHORE:
            info["p"] = r.permits
        return comment(info)

    def _lock(self, conn: Conn, r: AcquireRequest, hold: Hold) -> Steps:
        lk = self.key(LOCK, r.group, r.name)
        kx = self.sql.lock_name("x", lk)
        row = Row(lk, LOCK, r.mode, r.group, r.name, r.owner, self.sql.lock_name("m", uuid.uuid4().hex),
                  said=r.context or None)
        since = round(time.time(), 3)           # when it queued (describe's "since" of a waiter)
        said = self._said(r, lk, LOCK, since)
        head = self._said(r, lk, LOCK, since, head=True)
        results = yield Query(conn, self.sql.lock_attempt(row, kx, self._left(r.deadline), r.lease, said, head),
                              self._end(r.deadline))
        turnstile, token, _ = results[-1][0]
        if turnstile != b"1":
            return Attempt(None, False)        # not granted in time: the session holds nothing
        if token is None:
            return Attempt(None, True)         # readers stayed past the deadline: give back the turnstile
        conn.lk, conn.kx, conn.mark, conn.lease_set = lk, kx, row.mark, True
        self.pool.bind(conn, hold, r.mode, int(token))
        return Attempt(int(token), False)

    def _permit(self, conn: Conn, r: AcquireRequest, hold: Hold) -> Steps:
        lk = self.key(SEMAPHORE, r.group, r.name)
        kq = self.sql.lock_name("q", lk)
        row = Row(lk, SEMAPHORE, PERMIT, r.group, r.name, r.owner, self.sql.lock_name("m", uuid.uuid4().hex),
                  permits=r.permits, said=r.context or None)
        since = round(time.time(), 3)
        said = self._said(r, lk, SEMAPHORE, since)
        results = yield Query(conn, self.sql.permit_attempt(row, kq, self._left(r.deadline), r.lease, said),
                              self._end(r.deadline))
        queued, token, _, holders = results[-2][0]
        if queued != b"1":
            return Attempt(None, False)
        head = self._said(r, lk, SEMAPHORE, since, head=True)
        intervals = r.polling.intervals()
        while token is None:
            # The head of the queue, and full: wait for the oldest live holder's mark (a
            # release wakes us at once; another holder's release is seen at the next poll).
            left = self._left(r.deadline)
            if left is not None and left <= 0:
                return Attempt(None, True)
            listed = _holds(holders)
            live = [(t, m) for t, m, alive in listed if alive][:1]
            gone = [t for t, _, alive in listed if not alive]
            wait = next(intervals) if left is None else min(next(intervals), left)
            sql = self.sql.wait_for(live, wait, head)
            if not live:
                sql += f"{head}DO SLEEP({wait:.3f});\n"
            if gone:
                sql = f"DELETE FROM {self.sql.holds} WHERE token IN ({', '.join(map(str, gone))});\n{sql}"
            # Whether or not the holder left in time, look again (the head keeps the queue).
            sql += "SET @ylock_ok = 1;\n" + self.sql.permit_attempt(row, kq, None, r.lease, said, head=True)
            results = yield Query(conn, sql, self._end(r.deadline))
            _, token, _, holders = results[-2][0]
        conn.lk, conn.kx, conn.mark, conn.lease_set = lk, kq, row.mark, True
        self.pool.bind(conn, hold, PERMIT, int(token))
        return Attempt(int(token), False)

    def give_back(self, conn: Conn, r: AcquireRequest | None = None, kind: str = LOCK) -> Steps:
        """After a failed, timed-out or abandoned acquisition: let go of whatever the session
        holds (a grant can race with the failure), then pool the connection. One that cannot
        be cleaned is closed: the server drops its locks."""
        if conn.broken:
            self.pool.discard(conn)
            return
        try:
            yield Query(conn, self.sql.give_back(), time.monotonic() + self.socket_timeout)
            conn.lease_set = False
        except (LockError, EngineUnavailable):
            conn.close()
        self.pool.checkin(conn)

    def kill(self, conn: Conn) -> Steps:
        """Have the server end ``conn``'s session at once (a cancelled wait): ``KILL`` from
        another connection, then close it. The server drops its wait and anything a racing
        grant gave it. If no other connection can say it, closing is enough: the server
        notices within about a second."""
        if not conn.broken:
            other = None
            try:
                other = yield from self.pool.checkout(time.monotonic() + self.socket_timeout)
                yield Query(other, f"KILL {int(conn.id)}", time.monotonic() + self.socket_timeout)
            except (LockError, EngineUnavailable):
                pass
            finally:
                if other is not None:
                    self.pool.checkin(other)
        conn.close()
        self.pool.discard(conn)

    # -- releasing --------------------------------------------------------------------------------

    def _release(self, conn: Conn, kind: str, mode: str, last: bool, end: float) -> Steps:
        if not last and mode == READ:
            return True                            # a writer's read lock: within its turnstile
        if not last:                               # the write lock of a writer that also reads
            results = yield Query(conn, self.sql.downgraded(conn.token, conn.kx), end)
            return bool(results[-1][0][0] == b"1")
        kx = conn.kx if mode == WRITE else None
        results = yield Query(conn, self.sql.release(conn.token, conn.mark, kx), end)
        conn.lease_set = False
        return bool(results[1][0][0] == b"1")

    # -- tickets ----------------------------------------------------------------------------------

    def _adopted(self, conn: Conn, hold: Hold, token: int, end: float) -> Steps:
        """The hold's row says who holds it."""
        results = yield Query(conn, self.sql.adopt(token, hold.owner), end)
        return results[-1][0][0] == b"1"
