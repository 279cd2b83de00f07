"""The Redis engine's hot path: commands sent straight over the client's pooled connections.

redis-py's ``execute_command`` wraps every command in a retry helper, observability
hooks and two trips through the connection pool's lock and bookkeeping. With redis-py 8
on the 2-core machine ylock is benchmarked on, that came to about 70 µs of the 120 µs one
``EVALSHA`` round trip took: more than the Lua scripts of an acquire and a release cost
the server together. The lock path (acquire, release, the waiter's blocking pop) sends
its commands through :class:`DirectCalls` instead, which keeps the same semantics:

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
* each call takes a ``timeout`` that bounds all of it, a reconnection and its handshake
  included (the socket's timeout is set per call: redis-py's ``read_response`` takes no
  timeout before redis-py 8), so that an acquisition ends within its deadline plus one
  socket timeout whatever the server or the network does;
* an error reply (``NOSCRIPT``, a script error) leaves the connection clean and usable;
  anything else (an interrupt mid-reply) disconnects it, so no stale reply is ever read;
* the lock path takes at most the pool's ``max_connections`` less a reserve
  (:func:`lock_path_share`), which the client's own calls keep (the watchdog's renewals,
  ``describe()``, statistics): however many threads call at once, a renewal finds a
  connection. A call that finds them all busy waits for one to come back, within its
  ``timeout``, rather than fail with "Too many connections" (each is busy for one round
  trip, or for a wait, see :class:`ThreadNotifyHub`).

Waiters take at most half the lock path's connections: beyond that the waiting threads of
a process share one blocking ``BLPOP`` (:class:`ThreadNotifyHub`); the waiting tasks of an
event loop always share one (:class:`NotifyHub`).

Redis Cluster keeps redis-py's own path (it routes by slot and follows ``MOVED``).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import socket
import threading
import time
from typing import Any

import redis.connection
import redis.exceptions as rex
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from ylock.engines.base import cancelling

logger = logging.getLogger("ylock.engines.redis")

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


def _master_pool(pool: Any) -> bool:
    """Whether ``pool`` is a Sentinel pool of the master (which knows the master's address)."""
    return bool(getattr(pool, "is_master", False)) and hasattr(pool, "sentinel_manager")


def _moved(conn: Any, master: tuple[str, int] | None) -> bool:
    """Whether ``conn`` is connected elsewhere than the master its Sentinel pool knows (not
    known yet: no)."""
    return master is not None and (conn.host, conn.port) != master


def _busy(share: int) -> rex.ConnectionError:
    return rex.ConnectionError(f"all {share} connections of the lock path stayed busy for the call's whole time "
                               "(raise max_connections?)")


class DirectCalls:
    """Send commands over ``pool``'s connections without redis-py's per-command layers."""

    __slots__ = ("pool", "idle", "share", "made", "starved", "epoch", "_sentinel", "_freed", "_wait")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []
        #: Bumped when a server may have stopped being the master: a parked connection
        #: made before reconnects before its next use.
        self.epoch = 0
        self._sentinel = _master_pool(pool)
        #: The most connections this takes from the pool (:func:`lock_path_share`).
        self.share = lock_path_share(getattr(pool, "max_connections", None))
        self.made = 0                                 # connections taken from the pool so far
        self.starved = 0                              # callers waiting for one to come back
        self._freed = threading.Condition(threading.Lock())
        #: How long a call without a timeout waits for a connection (the socket timeout).
        self._wait = float(getattr(pool, "connection_kwargs", {}).get("socket_timeout") or 2.0)

    def __call__(self, *args: Any, timeout: float | None = None) -> Any:
        """Send one command and return its raw reply (no response callbacks: the lock path
        only sends EVALSHA and BLPOP, whose replies redis-py does not convert). The whole
        call, waiting for a free connection and a reconnection included, ends within
        ``timeout`` seconds (default: the connection's socket timeout)."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = self.checkout(end)
        if conn.__dict__.get("ylock_epoch") != self.epoch or self._sentinel:     # see _refresh
            self._refresh(conn)
        try:
            try:
                _send(conn, args, end)
                reply = conn.ylock_read()
            except rex.ConnectionError:
                self.fault()
                conn.disconnect()
                _send(conn, args, end)      # connects anew, once, within what is left
                reply = conn.ylock_read()
        except rex.ResponseError as exc:
            if isinstance(exc, _NOT_MASTER) or str(exc).startswith("NOREPLICAS"):
                self.fault()
                conn.disconnect()
            self.checkin(conn)         # an error reply was read whole: the connection is fine
            raise
        except BaseException as exc:
            if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, OSError)):
                self.fault()
            conn.disconnect()          # the next use connects anew; no half-read reply survives
            self.checkin(conn)
            raise
        self.checkin(conn)
        return reply

    def many(self, *commands: tuple[Any, ...], timeout: float | None = None) -> list[Any]:
        """Send ``commands`` in one round trip (pipelined, not a transaction) and return
        their raw replies; an error reply raises (after the rest are read). Best effort:
        no reconnection (its users can do without a lost one)."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = self.checkout(end)
        self._refresh(conn)
        try:
            _send(conn, commands[0], end)
            for args in commands[1:]:
                _write(conn, conn.ylock_pack(*args))
            replies = _read_all(conn.ylock_read, len(commands))
        except BaseException:
            conn.disconnect()
            self.checkin(conn)
            raise
        self.checkin(conn)
        return _raise_first_error(replies)

    def _refresh(self, conn: Any) -> None:
        """Reconnect ``conn`` if it was parked before a fault, or is on a master that
        Sentinel has replaced."""
        if conn.__dict__.get("ylock_epoch") != self.epoch or (
                self._sentinel and _moved(conn, self.pool.master_address)):
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
                                raise _busy(self.share) from None
                            self._freed.wait(left)
                finally:
                    self.starved -= 1
        try:
            conn = self.pool.get_connection()     # redis-py 8 connects here
            conn.ylock_epoch = self.epoch
            conn.ylock_pack = _packer(conn)
            conn.ylock_read = _reader(conn)
            return conn
        except BaseException as exc:
            with self._freed:
                self.made -= 1
            if isinstance(exc, rex.ResponseError):
                raise rex.ConnectionError(f"the server refused to set up the connection: {exc}") from exc
            raise

    def checkin(self, conn: Any) -> None:
        """Give back a connection (to the free list; a caller waiting for one gets it)."""
        self.idle.append(conn)
        if self.starved:              # read without the lock: see checkout, which counts itself in first
            with self._freed:
                self._freed.notify()


def _read_all(read: Any, count: int) -> list[Any]:
    """Read ``count`` replies, an error reply as its exception (so that none is left unread)."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(read())
        except rex.ResponseError as exc:
            replies.append(exc)
    return replies


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, rex.ResponseError):
            raise reply
    return replies


def _packer(conn: Any) -> Any:
    """How to pack commands for ``conn``: :func:`_pack` where it packs as the connection
    would (redis-py's Python serializer, UTF-8 strict), else the connection's own packer
    (hiredis's, or another encoding)."""
    encoder = conn.encoder
    packer = getattr(conn, "_command_packer", None)      # None: redis.asyncio packs in Python
    if (packer is None or packer.__class__ in _SAME_BYTES) and encoder.encoding_errors == "strict" \
            and encoder.encoding.replace("-", "").replace("_", "").lower() == "utf8":
        return _pack
    return conn.pack_command


#: The packers whose bytes :func:`_pack` makes too (hiredis's encodes every str as UTF-8, as
#: redis-py's own does for a UTF-8 strict encoder; ints and bytes alike): with hiredis
#: installed, the lock path keeps its remembered script calls (a lookup instead of a pack
#: through redis-py's serializer and hiredis each time).
_SAME_BYTES = (PythonRespSerializer, getattr(redis.connection, "HiredisRespSerializer", PythonRespSerializer))


_encode = Encoder("utf-8", "strict", False).encode


def _pack(*args: Any) -> list[bytes]:
    """Pack one command as redis-py's Python serializer does, in one buffer: about a quarter
    of its CPU for the lock path's commands (a dozen short str and int arguments), which
    redis-py's asyncio connections pack in Python even with hiredis. The command's name
    is one word (the lock path's commands are: no splitting of ``"CONFIG GET"``).

    Script calls are remembered (:data:`_PACKED`): a lock's acquire and release send the
    same arguments each time (the owner, the lease, the context), and looking them up
    costs a twentieth of packing them (0.2 µs against 4.5 for an acquisition's, timed on
    the benchmark machine)."""
    script = args[0] == "EVALSHA"
    if script:
        try:
            return _PACKED[args]
        except (KeyError, TypeError):               # TypeError: an unhashable buffer
            pass
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    plain = True
    for arg in args:
        cls = arg.__class__
        if cls is str:
            arg = arg.encode()
        elif cls is int:
            arg = b"%d" % arg
        elif cls is not bytes:
            plain = False
            arg = _encode(arg)          # floats, buffers; what redis-py refuses raises its DataError
        append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    packed = [b"".join(out)]
    if script and plain and len(packed[0]) <= PACKED_SIZE:
        if len(_PACKED) >= PACKED:
            _PACKED.clear()
        _PACKED[args] = packed
    return packed


#: How many packed script calls :func:`_pack` remembers (then it starts again: a process
#: that uses more locks at once than this packs most calls anew, as before).
PACKED = 1024
#: The longest packed call it remembers, in bytes (a lock's calls are about 150; a long
#: ``ylock.context``, mostly different every time, is not worth keeping): at most 512 KB in all.
PACKED_SIZE = 512
#: The packed script calls, by their arguments: only calls whose arguments are all str,
#: int and bytes are kept. (A float equal to a kept int, which the lock path never sends,
#: would find the int's packing: the same number to Redis.)
_PACKED: dict[tuple[Any, ...], list[bytes]] = {}


def _send(conn: Any, args: tuple[Any, ...], end: float | None) -> None:
    """Connect ``conn`` if needed and send ``args``, its socket reading for what is left
    until ``end`` (monotonic; None: the connection's own socket timeout; a blocking pop
    passes more than the socket timeout)."""
    left = None if end is None else end - time.monotonic()
    if left is not None and left <= 0:
        raise rex.TimeoutError("no time left for the call")
    sock = conn._sock
    if sock is None:
        _connect(conn, left)
        sock = conn._sock
    if left is None:
        left = conn.socket_timeout
    # Set only when it changes by more than a little (a call's timeout is mostly the socket
    # timeout less the microseconds since the call began): setting it is a system call.
    # The socket may so wait up to TIMEOUT_SLACK past ``end``.
    was = sock.gettimeout()
    if was != left and (left is None or was is None or not 0 <= was - left <= TIMEOUT_SLACK):
        sock.settimeout(left)
    _write(conn, conn.ylock_pack(*args))


#: How much later than its ``end`` a call may end: see :func:`_send`.
TIMEOUT_SLACK = 0.002


def _write(conn: Any, packed: list[bytes]) -> None:
    """Send a packed command on ``conn``'s socket, with redis-py's errors (as its
    ``send_packed_command``, less its health check and branches: the lock path's socket is
    connected and its timeout set by :func:`_send`)."""
    sock = conn._sock
    try:
        if sock.__class__ is socket.socket and len(packed) == 1:
            # Straight into the kernel's buffer: a socket with a timeout is non-blocking
            # underneath, and its sendall asks poll() first, a system call for a write that
            # nearly always fits at once. What did not fit goes through sendall, bounded by
            # the timeout. (A plain socket only: a TLS one must write through its SSL layer.)
            data = packed[0]
            try:
                sent = os.write(sock.fileno(), data)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                sock.sendall(memoryview(data)[sent:])
        else:
            for item in packed:
                sock.sendall(item)
    except TimeoutError:           # socket.timeout
        conn.disconnect()
        raise rex.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        conn.disconnect()
        errno, message = (exc.args[0], exc.args[1]) if len(exc.args) > 1 else \
            ("UNKNOWN", exc.args[0] if exc.args else exc)
        raise rex.ConnectionError(f"Error {errno} while writing to socket. {message}.") from None
    except BaseException:
        conn.disconnect()          # part of a command may have gone: the connection is unusable
        raise


def _reader(conn: Any) -> Any:
    """How the lock path reads ``conn``'s replies: :class:`_Replies` where it can (replies
    as bytes), else redis-py's ``read_response``."""
    if conn.encoder.decode_responses:
        return conn.read_response
    return _Replies(conn)


class _Incomplete(Exception):
    """The buffer ends before the reply does."""


class _Push(list):  # type: ignore[type-arg]
    """A RESP3 push message (not a reply): handed to redis-py's parser, which acts on it."""


class _Replies:
    """Read a connection's replies straight from its socket with :func:`_parse`.
    redis-py's ``read_response`` goes through four layers of Python (the connection's, the
    parser's, a buffered socket over a ``BytesIO``) for every reply: for the lock path's
    small replies, a round trip cost 14 µs more client CPU through it than through this
    (the two timed in turns on one connection of the benchmark machine, 10 rounds). The
    same results and errors as redis-py's RESP2 and RESP3 parsers (their ``parse_error``
    makes the error replies' exceptions; a push message goes to their
    ``handle_push_response``, and the reply after it is read). Not hiredis's reader: the lock
    path's replies are mostly one integer, which :func:`_parse` reads in under a
    microsecond, and a second reader would be a path that the suite (which runs without
    hiredis) does not test; with hiredis installed, redis-py's own calls still use it. A
    new socket (a reconnection) starts with an empty buffer. A lone integer reply that one read
    brings whole (an acquisition's token, a release's answer) skips the parser."""

    __slots__ = ("conn", "sock", "buf")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sock: Any = None
        self.buf = b""

    def __call__(self) -> Any:
        conn = self.conn
        sock = conn._sock
        if sock is not self.sock:
            if sock is None:
                raise rex.ConnectionError("the connection was closed")
            self.sock, self.buf = sock, b""
        try:
            if not self.buf:
                # The lock path's usual reply, one integer alone in one read, without the parser.
                data = sock.recv(65536)
                if data and data[0] == 58 and data.find(b"\r\n") == len(data) - 2:     # ":"
                    return int(data[1:-2])
                if not data:
                    raise rex.ConnectionError("Connection closed by server.")
                self.buf = data
            reply = self._read(sock)
            while reply.__class__ is _Push:
                conn._parser.handle_push_response(list(reply))
                reply = self._read(sock)
        except TimeoutError:       # socket.timeout
            conn.disconnect()
            raise rex.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
        except OSError as exc:
            conn.disconnect()
            raise rex.ConnectionError(f"Error while reading from {conn._host_error()} : {exc.args}") from None
        except BaseException:
            conn.disconnect()      # mid-reply: what is left of it must never be read as a reply
            raise
        if isinstance(reply, rex.ResponseError):     # (a ConnectionError one, LOADING, raised above)
            try:
                raise reply
            finally:
                del reply
        return reply

    def _read(self, sock: Any) -> Any:
        error = self.conn._parser.parse_error
        while (got := _split(self.buf, error)) is None:
            data = sock.recv(65536)
            if not data:
                raise rex.ConnectionError("Connection closed by server.")
            self.buf += data
        reply, self.buf = got
        return reply


def _split(buf: bytes, error: Any) -> tuple[Any, bytes] | None:
    """The first whole reply in ``buf`` (see :func:`_parse`) and the bytes after it, or None
    if ``buf`` ends before a reply does."""
    if not buf:
        return None
    try:
        reply, end = _parse(buf, 0, error)
    except _Incomplete:
        return None
    return reply, buf[end:]


def _parse(buf: bytes, at: int, error: Any) -> tuple[Any, int]:
    """The RESP2/RESP3 reply at ``buf[at:]`` and where it ends, as redis-py's parsers make
    it (bulk and simple strings as bytes, a set as a list, an error reply as
    ``error(message)``'s exception, returned; a push message as a :class:`_Push`);
    :class:`_Incomplete` if the buffer ends before it does."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        raise _Incomplete
    kind = buf[at]
    if kind == 58 or kind == 40:                        # ":" integer, "(" big number
        return int(buf[at + 1:line]), line + 2
    if kind == 36 or kind == 61 or kind == 33:          # "$" bulk, "=" verbatim, "!" blob error
        size = int(buf[at + 1:line])
        if size < 0:
            return None, line + 2
        end = line + 2 + size
        if len(buf) < end + 2:
            raise _Incomplete
        if kind == 36:
            return buf[line + 2:end], end + 2
        if kind == 61:
            return buf[line + 6:end], end + 2          # less its "txt:" format
        return _error(error, buf[line + 2:end]), end + 2
    if kind == 42 or kind == 126 or kind == 62:         # "*" array, "~" set, ">" push
        count = int(buf[at + 1:line])
        if count < 0:
            return None, line + 2
        items: list[Any] = _Push() if kind == 62 else []
        at = line + 2
        for _ in range(count):
            item, at = _parse(buf, at, error)
            items.append(item)
        return items, at
    if kind == 37:                                      # "%" map
        count = int(buf[at + 1:line])
        out: dict[Any, Any] = {}
        at = line + 2
        for _ in range(count):
            key, at = _parse(buf, at, error)
            out[key], at = _parse(buf, at, error)
        return out, at
    if kind == 43:                                      # "+" simple string
        return buf[at + 1:line], line + 2
    if kind == 45:                                      # "-" error
        return _error(error, buf[at + 1:line]), line + 2
    if kind == 95:                                      # "_" null
        return None, line + 2
    if kind == 35:                                      # "#" boolean
        return buf[at + 1:line] == b"t", line + 2
    if kind == 44:                                      # "," double
        return float(buf[at + 1:line]), line + 2
    raise rex.InvalidResponse(f"Protocol Error: {buf[at:line]!r}")


def _error(error: Any, message: bytes) -> Any:
    """An error reply's exception, as redis-py's parsers make it (a connection error is
    raised at once, wherever it is)."""
    exc = error(message.decode("utf-8", "replace"))
    if isinstance(exc, rex.ConnectionError):
        raise exc
    return exc


def _connect(conn: Any, left: float | None) -> None:
    """Connect (and run the connection's handshake) within ``left`` seconds. A server that
    answers the handshake with an error (``SELECT`` of a database it does not have, a
    refused ``AUTH``) cannot serve locks: that is a connection error, not a script error."""
    saved = conn.socket_connect_timeout, conn.socket_timeout
    if left is not None:
        conn.socket_connect_timeout = min(left, saved[0] or left)
        conn.socket_timeout = min(left, saved[1] or left)
    try:
        conn.connect()
    except rex.ResponseError as exc:
        conn.disconnect()
        raise rex.ConnectionError(f"the server refused to set up the connection: {exc}") from exc
    finally:
        conn.socket_connect_timeout, conn.socket_timeout = saved


class AsyncDirectCalls:
    """:class:`DirectCalls` for asyncio (``redis.asyncio``'s connections of one event loop):
    the same free list and share of the pool (a call that finds it all busy waits for a
    connection to come back), one reconnection, an error reply keeping the connection, a
    call bounded by its ``timeout``. A call cancelled or timed out mid-reply disconnects its
    connection, so no late reply is ever read by the next call."""

    __slots__ = ("pool", "idle", "share", "made", "starved", "epoch", "_sentinel", "_wait")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []
        self.epoch = 0
        self._sentinel = _master_pool(pool)
        self.share = lock_path_share(getattr(pool, "max_connections", None))
        self.made = 0
        self.starved: collections.deque[Any] = collections.deque()    # futures of callers waiting
        self._wait = float(getattr(pool, "connection_kwargs", {}).get("socket_timeout") or 2.0)

    async def __call__(self, *args: Any, timeout: float | None = None) -> Any:
        end = None if timeout is None else time.monotonic() + timeout
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = await self.checkout(end)
        if conn.__dict__.get("ylock_epoch") != self.epoch or self._sentinel:
            await self._refresh(conn)
        try:
            try:
                reply = await _exchange(conn, conn.ylock_pack(*args), end)
            except rex.ConnectionError:
                self.fault()
                await conn.disconnect(nowait=True)
                reply = await _exchange(conn, conn.ylock_pack(*args), end)     # connects anew, once
        except rex.ResponseError as exc:
            if isinstance(exc, _NOT_MASTER) or str(exc).startswith("NOREPLICAS"):
                self.fault()
                await conn.disconnect(nowait=True)
            self.checkin(conn)
            raise
        except BaseException as exc:
            if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, OSError)):
                self.fault()
            await conn.disconnect(nowait=True)
            self.checkin(conn)
            raise
        self.checkin(conn)
        return reply

    async def many(self, *commands: tuple[Any, ...], timeout: float | None = None) -> list[Any]:
        """:meth:`DirectCalls.many` in the event loop."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            conn = self.idle.pop()
        except IndexError:
            conn = await self.checkout(end)
        await self._refresh(conn)
        try:
            await _awrite(conn, conn.pack_commands(commands), end)
            replies = []
            for _ in commands:
                try:
                    replies.append(await _aread(conn, end))
                except rex.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            await conn.disconnect(nowait=True)
            self.checkin(conn)
            raise
        self.checkin(conn)
        return _raise_first_error(replies)

    async def _refresh(self, conn: Any) -> None:
        """:meth:`DirectCalls._refresh` in the event loop."""
        if conn.__dict__.get("ylock_epoch") != self.epoch or (
                self._sentinel and _moved(conn, self.pool.master_address)):
            await conn.disconnect(nowait=True)
            conn.ylock_epoch = self.epoch

    def fault(self) -> None:
        """:meth:`DirectCalls.fault` (the pool's idle connections reconnect on their next use)."""
        self.epoch += 1

    async def checkout(self, end: float | None) -> Any:
        """:meth:`DirectCalls.checkout` in the event loop."""
        import asyncio

        if self.made < self.share:
            self.made += 1
            try:
                conn = await self.pool.get_connection()
                conn.ylock_epoch = self.epoch
                conn.ylock_pack = _packer(conn)
                return conn
            except BaseException as exc:
                self.made -= 1
                if isinstance(exc, rex.ResponseError):
                    raise rex.ConnectionError(f"the server refused to set up the connection: {exc}") from exc
                raise
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._wait if end is None else end
        while not self.idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _busy(self.share)
            future = loop.create_future()
            self.starved.append(future)
            timer = loop.call_later(left, _settle, future, None)
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


def _left(end: float | None) -> float | None:
    if end is None:
        return None
    left = end - time.monotonic()
    if left <= 0:
        raise rex.TimeoutError("no time left for the call")
    return left


async def _exchange(conn: Any, packed: list[bytes], end: float | None) -> Any:
    """Send one packed command on ``conn`` (connecting it if needed) and read its reply, all
    before ``end`` (monotonic; None: each socket operation within the socket timeout)."""
    await _awrite(conn, packed, end)
    return await _aread(conn, end)


async def _awrite(conn: Any, packed: list[bytes], end: float | None) -> None:
    """Connect ``conn`` if needed and write ``packed`` to it, within what is left until ``end``.

    Not through redis-py's ``send_packed_command``: with a socket timeout it wraps every
    write in ``asyncio.wait_for``, a Task and two more loop turns per command (before
    Python 3.12) for a write that nearly always goes straight into the kernel's buffer: a
    fifth of the client CPU of an asyncio lock/unlock pair. Here only a write that the
    transport had to buffer (a full socket buffer: a stalled server or network) is awaited,
    bounded as the call is."""
    left = _left(end)
    if not conn.is_connected:
        await _aconnect(conn, left)
    writer = conn._writer
    if writer.transport.is_closing():       # the loop saw the connection end: connect anew
        await conn.disconnect(nowait=True)
        raise rex.ConnectionError("the connection was closed")
    try:
        writer.writelines(packed)
        if writer.transport.get_write_buffer_size():
            bound = conn.socket_timeout if end is None else end - time.monotonic()
            if bound is not None and bound <= 0:
                raise asyncio.TimeoutError
            await asyncio.wait_for(writer.drain(), bound)
    except asyncio.TimeoutError:
        await conn.disconnect(nowait=True)
        raise rex.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise rex.ConnectionError(f"Error while writing to socket: {exc}") from exc


async def _aread(conn: Any, end: float | None) -> Any:
    """Read one reply from ``conn`` within what is left until ``end`` (None: its socket
    timeout); on a timeout raise ``TimeoutError`` and disconnect (the reply may still come:
    the next call must not read it as its own).

    With :func:`_parse` over the connection's stream (see :class:`_Replies`): redis.asyncio's
    ``read_response`` adds a timeout context and three layers of coroutines per reply. Where
    replies are decoded to ``str``, through ``read_response``, bounded by the connection's
    ``socket_timeout`` (its ``timeout`` argument answers None when time runs out and keeps
    the connection with the reply still to come)."""
    if conn.encoder.decode_responses:
        saved = conn.socket_timeout
        if end is not None:
            conn.socket_timeout = _left(end)
        try:
            return await conn.read_response()   # a timeout raises TimeoutError and disconnects
        finally:
            conn.socket_timeout = saved
    while True:
        reply = await _aread_one(conn, end)
        if reply.__class__ is not _Push:
            break
        handled = conn._parser.handle_push_response(list(reply))
        if inspect.isawaitable(handled):
            await handled
    if isinstance(reply, rex.ResponseError):
        try:
            raise reply
        finally:
            del reply
    return reply


async def _aread_one(conn: Any, end: float | None) -> Any:
    """One reply (or push message) from ``conn``'s stream, by :func:`_parse`, within ``end``."""
    stream = conn._reader
    if stream is None:
        raise rex.ConnectionError("the connection was closed")
    state = conn.__dict__.get("ylock_in")
    if state is None or state[0] is not stream:      # a new stream (a reconnection): no old bytes
        state = conn.ylock_in = [stream, b""]
    error = conn._parser.parse_error
    while (got := _split(state[1], error)) is None:
        left = conn.socket_timeout if end is None else end - time.monotonic()
        try:
            if left is None:
                data = await stream.read(65536)
            else:
                if left <= 0:
                    raise TimeoutError
                data = await _ReadWatch.of(conn).read(stream, left)
        except (TimeoutError, asyncio.TimeoutError):
            await conn.disconnect(nowait=True)
            raise rex.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
        except OSError as exc:
            await conn.disconnect(nowait=True)
            raise rex.ConnectionError(f"Error while reading from {conn._host_error()} : {exc.args}") from None
        if not data:
            await conn.disconnect(nowait=True)
            raise rex.ConnectionError("Connection closed by server.")
        if not state[1] and data[0] == 58 and data.find(b"\r\n") == len(data) - 2:
            return int(data[1:-2])      # a lone integer reply, read whole: see _Replies
        state[1] += data
    reply, state[1] = got
    return reply


class _ReadWatch:
    """The deadline of the read in flight on one connection, kept by one timer that is
    re-armed only when it fires. ``asyncio.timeout`` around each read schedules and cancels
    a timer per read (and every cancelled one stays in the loop's heap until its time): a
    tenth of the client CPU of an asyncio lock/unlock pair (1.11-1.15x the CPU of reads
    with no timeout, the two timed in turns in one process). Here a read only
    stores its deadline; the timer, armed at most once per socket timeout, finds the read
    still in flight past its deadline and cancels its task, which raises ``TimeoutError``
    (a cancellation from anywhere else stays a cancellation, as with ``asyncio.timeout``)."""

    __slots__ = ("loop", "task", "deadline", "handle", "fired")

    #: A timer that fires this close to the deadline counts it as reached (asyncio runs a
    #: timer up to its clock's resolution early).
    SLACK = 0.001

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.task: Any = None
        self.deadline = 0.0
        self.handle: asyncio.TimerHandle | None = None
        self.fired = False

    @staticmethod
    def of(conn: Any) -> _ReadWatch:
        """``conn``'s watch, made for the running loop."""
        watch: _ReadWatch | None = conn.__dict__.get("ylock_watch")
        loop = asyncio.get_running_loop()
        if watch is None or watch.loop is not loop:
            watch = conn.ylock_watch = _ReadWatch(loop)
        return watch

    async def read(self, stream: asyncio.StreamReader, left: float) -> bytes:
        """``stream.read(65536)``, raising ``TimeoutError`` if nothing comes within ``left`` s."""
        task: Any = asyncio.current_task()
        cancels = cancelling(task)
        self.task, self.fired = task, False
        self.deadline = deadline = self.loop.time() + left
        handle = self.handle
        if handle is None or handle.when() > deadline:
            if handle is not None:
                handle.cancel()
            self.handle = self.loop.call_at(deadline, self._fire)
        try:
            return await stream.read(65536)
        except asyncio.CancelledError:
            if self.fired and (not hasattr(task, "uncancel") or task.uncancel() <= cancels):    # Python >= 3.11
                raise TimeoutError from None
            raise
        finally:
            self.task = None

    def _fire(self) -> None:
        self.handle = None
        if self.task is None:          # no read in flight: the next one arms a timer again
            return
        if self.deadline - self.loop.time() <= self.SLACK:
            self.fired = True
            self.task.cancel()
        else:                          # a later read's deadline: wait for it
            self.handle = self.loop.call_at(self.deadline, self._fire)


async def _aconnect(conn: Any, left: float | None) -> None:
    """:func:`_connect` for a ``redis.asyncio`` connection: connect and run the handshake
    within ``left`` seconds; a handshake refused with an error reply is a connection error."""
    saved = conn.socket_connect_timeout, conn.socket_timeout
    if left is not None:
        conn.socket_connect_timeout = min(left, saved[0] or left)
        conn.socket_timeout = min(left, saved[1] or left)
    try:
        connect = getattr(conn, "connect_check_health", None)     # redis-py >= 6 (no retry, no PING)
        await (connect(check_health=False) if connect is not None else conn.connect())
    except rex.ResponseError as exc:
        await conn.disconnect(nowait=True)
        raise rex.ConnectionError(f"the server refused to set up the connection: {exc}") from exc
    finally:
        conn.socket_connect_timeout, conn.socket_timeout = saved


class Refusals:
    """The commands the server refused one engine (an ACL user, a proxy), each logged once:
    the waiters then do without them (see the notify hubs), and nobody retries them."""

    def __init__(self) -> None:
        self.commands: set[str] = set()
        self._mutex = threading.Lock()

    def note(self, command: str, exc: BaseException, consequence: str, fix: str) -> None:
        """Record that the server refused ``command``; log it the first time."""
        with self._mutex:
            if command in self.commands:
                return
            self.commands.add(command)
        logger.warning("ylock: Redis refused %s (%s): %s. To restore it, allow it in the ACL user's rules: %s",
                       command, exc, consequence, fix)


def refused(exc: BaseException) -> bool:
    """Whether an error reply means the server will never run the command for this user
    (an ACL, a proxy that does not know it or will not take keys of several slots), rather
    than not now (a READONLY replica after a failover, LOADING, TRYAGAIN...)."""
    if isinstance(exc, (rex.NoPermissionError, rex.ClusterCrossSlotError)):   # redis-py strips their prefix
        return True
    text = str(exc).lower()
    return isinstance(exc, rex.ResponseError) and any(
        sign in text for sign in ("noperm", "no permissions", "unknown command", "unknown subcommand",
                                  "unsupported command"))


BLPOP_REFUSED = ("waiters no longer block for their grants but poll (a handoff can take up to one poll interval)",
                  "ACL SETUSER <user> +blpop (and keys ~<prefix>:*)")
_WAKE_REFUSED = ("a waiter that joins a shared wait is watched within 50 ms instead of at once",
                 "ACL SETUSER <user> +lpush +pexpire (and keys ~<prefix>:*)")

#: Milliseconds a wake-up pushed to a hub's list lives if no BLPOP of the hub takes it (the
#: hub stopped meanwhile): such a list never outlives its process for long.
WAKE_TTL_MS = 10_000


class _Slot:
    """One waiting thread's place in a :class:`ThreadNotifyHub`: what was popped for it."""

    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class ThreadNotifyHub:
    """Where the waiting threads (or greenlets) of one process wait for their grants, so
    that waiters never take more than half the lock path's connections (a connection per
    waiting thread, as before, let the 101st waiter of a pool of 100 fail, and the holder's
    release after it). The first threads to wait each block on a connection of their own
    (:meth:`pop`): a grant wakes its thread directly, the quickest handoff (8 threads taking
    turns on one lock: 2,700-5,000 handoffs/s, against 1,700-2,500 through the hub). The
    others wait in the hub: one connection, in a thread of its own while anybody waits,
    blocked in one ``BLPOP`` over all their notify lists and the hub's own wake-up list.

    A thread waits in the hub (:meth:`wait`) between its tries; its key stays in the
    ``BLPOP`` from its first wait until it stops waiting (:meth:`leave`), so that its tries do
    not change the keys each time. A thread that starts waiting while the hub is blocked
    pushes to the hub's wake-up list (``LPUSH``, with a short ``PEXPIRE``, in one round trip):
    the ``BLPOP`` returns and is sent again with the new key. No ``CLIENT`` command is needed
    (it used to be ``CLIENT ID`` and ``CLIENT UNBLOCK``, which managed services' and proxies'
    ACLs often deny: every wait then failed at once and was retried in a loop). A value popped
    while its thread was trying again waits for its next :meth:`wait`; a grant is only a
    wake-up: it lives in the lock's own keys, which the next try reads. If the hub's
    connection fails, every waiter is woken to try again (and finds out whether the server is
    there). If the server refuses ``BLPOP`` itself (an ACL), that is logged once
    (:class:`Refusals`) and the waiters poll: a refusal is never retried in a loop."""

    #: Seconds a BLPOP blocks before it is sent again (a safety net, not a poll).
    BLOCK = 5.0

    def __init__(self, calls: DirectCalls, wake_key: str, refusals: Refusals | None = None) -> None:
        self.calls = calls
        self.wake_key = wake_key
        self.refusals = refusals or Refusals()
        #: Places for threads that wait on a connection of their own: half the lock path's.
        self._alone = threading.BoundedSemaphore(max(1, min(calls.share, 2 ** 16) // 2))
        self.waiting: dict[str, _Slot] = {}          # notify key -> its thread's slot
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._blocking: frozenset[str] = frozenset()  # the keys of the BLPOP in flight
        self._waking = False                          # a wake-up was sent for the BLPOP in flight
        self._block = self.BLOCK

    def pop(self, key: str, timeout: float, socket_timeout: float) -> Any:
        """Wait up to ``timeout`` s for a value pushed to ``key``; return ``[key, value]``, or
        None. While places are left, on a connection of its own (a ``BLPOP`` of its key, the
        quickest handoff: no thread in between; ``socket_timeout`` bounds it), else in the hub
        (:meth:`wait`); a thread that once waited in the hub waits there until it leaves."""
        if "BLPOP" in self.refusals.commands:
            time.sleep(timeout)                   # polling: the next try reads the lock's keys
            return None
        if key not in self.waiting and self._alone.acquire(blocking=False):
            try:
                return self.calls("BLPOP", key, timeout, timeout=socket_timeout)
            except rex.ResponseError as exc:
                if not refused(exc):
                    raise
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
                time.sleep(timeout)           # polling: the next try reads the lock's keys
                return None
            finally:
                self._alone.release()
        return self.wait(key, timeout)

    def wait(self, key: str, timeout: float) -> Any:
        """Wait in the hub up to ``timeout`` s for a value pushed to ``key``; return it, or None."""
        wake = False
        with self._mutex:
            slot = self.waiting.get(key)
            if slot is None:
                slot = self.waiting[key] = _Slot()
            if "BLPOP" in self.refusals.commands:
                pass                             # polling: nobody blocks
            elif self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ylock-notify", daemon=True)
                self._thread.start()
            elif self._blocking and key not in self._blocking and not self._waking:
                self._waking = wake = True       # one wake-up for every thread that joins meanwhile
        if wake:
            self._wake()
        slot.event.wait(timeout)
        with self._mutex:
            value, slot.value = slot.value, None
            slot.event.clear()
        return value

    def leave(self, key: str) -> None:
        """The thread waiting on ``key`` stopped waiting (acquired, gave up, or failed)."""
        with self._mutex:
            self.waiting.pop(key, None)

    def _wake(self) -> None:
        try:
            self.calls.many(("LPUSH", self.wake_key, "1"), ("PEXPIRE", self.wake_key, WAKE_TTL_MS))
        except rex.RedisError as exc:
            if refused(exc):
                self.refusals.note("LPUSH", exc, *_WAKE_REFUSED)
                self._block = 0.05      # no wake-ups: block briefly, so new keys are watched soon
            # else: the hub finds out on its own connection

    def _run(self) -> None:
        conn = None
        try:
            while True:
                if conn is None:
                    conn = self.calls.checkout(None)
                with self._mutex:
                    if not self.waiting:
                        self._thread = None       # under the lock: a new waiter starts another
                        return
                    keys = list(self.waiting)
                    self._blocking = frozenset(keys)
                    self._waking = False          # a joiner from now on wakes this BLPOP
                try:
                    _send(conn, ("BLPOP", *keys, self.wake_key, self._block), time.monotonic() + self._block + 5.0)
                    reply = conn.ylock_read()
                finally:
                    with self._mutex:
                        self._blocking = frozenset()
                if reply:
                    key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                    with self._mutex:
                        slot = self.waiting.get(key)     # None for the wake-up list
                        if slot is not None:
                            slot.value = reply
                            slot.event.set()
        except BaseException as exc:  # noqa: BLE001 - the waiters try again (and see the error themselves)
            if refused(exc):                # an ACL, a proxy: never again, the waiters poll
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
            with self._mutex:
                self._thread = None
                self._blocking = frozenset()
                for slot in self.waiting.values():
                    slot.event.set()
            if conn is not None:
                conn.disconnect()
        finally:
            if conn is not None:
                self.calls.checkin(conn)


class NotifyHub:
    """Where the asyncio waiters of one event loop wait for their grants: one connection
    blocked in one ``BLPOP`` over every waiting task's notify list and the hub's wake-up
    list, instead of a connection (and a file descriptor) per waiting task. A task that
    starts waiting while the hub is blocked pushes to the wake-up list (see
    :class:`ThreadNotifyHub`; no ``CLIENT`` command): the new key is watched at once; a
    grant pushed meanwhile stays in its list until then. A grant popped for a task that
    stopped waiting is dropped: the grant lives in the lock's own keys, which that task's
    next try reads, so the notification is only a wake-up. A refused ``BLPOP`` is logged
    once and the tasks poll.

    A task's key stays in the ``BLPOP`` for :attr:`LINGER` seconds after it stopped waiting:
    tasks that take turns on a lock wait again soon after each acquisition, and their key
    is then watched already: no wake-up round trip and no ``BLPOP`` sent again for it (8
    tasks of a loop taking turns: one ``BLPOP`` per acquisition instead of two and a wake-up).
    A value popped for such a key while its task was between two waits (its try in flight)
    is not handed over (it may be a grant that try took already: a stale token must never
    pass for a grant), but noted: the task's next wait returns a wake-up at once, so that it
    tries again rather than wait out its timeout for a grant that was already pushed."""

    #: Seconds a BLPOP blocks before it is sent again (a safety net, not a poll).
    BLOCK = 5.0
    #: Seconds a key stays in the BLPOP after its task stopped waiting (see above).
    LINGER = 5.0

    def __init__(self, pool: Any, calls: AsyncDirectCalls, wake_key: str, refusals: Refusals | None = None) -> None:
        import asyncio

        self._asyncio = asyncio
        self.pool = pool
        self.calls = calls
        self.wake_key = wake_key
        self.refusals = refusals or Refusals()
        self.waiting: dict[str, Any] = {}          # notify key -> future of the task waiting on it
        self._task: Any = None
        self._conn: Any = None
        self._blocking: set[str] = set()           # the keys of the BLPOP in flight
        self._waking = False
        self._block = self.BLOCK
        self._left: dict[str, float] = {}          # key -> when its task last stopped waiting
        self._early: set[str] = set()              # keys popped between their task's waits

    async def wait(self, key: str, timeout: float) -> Any:
        """Wait up to ``timeout`` s for a value pushed to ``key``; return it, or None."""
        if "BLPOP" in self.refusals.commands:
            await self._asyncio.sleep(timeout)        # polling: the next try reads the lock's keys
            return None
        if key in self._early:
            self._early.discard(key)
            return (key, b"wake")                    # try again now (see the class docstring)
        loop = self._asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting[key] = future
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        elif self._blocking and key not in self._blocking and not self._waking:
            self._waking = True
            loop.call_soon(self._wake)               # once per loop turn, however many joined
        # A timer rather than asyncio.wait_for, which before Python 3.12 drops a cancellation
        # that lands as the future completes (the task would wait on).
        timer = loop.call_later(timeout, _settle, future, None)
        try:
            return await future
        finally:
            timer.cancel()
            if self.waiting.get(key) is future:
                del self.waiting[key]
            if key not in self.waiting:
                self._left[key] = time.monotonic()  # watched a while longer: see LINGER
            if not self.waiting and self._task is not None and not self._task.done():
                # Nobody waits any more: stop blocking (its connection is dropped, so the
                # server stops popping for it), rather than leave a task pending in a loop
                # that may be about to close (a Flask async view's loop lives one request).
                self._task.cancel()

    async def aclose(self) -> None:
        """Stop blocking and give the connection back (the loop is shutting down)."""
        for future in list(self.waiting.values()):
            _settle(future, None)
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def _wake(self) -> None:
        if self._blocking:
            task = self._asyncio.get_running_loop().create_task(self._send_wake())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _send_wake(self) -> None:
        try:
            await self.calls.many(("LPUSH", self.wake_key, "1"), ("PEXPIRE", self.wake_key, WAKE_TTL_MS),
                                  timeout=2.0)
        except rex.ResponseError as exc:
            if not refused(exc):
                raise
            self.refusals.note("LPUSH", exc, *_WAKE_REFUSED)
            self._block = 0.05          # no wake-ups: block briefly, so new keys are watched soon

    async def _run(self) -> None:
        try:
            while self.waiting:
                if self._conn is None:
                    self._conn = await self.calls.checkout(None)
                keys = list(self.waiting)
                if self._left:
                    lingered = time.monotonic() - self.LINGER
                    self._left = {k: t for k, t in self._left.items() if t > lingered and k not in self.waiting}
                    keys += self._left
                    if self._early:
                        self._early &= self._left.keys()
                self._blocking = set(keys)
                self._waking = False
                try:
                    conn = self._conn
                    reply = await _exchange(conn, conn.ylock_pack("BLPOP", *keys, self.wake_key, self._block),
                                            time.monotonic() + self._block + 5.0)
                finally:
                    self._blocking = set()
                if reply:
                    key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                    future = self.waiting.pop(key, None)     # None for the wake-up list
                    if future is not None:
                        _settle(future, reply)
                    elif key in self._left:
                        self._early.add(key)                 # its task's next wait tries again
        except (Exception, self._asyncio.CancelledError) as exc:  # noqa: BLE001 - the waiters poll on
            if refused(exc):                # an ACL, a proxy: never again, the tasks poll
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
            if self._conn is not None:
                await self._conn.disconnect(nowait=True)
                self.calls.checkin(self._conn)
                self._conn = None
            for future in list(self.waiting.values()):
                _settle(future, None)
        finally:
            if self._conn is not None and not self.waiting:
                conn, self._conn = self._conn, None
                self.calls.checkin(conn)


def _settle(future: Any, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def cluster_call(client: Any) -> Any:
    """The hot path's sender on a Cluster: redis-py's own routing (it follows MOVED and
    refreshes its slot map), whose sockets time out after the socket timeout: a call's
    budget is not passed down per operation there."""
    def call(*args: Any, timeout: float | None = None) -> Any:
        return client.execute_command(*args)
    return call


def async_cluster_call(client: Any) -> Any:
    """:func:`cluster_call` for a ``redis.asyncio`` Cluster client."""
    async def call(*args: Any, timeout: float | None = None) -> Any:
        return await client.execute_command(*args)
    return call


def cluster_script_wait(client: Any, script: Any, key: str, args: list[Any], replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
    """Run ``script`` (a registered redis-py Script) on the Cluster node that owns ``key``'s
    slot and ``WAIT`` for ``replicas`` there, back to back on one connection (WAIT counts
    the replicas that have that connection's writes; a ClusterPipeline refuses scripts).
    Return ``(reply, replicas that acknowledged)``. A ``MOVED`` reply (the slot moved, a
    replica promoted) refreshes the slot map and tries once more on the new owner."""
    for attempt in (0, 1):
        node_client = client.get_redis_connection(client.get_node_from_key(key))
        pipe = node_client.pipeline(transaction=False)
        script(keys=[key], args=args, client=pipe)    # loads it there on NOSCRIPT
        pipe.wait(replicas, timeout_ms)
        try:
            reply, acked = pipe.execute()
        except rex.MovedError:
            if attempt:
                raise
            client.nodes_manager.initialize()
            continue
        return reply, int(acked)
    raise AssertionError("unreachable")


async def acluster_script_wait(client: Any, script: Any, key: str, args: list[Any], replicas: int,
                               timeout_ms: int) -> tuple[Any, int]:
    """:func:`cluster_script_wait` for a ``redis.asyncio`` Cluster client: the two commands
    go out in one write on one of the slot owner's connections."""
    await client.initialize()       # a no-op once the client knows the slots
    for attempt in (0, 1):
        node = client.get_node_from_key(key)
        reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, 1, key, *args),
                                                   ("WAIT", replicas, timeout_ms)])
        if isinstance(reply, rex.NoScriptError):
            await node.execute_command("SCRIPT", "LOAD", script.script)
            reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, 1, key, *args),
                                                       ("WAIT", replicas, timeout_ms)])
        if isinstance(reply, rex.MovedError) and not attempt:
            await client.nodes_manager.initialize()
            continue
        for value in (reply, acked):
            if isinstance(value, Exception):
                raise value
        return reply, int(acked)
    raise AssertionError("unreachable")


async def _node_pipeline(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on one of an asyncio Cluster node's connections and
    return their replies, an error reply as its exception."""
    conn = node.acquire_connection()
    try:
        await node.disconnect_if_needed(conn)
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except rex.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await conn.disconnect()     # no half-read reply survives
        raise
    finally:
        node.release(conn)
