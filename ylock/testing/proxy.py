"""A loopback TCP proxy that puts network faults between a client and a test server.

:class:`TcpProxy` listens on 127.0.0.1 at a free port and forwards every connection it
accepts to the target (a :class:`~ylock.testing.redis.RedisServer`, a ZooKeeper server...).
Point the client at the proxy, then switch its mode at any time, connections open or not:

* :meth:`TcpProxy.heal` forwards everything both ways (the default);
* :meth:`TcpProxy.delay` forwards every chunk ``seconds`` late in each direction, in order;
* :meth:`TcpProxy.drop` turns the proxy into a black hole (see the method for what that means);
* :meth:`TcpProxy.cut` resets every open connection and keeps listening in the current mode.

One thread runs every connection with non-blocking sockets and a ``selectors`` loop: the
proxy holds hundreds of connections with two file descriptors each, no thread per
connection. A mode switch is a command the loop runs between two events, and the call
returns once it has run, so what a test does next already sees the new mode. The loop
never blocks on a socket, so a switch in the middle of a transfer cannot deadlock.
"""
from __future__ import annotations

import errno
import select
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from ylock.testing.forwarding import Connection, Forwarding, Mode

_ACCEPT_BATCH = 64          # connections accepted per wake-up, so a burst cannot starve the others
_FD_PAUSE = 0.05            # seconds without accepting after running out of file descriptors
_COMMAND_TIMEOUT = 10.0     # seconds a mode switch may wait for the loop before giving up


