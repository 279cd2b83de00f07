"""The MySQL engine's wire: the client/server protocol's text queries and pings, spoken on
an authenticated socket without blocking, so that one code path serves the blocking API and
asyncio and every wait has a deadline (the drivers are :mod:`ylock.engines.nonblocking`'s).

Why not PyMySQL's ``cursor.execute``: its socket timeout is per read, not per call, and it
blocks a thread, so an asyncio wait would cost one; a cancelled task could not leave the
server's queue. PyMySQL opens the connection (the handshake, the authentication plugins,
TLS: :mod:`~ylock.engines.mysql.connection`); then this module takes the socket over for the
lock path, which needs only ``COM_QUERY`` (several statements in one round trip: the
connection is opened with ``CLIENT_MULTI_STATEMENTS``), ``COM_PING`` (the heartbeat) and
``COM_QUIT``, and reads every value as text.

Packets: a 3-byte length, a sequence number, the payload. A query's answer is one result per
statement: an OK packet (a statement without rows), an ERR packet (which ends the whole
answer), or a result set (column count, column definitions, EOF, rows, EOF); the status of
its OK or last EOF says whether another result follows (``SERVER_MORE_RESULTS_EXISTS``).
"""
from __future__ import annotations

import select
import socket
import ssl

from ylock.engines.nonblocking import IO, READ, WRITE, Exchange, NoAnswer, adrive, drive, drive_many

__all__ = ["IO", "Exchange", "NoAnswer", "adrive", "drive", "drive_many", "Row", "ServerError", "Broken", "Wire"]

#: A row as text: one bytes (or None for NULL) per column.
Row = tuple[bytes | None, ...]

_MAX_PACKET = 0xFFFFFF
_MORE_RESULTS = 0x0008                       # SERVER_MORE_RESULTS_EXISTS
_COM_QUIT, _COM_QUERY, _COM_PING = b"\x01", b"\x03", b"\x0e"


class ServerError(Exception):
    """The server answered with an error packet: ``errno`` says which (e.g. 1317: the query
    was interrupted), ``sqlstate`` its class."""

    def __init__(self, errno: int, sqlstate: str, message: str) -> None:
        super().__init__(f"({errno}) {message}")
        self.errno = errno
        self.sqlstate = sqlstate
        self.message = message


class Broken(Exception):
    """The connection failed (reset, closed by the server, a protocol error)."""


