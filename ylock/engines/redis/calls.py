"""The Redis engine's hot path: commands sent straight over the client's pooled connections.

redis-py's ``execute_command`` wraps every command in a retry helper, observability
hooks and two trips through the connection pool's lock and bookkeeping. With redis-py 8
on the 2-core machine ylock is benchmarked on, that came to about 70 µs of the 120 µs one
``EVALSHA`` round trip took: more than the Lua scripts of an acquire and a release cost
the server together. The lock path (acquire, release, the waiter's blocking pop) sends
its commands through :class:`DirectCalls` (threads) and :class:`AsyncDirectCalls` (an
event loop) instead, which keep the same semantics:

* connections come from the client's own pool (TLS, ACL, Sentinel discovery, socket
  timeouts, unix sockets all as configured) and are kept on a free list between calls
  (``list.pop``/``append`` are atomic: no lock), so the pool is visited once per
  connection, not twice per command; ``client.close()`` still closes them all;
* a ``ConnectionError`` (a socket the server dropped, a restart, a Sentinel failover
  demoting the master) disconnects the connection and sends once more on a new one,
  like the engine's redis-py ``Retry`` of one attempt; a ``TimeoutError`` is not retried;
* a sign that the server may no longer be the master (a connection error or a timeout, a
  ``READONLY``, ``MOVED``, ``LOADING`` or ``NOREPLICAS`` reply) drops every parked connection: each one
  reconnects before its next use (on Sentinel asking the Sentinels for the master), so a
  process never keeps granting on a stalled-then-resumed old master through connections
  it parked before the failover. On Sentinel a parked connection is also dropped once
  redis-py's pool learned of another master (any reconnection asks the Sentinels);
* each call takes ``end``, the absolute deadline (``time.monotonic()``) that bounds all of
  it, a reconnection and its handshake included (the socket's timeout is set per call from
  it: redis-py's ``read_response`` takes no timeout before redis-py 8), so that an
  acquisition ends within its deadline plus one socket timeout whatever the server or the
  network does; None: each operation within the connection's socket timeout;
* an error reply (``NOSCRIPT``, a script error) leaves the connection clean and usable;
  anything else (an interrupt mid-reply) disconnects it, so no stale reply is ever read;
* the lock path takes at most the pool's ``max_connections`` less a reserve
  (:func:`lock_path_share`), which the client's own calls keep (the watchdog's renewals,
  ``describe()``, statistics): however many threads call at once, a renewal finds a
  connection. A call that finds them all busy waits for one to come back, before its
  ``end`` (each is busy for one round trip, or for a wait, see
  :class:`~ylock.engines.redis.hubs.ThreadNotifyHub`).

The two classes keep one algorithm: what does not wait on I/O (the share, the epoch, what a
failure means for the connection, how a new connection is set up) is :class:`_Calls`'s; each
class only does the I/O its world does (blocking, or awaited). Packing and parsing:
:mod:`ylock.engines.redis.resp`; the socket I/O: :mod:`~ylock.engines.redis.sockets`,
:mod:`~ylock.engines.redis.asockets`. Waiters take at most half the lock path's
connections: beyond that the waiting threads of a process share one blocking ``BLPOP``,
the waiting tasks of an event loop always do (:mod:`ylock.engines.redis.hubs`). Redis
Cluster keeps redis-py's own path (:mod:`ylock.engines.redis.cluster`).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rex

from ylock.engines.redis.asockets import aread, awrite, exchange
from ylock.engines.redis.resp import pack as pack_command
from ylock.engines.redis.resp import packer
from ylock.engines.redis.sockets import raise_first_error, read_all, reader, send, write

__all__ = ["AsyncDirectCalls", "DirectCalls", "PoolBusy", "RESERVE", "lock_path_share"]

#: Connections of a pool that the lock path leaves to the client's own calls, at most.
RESERVE = 8


def lock_path_share(max_connections: int | None) -> int:
    """How many of a pool's ``max_connections`` the lock path may take: all but a reserve
    (:data:`RESERVE`, or a quarter of a small pool, at least one) for the client's own calls."""
    if not max_connections or max_connections >= 2 ** 31 - 1:
        return 2 ** 31 - 1
    return max(1, max_connections - max(1, min(RESERVE, max_connections // 4)))


#: Error replies meaning "not the master (any more)", besides connection errors (LOADING
#: is a BusyLoadingError, a ConnectionError).
_NOT_MASTER = (rex.ReadOnlyError, rex.MovedError)


class _Calls:
    """What the threads' and the event loop's direct calls share: the pool's share, the
    epoch of faults, and the rules of what a failure does to a connection."""

    __slots__ = ("pool", "idle", "share", "made", "epoch", "_sentinel", "_wait")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []
        #: Bumped when a server may have stopped being the master: a parked connection
        #: made before reconnects before its next use.
        self.epoch = 0
        #: Whether ``pool`` is a Sentinel pool of the master (which knows the master's address).
        self._sentinel = bool(getattr(pool, "is_master", False)) and hasattr(pool, "sentinel_manager")
        #: The most connections this takes from the pool (:func:`lock_path_share`).
        self.share = lock_path_share(getattr(pool, "max_connections", None))
        self.made = 0                                 # connections taken from the pool so far
        #: How long a call without an ``end`` waits for a connection (the socket timeout).
        self._wait = float(getattr(pool, "connection_kwargs", {}).get("socket_timeout") or 2.0)

    def _stale(self, conn: Any) -> bool:
        """Whether ``conn`` was parked before a fault, or is on a master that Sentinel has
        replaced (not known yet: no): it must reconnect before its next use."""
        if conn.__dict__.get("ylock_epoch") != self.epoch:
            return True
        master = self.pool.master_address if self._sentinel else None
        return master is not None and (conn.host, conn.port) != master

    def _failed(self, exc: BaseException) -> bool:
        """A call on a connection failed with ``exc``: note a fault if the server may no
        longer be the master, and return whether the connection must be dropped (anything
        but an error reply read whole may have left part of a reply unread)."""
        if isinstance(exc, rex.ResponseError):
            if isinstance(exc, _NOT_MASTER) or str(exc).startswith("NOREPLICAS"):
                self.fault()
                return True
            return False
        if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, OSError)):
            self.fault()
        return True

    def fault(self) -> None:
        """The server may no longer be the master: every parked connection reconnects
        before its next use."""
        self.epoch += 1

    def _made(self, conn: Any) -> Any:
        """Set up a connection just taken from the pool for the lock path."""
        conn.ylock_epoch = self.epoch
        conn.ylock_pack = packer(conn)
        return conn

    @staticmethod
    def _refused(exc: BaseException) -> rex.ConnectionError | None:
        """The error to raise instead of ``exc``, which the pool raised making a connection:
        a server that answers the handshake with an error (a refused ``AUTH``, ``SELECT`` of a
        database it does not have) cannot serve locks, which is a connection error, not a
        script error. None: raise ``exc`` itself."""
        if isinstance(exc, rex.ResponseError):
            return rex.ConnectionError(f"the server refused to set up the connection: {exc}")
        return None

    def _busy(self) -> PoolBusy:
        return PoolBusy(f"all {self.share} connections of the lock path stayed busy for the call's "
                        "whole time (raise max_connections?)")


class PoolBusy(rex.ConnectionError):
    """No connection of the lock path came free within a call's time: the process's own
    congestion (a thousand tasks of one event loop trying at once), not the server's. The
    command was not sent, so an acquisition may try again within its deadline."""


class DirectCalls(_Calls):
    """Send commands over ``pool``'s connections without redis-py's per-command layers."""

    __slots__ = ("starved", "_freed")

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.starved = 0                              # callers waiting for one to come back
        self._freed = threading.Condition(threading.Lock())

    def __call__(self, *args: Any, end: float | None = None) -> Any:
        """Send one command and return its raw reply (no response callbacks: the lock path
        only sends EVALSHA and BLPOP, whose replies redis-py does not convert). The whole
        call, waiting for a free connection and a reconnection included, ends by ``end``
        (monotonic; None: each operation within the connection's socket timeout)."""
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = self.checkout(end)
        if conn.__dict__.get("ylock_epoch") != self.epoch or self._sentinel:     # see _stale
            self._refresh(conn)
        try:
            try:
                send(conn, args, end)
                reply = conn.ylock_read()
            except rex.ConnectionError:
                self.fault()
                conn.disconnect()
                send(conn, args, end)       # connects anew, once, within what is left
                reply = conn.ylock_read()
        except BaseException as exc:
            if self._failed(exc):
                conn.disconnect()           # the next use connects anew; no half-read reply survives
            self.checkin(conn)
            raise
        self.checkin(conn)
        return reply

    def many(self, *commands: tuple[Any, ...], end: float | None = None) -> list[Any]:
        """Send ``commands`` in one round trip (pipelined, not a transaction) and return
        their raw replies; an error reply raises (after the rest are read). Best effort:
        no reconnection (its users can do without a lost one)."""
        return raise_first_error(self.pipeline(commands, end))

    def pipeline(self, commands: Sequence[tuple[Any, ...]], end: float | None = None,
                 packed: bytes | None = None) -> list[Any]:
        """:meth:`many` that returns every reply, an error reply as its exception (the
        watchdog's renewals: each reply is one hold's). ``packed``: the commands packed
        already as :func:`~ylock.engines.redis.resp.pack` packs them, sent as they are on a
        connection that packs so (else ``commands`` are packed for it)."""
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = self.checkout(end)
        self._refresh(conn)
        try:
            if packed is not None and conn.ylock_pack is pack_command:
                send(conn, (), end, [packed])
            else:
                send(conn, commands[0], end)
                if len(commands) > 1:
                    pack = conn.ylock_pack
                    write(conn, [b"".join([part for args in commands[1:] for part in pack(*args)])])
            replies = read_all(conn.ylock_read, len(commands))
        except BaseException:
            conn.disconnect()
            self.checkin(conn)
            raise
        self.checkin(conn)
        return replies

    def _refresh(self, conn: Any) -> None:
        """Reconnect ``conn`` before its use if it is stale (see :meth:`_Calls._stale`)."""
        if self._stale(conn):
            conn.disconnect()
            conn.ylock_epoch = self.epoch

    def fault(self) -> None:
        """The server may no longer be the master: every parked connection reconnects
        before its next use, and the pool's idle ones are dropped."""
        self.epoch += 1
        with contextlib.suppress(Exception):
            self.pool.disconnect(inuse_connections=False)

    def checkout(self, end: float | None) -> Any:
        """Return a connection of the lock path's share for the caller's own use (give it
        back with :meth:`checkin`): an idle one, a new one while the share is not all taken,
        else the first to come back before ``end`` (monotonic; None: one socket timeout)."""
        with self._freed:
            making = self.made < self.share
            if making:
                self.made += 1
            else:
                self.starved += 1
                try:
                    deadline = time.monotonic() + self._wait if end is None else end
                    while True:
                        try:
                            return self.idle.pop()
                        except IndexError:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                raise self._busy() from None
                            self._freed.wait(left)
                finally:
                    self.starved -= 1
        try:
            conn = self._made(self.pool.get_connection())     # redis-py 8 connects here
            conn.ylock_read = reader(conn)
            return conn
        except BaseException as exc:
            with self._freed:
                self.made -= 1
            refused = self._refused(exc)
            if refused is None:
                raise
            raise refused from exc

    def checkin(self, conn: Any) -> None:
        """Give back a connection (to the free list; a caller waiting for one gets it)."""
        self.idle.append(conn)
        if self.starved:              # read without the lock: see checkout, which counts itself in first
            with self._freed:
                self._freed.notify()


class AsyncDirectCalls(_Calls):
    """:class:`DirectCalls` for asyncio (``redis.asyncio``'s connections of one event loop):
    the same free list and share of the pool (a call that finds it all busy waits for a
    connection to come back), one reconnection, an error reply keeping the connection, a
    call bounded by its ``end``. A call cancelled or timed out mid-reply disconnects its
    connection, so no late reply is ever read by the next call."""

    __slots__ = ("starved",)

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.starved: collections.deque[Any] = collections.deque()    # futures of callers waiting

    async def __call__(self, *args: Any, end: float | None = None) -> Any:
        """:meth:`DirectCalls.__call__` in the event loop."""
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = await self.checkout(end)
        if conn.__dict__.get("ylock_epoch") != self.epoch or self._sentinel:
            await self._refresh(conn)
        try:
            try:
                reply = await exchange(conn, conn.ylock_pack(*args), end)
            except rex.ConnectionError:
                self.fault()
                await conn.disconnect(nowait=True)
                reply = await exchange(conn, conn.ylock_pack(*args), end)     # connects anew, once
        except BaseException as exc:
            if self._failed(exc):
                await conn.disconnect(nowait=True)
            self.checkin(conn)
            raise
        self.checkin(conn)
        return reply

    async def many(self, *commands: tuple[Any, ...], end: float | None = None) -> list[Any]:
        """:meth:`DirectCalls.many` in the event loop."""
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = await self.checkout(end)
        await self._refresh(conn)
        try:
            await awrite(conn, conn.pack_commands(commands), end)
            replies = []
            for _ in commands:
                try:
                    replies.append(await aread(conn, end))
                except rex.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            await conn.disconnect(nowait=True)
            self.checkin(conn)
            raise
        self.checkin(conn)
        return raise_first_error(replies)

    async def _refresh(self, conn: Any) -> None:
        """:meth:`DirectCalls._refresh` in the event loop."""
        if self._stale(conn):
            await conn.disconnect(nowait=True)
            conn.ylock_epoch = self.epoch

    async def checkout(self, end: float | None) -> Any:
        """:meth:`DirectCalls.checkout` in the event loop."""
        if self.made < self.share:
            self.made += 1
            try:
                return self._made(await self.pool.get_connection())
            except BaseException as exc:
                self.made -= 1
                refused = self._refused(exc)
                if refused is None:
                    raise
                raise refused from exc
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._wait if end is None else end
        while not self.idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._busy()
            future = loop.create_future()
            self.starved.append(future)
            timer = loop.call_later(left, _settle, future)
            try:
                await future
            finally:
                timer.cancel()
                with contextlib.suppress(ValueError):
                    self.starved.remove(future)
        return self.idle.pop()

    def checkin(self, conn: Any) -> None:
        """Give back a connection (a task waiting for one gets it)."""
        self.idle.append(conn)
        while self.starved:
            future = self.starved.popleft()
            if not future.done():
                future.set_result(None)
                break


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