class TcpProxy(Forwarding):
    """A TCP proxy on ``host``:``port`` (127.0.0.1, a free port unless ``port`` is given)
    forwarding to ``target_host``:``target_port``, whose faults a test switches on and off.

    Counters, for tests to assert on: ``accepted`` (connections accepted), ``bytes_from_client``
    and ``bytes_from_target`` (bytes the proxy has read), ``bytes_to_target`` and
    ``bytes_to_client`` (bytes it has delivered: the difference is what it holds back),
    ``connections_cut`` (reset by :meth:`cut`) and ``failed_connects`` (the target refused the
    proxy). They only grow, over starts and stops; ``open_connections`` is how many are open.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *, port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = port
        self.accepted = 0
        self.bytes_from_client = 0
        self.bytes_from_target = 0
        self.bytes_to_target = 0
        self.bytes_to_client = 0
        self.connections_cut = 0
        self.failed_connects = 0
        self._mode: Mode = "heal"
        self._delay = 0.0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._commands: deque[Callable[[], None]] = deque()
        self._conns: set[Connection] = set()
        self._pending: set[Connection] = set()   # connections holding chunks
        self._masks: dict[socket.socket, int] = {}
        self._accept_paused_until: float | None = None
        self._target: tuple[socket.AddressFamily, tuple[str, int]] | None = None
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._waker: tuple[socket.socket, socket.socket] | None = None

    # -- the public interface -------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def delay_seconds(self) -> float:
        return self._delay

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def address(self) -> str:
        """``host:port`` of the proxy, as clients such as kazoo want it."""
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        """Listen (on the same port as before if started earlier) and run the loop thread."""
        if self._thread is not None:
            return self
        info = socket.getaddrinfo(self.target_host, self.target_port, type=socket.SOCK_STREAM)[0]
        self._target = (info[0], (str(info[4][0]), int(info[4][1])))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # A restart on the same port must not fail on connections in TIME_WAIT.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(1024)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.port = int(listener.getsockname()[1])
        waker = socket.socketpair()
        for sock in waker:
            sock.setblocking(False)
        self._listener, self._waker = listener, waker
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ)
        self._sel.register(waker[0], selectors.EVENT_READ)
        self._masks.clear()
        self._commands.clear()
        self._stopping = False
        self._error = None
        self._accept_paused_until = None
        self._thread = threading.Thread(target=self._run, name=f"TcpProxy:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Reset every connection, stop listening (the port is free on return) and end the
        thread. A no-op if the proxy is not running."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake()
        thread.join(_COMMAND_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError(f"{self!r}: the proxy thread did not stop")
        self._thread = None

    def heal(self) -> None:
        """Forward everything both ways from now on. Chunks held back by an earlier
        :meth:`delay` or :meth:`drop` go out at once, in order; connections accepted during
        a drop (and still open) connect to the target now."""
        self._call(lambda: self._set_mode("heal", 0.0, release=True))

    def delay(self, seconds: float) -> None:
        """Deliver every chunk read from now on ``seconds`` after it was read, in each direction:
        a request-reply round trip takes at least ``2 * seconds``. The order of the stream is
        kept (a chunk never overtakes one read before it, even across a change of delay)."""
        if seconds < 0:
            raise ValueError("delay() takes a duration >= 0")
        self._call(lambda: self._set_mode("delay", float(seconds), release=False))

    def drop(self) -> None:
        """Become a black hole: forward nothing either way, as when the network silently
        drops every packet. Connections stay open and new ones are still accepted, so a
        client sees no error, only silence: its reads time out.

        Bytes are left unread, not read and discarded: they pile up in the socket buffers as
        unacknowledged segments pile up in a sender's TCP buffer during a partition, so a
        client's small writes succeed and a large one eventually blocks (and times out).
        TCP never loses bytes in the middle of a stream, and neither does this: on
        :meth:`heal` (or :meth:`delay`), what a connection opened before the drop still
        holds is delivered in order, like a retransmission once the partition heals, even
        if its client has closed it meanwhile: a request the client gave up on can still
        reach the server late, as in production.

        A connection accepted during the drop is only connected to the target when the drop
        ends, and only if its client is still there: one the client closed meanwhile is
        closed unforwarded, as a real one would never have got past its handshake (so a
        client's abandoned reconnection attempts are not replayed to the server)."""
        self._call(lambda: self._set_mode("drop", 0.0, release=False))

    def cut(self) -> None:
        """Reset every open connection at once (both peers see ECONNRESET, or EOF if they
        read nothing more); keep listening in the current mode."""
        self._call(self._cut)

    def counters(self) -> dict[str, int]:
        """A snapshot of the counters (and ``open_connections``)."""
        return {"accepted": self.accepted, "open_connections": self.open_connections,
                "bytes_from_client": self.bytes_from_client, "bytes_from_target": self.bytes_from_target,
                "bytes_to_target": self.bytes_to_target, "bytes_to_client": self.bytes_to_client,
                "connections_cut": self.connections_cut, "failed_connects": self.failed_connects}

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"<TcpProxy {self.address} -> {self.target_host}:{self.target_port} {self._mode}"
                f"{f' {self._delay}s' if self._mode == 'delay' else ''}>")

    # -- commands from other threads --------------------------------------------------------

    def _wake(self) -> None:
        waker = self._waker             # the loop sets it to None as it ends
        if waker is not None:
            try:
                waker[1].send(b"\0")
            except OSError:     # the buffer is full (a wake-up is pending anyway) or closed
                pass

    def _call(self, command: Callable[[], None]) -> None:
        """Run ``command`` in the loop thread and return once it has run (directly if the
        proxy is not running: then there is no connection to act on)."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            command()
            return
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                command()
            except BaseException as exc:   # noqa: BLE001 - raised again in the caller's thread
                errors.append(exc)
            finally:
                done.set()

        self._commands.append(run)
        self._wake()
        deadline = time.monotonic() + _COMMAND_TIMEOUT
        while not done.wait(0.05):
            if not thread.is_alive() and not done.is_set():
                if self._error is not None:
                    raise RuntimeError(f"{self!r}: the proxy thread died") from self._error
                try:                        # stopped meanwhile: no connection is left to act on
                    self._commands.remove(run)
                except ValueError:
                    continue
                run()
            elif time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: the proxy thread did not answer")
        if errors:
            raise errors[0]

    def _set_mode(self, mode: Mode, delay: float, release: bool) -> None:
        self._mode, self._delay = mode, delay
        if mode != "drop":
            for conn in self._hung_up([c for c in self._conns if c.server is None]):
                self._close(conn, reset=False)
        now = time.monotonic()
        for conn in list(self._conns):
            if release:
                for flow in (conn.up, conn.down):
                    flow.chunks = deque((now, data) for _, data in flow.chunks)
            if mode != "drop" and conn.server is None:
                self._connect(conn)
            if not conn.closed:
                self._pump(conn)

    @staticmethod
    def _hung_up(conns: list[Connection]) -> list[Connection]:
        """The connections whose client has closed or reset its end (unread data or not)."""
        if not conns:
            return []
        poller = select.poll()
        by_fd = {conn.client.fileno(): conn for conn in conns}
        for fd in by_fd:
            poller.register(fd, select.POLLRDHUP)       # POLLHUP and POLLERR come unasked
        return [by_fd[fd] for fd, _ in poller.poll(0)]

    def _cut(self) -> None:
        for conn in list(self._conns):
            self._close(conn, reset=True)
            self.connections_cut += 1

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._sel is not None
        try:
            while not self._stopping:
                for key, events in self._sel.select(self._timeout()):
                    self._dispatch(key, events)
                while self._commands:
                    self._commands.popleft()()
                self._resume_accepting()
                for conn in list(self._pending):
                    if not conn.closed:
                        self._pump(conn)
        except BaseException as exc:   # noqa: BLE001 - kept for the callers of _call()
            self._error = exc
            raise
        finally:
            self._shutdown()

    def _timeout(self) -> float | None:
        """Seconds until the next chunk is due (None: wait for an event)."""
        due = self._accept_paused_until
        if self._mode != "drop":
            for conn in self._pending:
                for flow, ready in ((conn.up, conn.connected), (conn.down, True)):
                    if flow.chunks and ready and not flow.blocked:
                        head = flow.chunks[0][0]
                        due = head if due is None else min(due, head)
        return None if due is None else max(0.0, due - time.monotonic())

    def _dispatch(self, key: selectors.SelectorKey, events: int) -> None:
        sock = key.fileobj
        assert self._waker is not None
        if sock is self._listener:
            self._accept()
            return
        if sock is self._waker[0]:
            try:
                while self._waker[0].recv(4096):
                    pass
            except BlockingIOError:
                pass
            return
        conn: Connection = key.data
        if conn.closed:     # closed by an earlier event of the same batch
            return
        events &= key.events    # epoll reports a hang-up as both events: act on what was asked for
        if sock is conn.client:
            if events & selectors.EVENT_WRITE:
                conn.down.blocked = False
            if events & selectors.EVENT_READ:
                self._read(conn, conn.client, conn.up)
        elif not conn.connected:
            self._finish_connect(conn)
        else:
            assert conn.server is not None
            if events & selectors.EVENT_WRITE:
                conn.up.blocked = False
            if events & selectors.EVENT_READ:
                self._read(conn, conn.server, conn.down)
        if not conn.closed:
            self._pump(conn)

    def _accept(self) -> None:
        assert self._listener is not None and self._sel is not None
        for _ in range(_ACCEPT_BATCH):
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the connection waits in the backlog meanwhile.
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + _FD_PAUSE
                    return
                raise
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(client)
            self._conns.add(conn)
            self.accepted += 1
            if self._mode != "drop":
                self._connect(conn)
            if not conn.closed:
                self._pump(conn)

    def _resume_accepting(self) -> None:
        paused = self._accept_paused_until
        if paused is not None and time.monotonic() >= paused:
            assert self._sel is not None and self._listener is not None
            self._accept_paused_until = None
            self._sel.register(self._listener, selectors.EVENT_READ)

    def _shutdown(self) -> None:
        """Close everything (in the loop thread, as it ends)."""
        for conn in list(self._conns):
            self._close(conn, reset=True)
        for sock in (self._listener, *(self._waker or ())):
            if sock is not None:
                sock.close()
        if self._sel is not None:
            self._sel.close()
        self._listener = self._waker = self._sel = None
        self._masks.clear()