def _lenenc(data: bytes, pos: int) -> tuple[int | None, int]:
    """Read a length-encoded integer at ``pos``: (value or None for NULL, next position)."""
    first = data[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFB:
        return None, pos + 1
    if first == 0xFC:
        return int.from_bytes(data[pos + 1:pos + 3], "little"), pos + 3
    if first == 0xFD:
        return int.from_bytes(data[pos + 1:pos + 4], "little"), pos + 4
    return int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9


def _error(payload: bytes) -> ServerError:
    errno = int.from_bytes(payload[1:3], "little")
    rest = payload[3:]
    state = ""
    if rest[:1] == b"#":
        state, rest = rest[1:6].decode("ascii", "replace"), rest[6:]
    return ServerError(errno, state, rest.decode("utf-8", "replace"))


def _row(payload: bytes, columns: int) -> Row:
    values: list[bytes | None] = []
    pos = 0
    for _ in range(columns):
        size, pos = _lenenc(payload, pos)
        if size is None:
            values.append(None)
        else:
            values.append(bytes(payload[pos:pos + size]))
            pos += size
    return tuple(values)


class Wire:
    """One authenticated connection's socket, non-blocking, with what was read of it and
    not yet parsed. Its exchanges are generators for the drivers."""

    __slots__ = ("sock", "fd", "buf")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()

    # -- bytes ------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> IO[None]:
        view = memoryview(data)
        while view:
            try:
                sent = self.sock.send(view)
            except (BlockingIOError, ssl.SSLWantWriteError):
                yield self.fd, WRITE
                continue
            except ssl.SSLWantReadError:
                yield self.fd, READ
                continue
            except OSError as exc:
                raise Broken(f"sending failed: {exc}") from exc
            view = view[sent:]

    def _fill(self) -> IO[None]:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                yield self.fd, READ
                continue
            except ssl.SSLWantWriteError:
                yield self.fd, WRITE
                continue
            except OSError as exc:
                raise Broken(f"reading failed: {exc}") from exc
            if not chunk:
                raise Broken("the server closed the connection")
            self.buf += chunk
            return

    def _packet(self) -> IO[bytes]:
        parts = []
        while True:
            while len(self.buf) < 4:
                yield from self._fill()
            size = int.from_bytes(self.buf[:3], "little")
            while len(self.buf) < 4 + size:
                yield from self._fill()
            parts.append(bytes(self.buf[4:4 + size]))
            del self.buf[:4 + size]
            if size < _MAX_PACKET:
                return b"".join(parts)

    # -- exchanges ----------------------------------------------------------------------------------

    def query(self, sql: bytes) -> IO[list[list[Row]]]:
        """Send ``sql`` (one or more statements) and return the rows of each statement's
        result (an empty list for a statement without rows). Raise :class:`ServerError` for
        the first error (the statements after it did not run), :class:`Broken` when the
        connection failed."""
        if len(sql) + 1 >= _MAX_PACKET:
            raise ValueError("statement too long for one packet")
        payload = _COM_QUERY + sql
        yield from self._send(len(payload).to_bytes(3, "little") + b"\x00" + payload)
        results: list[list[Row]] = []
        while True:
            head = yield from self._packet()
            if not head:
                raise Broken("empty packet")
            kind = head[0]
            if kind == 0xFF:
                raise _error(head)
            if kind == 0x00:                   # OK: a statement without rows
                _, pos = _lenenc(head, 1)
                _, pos = _lenenc(head, pos)
                status = int.from_bytes(head[pos:pos + 2], "little")
                results.append([])
            elif kind == 0xFB:
                raise Broken("the server asked for a local file")
            else:
                columns, _ = _lenenc(head, 0)
                assert columns is not None
                for _ in range(columns + 1):   # the column definitions, then their EOF
                    yield from self._packet()
                rows: list[Row] = []
                while True:
                    packet = yield from self._packet()
                    if packet[:1] == b"\xfe" and len(packet) < 9:
                        status = int.from_bytes(packet[3:5], "little")
                        break
                    if packet[:1] == b"\xff":
                        raise _error(packet)
                    rows.append(_row(packet, columns))
                results.append(rows)
            if not status & _MORE_RESULTS:
                return results

    def ping(self) -> IO[None]:
        """The heartbeat: ``COM_PING``, answered by an OK packet. It resets the server's idle
        timer of the session (``wait_timeout``: the lease) and changes nothing else."""
        yield from self._send(b"\x01\x00\x00\x00" + _COM_PING)
        answer = yield from self._packet()
        if answer[:1] == b"\xff":
            raise _error(answer)

    def stale(self) -> bool:
        """Return True if an idle connection turns out closed or unusable, without a round
        trip: the server sent something meanwhile (its goodbye when it ended the session:
        ``wait_timeout``, ``KILL``, a shutdown) or closed it. Over TLS, what arrives may be the
        protocol's own (a session ticket): that is read and the connection kept."""
        if self.buf:
            return True
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            data = self.sock.recv(4096)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False                       # TLS records of its own, no data: still fine
        except OSError:
            return True
        if data:
            self.buf += data                   # unasked-for data: an error packet; unusable
        return True

    def close(self, quit: bool = True) -> None:
        """Close the socket (saying ``COM_QUIT`` first, without waiting, if ``quit``: the
        server then logs no aborted connection)."""
        if quit:
            try:
                self.sock.send(b"\x01\x00\x00\x00" + _COM_QUIT)
            except (OSError, ValueError):
                pass
        try:
            self.sock.close()
        except OSError:
            pass

