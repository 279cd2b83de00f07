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
from typing import NamedTuple

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, Abandon, AcquireRequest, Steps
from ylock.engines.mysql.connection import Conn, Hold
from ylock.engines.mysql.ops import Claim, Query
from ylock.engines.mysql.pool import Pool
from ylock.engines.mysql.sql import Row, Statements, comment, lock_key
from ylock.errors import EngineUnavailable, LockError


class Attempt(NamedTuple):
    """How one acquisition attempt ended: its ``token`` (None: not granted), and whether the
    session may hold something of it (``dirty``: a turnstile or queue, a mark) to give back."""

    token: int | None
    dirty: bool


def kind_of(mode: str) -> str:
    """Return what a hold in ``mode`` is of: a semaphore (a permit) or a lock."""
    return SEMAPHORE if mode == PERMIT else LOCK


def _holds(listed: bytes | None) -> list[tuple[int, str, bool]]:
    """Parse the holds an attempt lists: "token mark[ live],..." -> (token, mark, live)."""
    out = []
    for item in (listed or b"").decode().split(","):
        parts = item.split()
        if len(parts) >= 2:
            out.append((int(parts[0]), parts[1], len(parts) < 3 or parts[2] == "1"))
    return out


class HoldSteps:
    """The steps of one engine's holds: its statements, key space and pool."""

    def __init__(self, pool: Pool, sql: Statements, *, prefix: str, database: str, socket_timeout: float,
                 where: Callable[[], str]) -> None:
        self.pool = pool
        self.sql = sql
        self.prefix = prefix
        self.database = database
        self.socket_timeout = socket_timeout
        self.where = where

    def key(self, kind: str, group: str, name: str) -> str:
        return lock_key(self.prefix, self.database, kind, group, name)

    # -- acquiring --------------------------------------------------------------------------------

    def acquire(self, r: AcquireRequest) -> Steps:
        """Acquire ``r``: its token, or None when not granted within its deadline."""
        kind = kind_of(r.mode)
        hold = Hold(r.group, r.name, r.owner, kind)
        bound = self.pool.held.get(hold)
        if bound is not None:
            if r.mode == READ and bound.modes == {WRITE}:
                # A downgrade: the writer's turnstile keeps everyone out, so its read lock
                # needs nothing of the server until the write lock is released.
                bound.modes.add(READ)
                return bound.token
            raise LockError(f"{r.owner} already holds {'/'.join(sorted(bound.modes))} here", group=r.group,
                            name=r.name)
        conn: Conn | None = yield from self.pool.checkout(r.deadline)
        assert conn is not None
        try:
            while True:
                try:
                    attempt = yield from (self._lock(conn, r, hold) if kind == LOCK else self._permit(conn, r, hold))
                except EngineUnavailable:
                    if conn.reused and not conn.answered and conn.broken and not conn.cut:
                        # A pooled connection that died while idle (a restart, wait_timeout): once
                        # more on a new one.
                        self.pool.checkin(conn)
                        conn = None
                        conn = yield from self.pool.checkout(r.deadline)
                        continue
                    raise
                if attempt.token is None:
                    if attempt.dirty:
                        yield from self.give_back(conn)
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
                yield from self.kill(conn)
            raise
        except BaseException:
            if conn is not None:
                if conn.pending is not None:
                    conn.close()
                yield from self.give_back(conn)
            raise

    def _end(self, deadline: float | None) -> float | None:
        """The client's deadline of an exchange: the call's deadline plus one socket timeout."""
        return None if deadline is None else max(deadline, time.monotonic()) + self.socket_timeout

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
        conn.lk, conn.kx, conn.mark = lk, kx, row.mark
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
        conn.lk, conn.kx, conn.mark = lk, kq, row.mark
        self.pool.bind(conn, hold, PERMIT, int(token))
        return Attempt(int(token), False)

    def give_back(self, conn: Conn) -> Steps:
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
            if not last and mode == READ:
                return True                        # a writer's read lock: within its turnstile
            try:
                if not last:                       # the write lock of a writer that also reads
                    results = yield Query(conn, self.sql.downgraded(conn.token, conn.kx), end)
                    return bool(results[-1][0][0] == b"1")
                kx = conn.kx if mode == WRITE else None
                results = yield Query(conn, self.sql.release(conn.token, conn.mark, kx), end)
                conn.lease_set = False
            except EngineUnavailable:
                if conn.cut:
                    raise                          # no answer: we closed it; the server frees the lock on noticing
                return False                       # the server had ended the session: the lock was gone
            return bool(results[1][0][0] == b"1")
        finally:
            conn.modes.discard(mode)
            if last or conn.broken:
                self.pool.checkin(conn)
            else:
                conn.busy.release()
