"""The data path of :class:`~ylock.testing.proxy.TcpProxy`: each proxied connection's two flows
of chunks, read from one socket and written to the other when due (``delay``), held back
(``drop``), or reset (``cut``). The proxy's loop calls these on the events of its selector."""
from __future__ import annotations

import errno
import selectors
import socket
import struct
import time
from collections import deque
from typing import Literal

Mode = Literal["heal", "delay", "drop"]

CHUNK = 65536               # bytes read from a socket at a time: one "chunk" of delay()
HIGH_WATER = 1 << 20        # bytes held for one direction before the proxy stops reading its source
# close() after SO_LINGER (on, 0 s) sends a RST instead of a FIN: the peer sees a reset
RESET = struct.pack("ii", 1, 0)


class Flow:
    """One direction of a proxied connection: chunks read from one side, not yet written to
    the other, each with the time it is due (an empty chunk stands for end of stream)."""

    __slots__ = ("chunks", "held", "eof_read", "eof_sent", "blocked", "to_target")

    def __init__(self, to_target: bool) -> None:
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.held = 0                # bytes in chunks
        self.eof_read = False
        self.eof_sent = False
        self.blocked = False         # the destination's buffer is full: wait until it is writable
        self.to_target = to_target


class Connection:
    """A client's connection to the proxy and the proxy's connection to the target."""

    __slots__ = ("client", "server", "connected", "closed", "up", "down")

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.server: socket.socket | None = None   # None until the proxy connects to the target
        self.connected = False
        self.closed = False
        self.up = Flow(to_target=True)
        self.down = Flow(to_target=False)


class Forwarding:
    """What moves bytes between a proxied connection's client and its target (the mode
    decides when), and the counters of what moved."""

    _mode: Mode
    _delay: float
    _target: tuple[socket.AddressFamily, tuple[str, int]] | None
    _sel: selectors.BaseSelector | None
    _conns: set[Connection]
    _pending: set[Connection]
    _masks: dict[socket.socket, int]
    bytes_from_client: int
    bytes_from_target: int
    bytes_to_target: int
    bytes_to_client: int
    failed_connects: int

    def _connect(self, conn: Connection) -> None:
        """Start connecting to the target (non-blocking; _finish_connect() completes it)."""
        assert self._target is not None
        family, address = self._target
        try:
            server = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            self.failed_connects += 1
            self._close(conn, reset=True)
            return
        server.setblocking(False)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.server = server
        err = server.connect_ex(address)
        if err == 0:
            conn.connected = True
        elif err not in (errno.EINPROGRESS, errno.EAGAIN):
            self.failed_connects += 1
            self._close(conn, reset=True)   # the client sees a reset, as if refused

    def _finish_connect(self, conn: Connection) -> None:
        assert conn.server is not None
        if conn.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.failed_connects += 1
            self._close(conn, reset=True)
        else:
            conn.connected = True

    def _read(self, conn: Connection, source: socket.socket, flow: Flow) -> None:
        try:
            data = source.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn, reset=True)
            return
        if not data:
            flow.eof_read = True
        elif flow.to_target:
            self.bytes_from_client += len(data)
        else:
            self.bytes_from_target += len(data)
        # max(): a chunk is never due before the one read ahead of it (order is kept when
        # the delay shrinks).
        due = time.monotonic() + (self._delay if self._mode == "delay" else 0.0)
        if flow.chunks:
            due = max(due, flow.chunks[-1][0])
        flow.chunks.append((due, data))
        flow.held += len(data)

    def _pump(self, conn: Connection) -> None:
        """Write whatever is due, close a finished connection, update what to wait for."""
        if self._mode != "drop":
            if conn.connected:
                self._flush(conn, conn.up, conn.server)   # type: ignore[arg-type]
            if not conn.closed:
                self._flush(conn, conn.down, conn.client)
        if conn.closed:
            return
        if conn.up.eof_sent and conn.down.eof_sent:
            self._close(conn, reset=False)
            return
        if conn.up.chunks or conn.down.chunks:
            self._pending.add(conn)
        else:
            self._pending.discard(conn)
        reading = self._mode != "drop"
        mask = 0
        if reading and not conn.up.eof_read and conn.up.held < HIGH_WATER:
            mask |= selectors.EVENT_READ
        if conn.down.blocked:
            mask |= selectors.EVENT_WRITE
        self._watch(conn.client, mask, conn)
        if conn.server is not None:
            if not conn.connected:
                mask = selectors.EVENT_WRITE      # writable = the connection attempt finished
            else:
                mask = 0
                if reading and not conn.down.eof_read and conn.down.held < HIGH_WATER:
                    mask |= selectors.EVENT_READ
                if conn.up.blocked:
                    mask |= selectors.EVENT_WRITE
            self._watch(conn.server, mask, conn)

    def _flush(self, conn: Connection, flow: Flow, dest: socket.socket) -> None:
        now = time.monotonic()
        while flow.chunks and not flow.blocked:
            due, data = flow.chunks[0]
            if due > now:
                return
            if not data:
                try:
                    dest.shutdown(socket.SHUT_WR)
                except OSError:
                    self._close(conn, reset=True)
                    return
                flow.chunks.popleft()
                flow.eof_sent = True
                return
            try:
                sent = dest.send(data)
            except BlockingIOError:
                flow.blocked = True
                return
            except OSError:
                self._close(conn, reset=True)
                return
            if flow.to_target:
                self.bytes_to_target += sent
            else:
                self.bytes_to_client += sent
            flow.held -= sent
            if sent < len(data):
                flow.chunks[0] = (due, data[sent:])
                flow.blocked = True          # the buffer is full: wait until it is writable
            else:
                flow.chunks.popleft()

    def _watch(self, sock: socket.socket, mask: int, conn: Connection) -> None:
        assert self._sel is not None
        old = self._masks.get(sock, 0)
        if mask == old:
            return
        if not old:
            self._sel.register(sock, mask, conn)
        elif not mask:
            self._sel.unregister(sock)
        else:
            self._sel.modify(sock, mask, conn)
        if mask:
            self._masks[sock] = mask
        else:
            del self._masks[sock]

    def _close(self, conn: Connection, reset: bool) -> None:
        conn.closed = True
        self._conns.discard(conn)
        self._pending.discard(conn)
        for sock in (conn.client, conn.server):
            if sock is None:
                continue
            if self._masks.pop(sock, 0):
                assert self._sel is not None
                self._sel.unregister(sock)
            if reset:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
                except OSError:     # already reset by the peer
                    pass
            sock.close()
