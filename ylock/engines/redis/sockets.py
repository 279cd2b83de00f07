"""The threads' socket I/O of the lock path: a command written straight into the kernel's
buffer, replies read straight from the socket, a connection made within what is left of a
call's deadline. Every function takes ``end``, the call's absolute deadline
(``time.monotonic()``; None: each operation within the connection's socket timeout)."""
from __future__ import annotations

import os
import socket
import time
from typing import Any

import redis.exceptions as rex

from ylock.engines.redis.resp import Incomplete, Push, parse, split

__all__ = ["Replies", "connect", "read_all", "raise_first_error", "reader", "send", "write", "TIMEOUT_SLACK"]


def send(conn: Any, args: tuple[Any, ...], end: float | None, packed: list[bytes] | None = None) -> None:
    """Connect ``conn`` if needed and send ``args`` (or what is ``packed`` already), its
    socket reading for what is left until ``end`` (monotonic; None: the connection's own
    socket timeout; a blocking pop passes more than the socket timeout)."""
    left = None if end is None else end - time.monotonic()
    if left is not None and left <= 0:
        raise rex.TimeoutError("no time left for the call")
    sock = conn._sock
    if sock is None:
        connect(conn, left)
        sock = conn._sock
    if left is None:
        left = conn.socket_timeout
    # Set only when it changes by more than a little (a call's timeout is mostly the socket
    # timeout less the microseconds since the call began): setting it is a system call.
    # The socket may so wait up to TIMEOUT_SLACK past ``end``.
    was = sock.gettimeout()
    if was != left and (left is None or was is None or not 0 <= was - left <= TIMEOUT_SLACK):
        sock.settimeout(left)
    write(conn, conn.ylock_pack(*args) if packed is None else packed)


#: How much later than its ``end`` a call may end: see :func:`send`.
TIMEOUT_SLACK = 0.002


def write(conn: Any, packed: list[bytes]) -> None:
    """Send a packed command on ``conn``'s socket, with redis-py's errors (as its
    ``send_packed_command``, less its health check and branches: the lock path's socket is
    connected and its timeout set by :func:`send`)."""
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


def reader(conn: Any) -> Any:
    """How the lock path reads ``conn``'s replies: :class:`Replies` where it can (replies
    as bytes), else redis-py's ``read_response``."""
    if conn.encoder.decode_responses:
        return conn.read_response
    return Replies(conn)


class Replies:
    """Read a connection's replies straight from its socket with :func:`~ylock.engines.redis.resp.parse`.
    redis-py's ``read_response`` goes through four layers of Python (the connection's, the
    parser's, a buffered socket over a ``BytesIO``) for every reply: for the lock path's
    small replies, a round trip cost 14 µs more client CPU through it than through this
    (the two timed in turns on one connection of the benchmark machine, 10 rounds). The
    same results and errors as redis-py's RESP2 and RESP3 parsers (their ``parse_error``
    makes the error replies' exceptions; a push message goes to their
    ``handle_push_response``, and the reply after it is read). Not hiredis's reader: the lock
    path's replies are mostly one integer, which :func:`~ylock.engines.redis.resp.parse` reads in under a
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
            while reply.__class__ is Push:
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

    def many(self, count: int) -> list[Any]:
        """Read ``count`` replies (a pipeline's), an error reply as its exception: parsed in
        place from the buffer, which is cut once, not after every reply (2,000 renewals' replies
        are 8 KB: cutting after each copied megabytes)."""
        conn = self.conn
        sock = conn._sock
        if sock is not self.sock:
            if sock is None:
                raise rex.ConnectionError("the connection was closed")
            self.sock, self.buf = sock, b""
        error = conn._parser.parse_error
        replies: list[Any] = []
        at = 0
        buf = self.buf
        try:
            while len(replies) < count:
                if buf.startswith(b"*0\r\n", at):      # an empty array (a listing's empty slots)
                    replies.append([])
                    at += 4
                    continue
                try:
                    reply, end = parse(buf, at, error) if at < len(buf) else _incomplete()
                except Incomplete:
                    buf = buf[at:] + _received(sock)
                    at = 0
                    continue
                at = end
                if reply.__class__ is Push:
                    conn._parser.handle_push_response(list(reply))
                    continue
                replies.append(reply)
        except TimeoutError:       # socket.timeout
            conn.disconnect()
            raise rex.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
        except OSError as exc:
            conn.disconnect()
            raise rex.ConnectionError(f"Error while reading from {conn._host_error()} : {exc.args}") from None
        except BaseException:
            conn.disconnect()
            raise
        self.buf = buf[at:]
        return replies

    def _read(self, sock: Any) -> Any:
        error = self.conn._parser.parse_error
        while (got := split(self.buf, error)) is None:
            self.buf += _received(sock)
        reply, self.buf = got
        return reply


def _incomplete() -> Any:
    raise Incomplete


def _received(sock: Any) -> bytes:
    """What the socket has for us: one read (waiting up to its timeout), then whatever else
    already arrived (a plain socket's non-blocking reads). A large reply (a listing's 20,000
    names) is so parsed once or twice, not once per 64 KB that came in (each parse of an
    incomplete reply starts again from its beginning)."""
    data = sock.recv(65536)
    if not data:
        raise rex.ConnectionError("Connection closed by server.")
    if sock.__class__ is not socket.socket or len(data) < 65536:
        return data  # type: ignore[no-any-return]
    chunks = [data]
    while True:
        try:        # the raw descriptor (non-blocking under a socket with a timeout): no wait
            more = os.read(sock.fileno(), 1 << 20)
        except (BlockingIOError, InterruptedError):
            break
        if not more:
            break                      # closed: the next read says so
        chunks.append(more)
    return b"".join(chunks)


def connect(conn: Any, left: float | None) -> None:
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


def read_all(read: Any, count: int) -> list[Any]:
    """Read ``count`` replies, an error reply as its exception (so that none is left unread)."""
    if read.__class__ is Replies and count > 1:
        return read.many(count)
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(read())
        except rex.ResponseError as exc:
            replies.append(exc)
    return replies


def raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, rex.ResponseError):
            raise reply
    return replies

