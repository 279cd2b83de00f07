"""The event loops' socket I/O of the lock path (``redis.asyncio`` connections): a command
written without ``asyncio.wait_for``, replies parsed straight from the stream, each read's
deadline kept by one timer per connection (:class:`ReadWatch`). Every function takes
``end``, the call's absolute deadline (``time.monotonic()``; None: each operation within the
connection's socket timeout)."""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import redis.exceptions as rex

from ylock.engines.base import cancelling
from ylock.engines.redis.resp import Push, split

__all__ = ["ReadWatch", "aconnect", "aread", "awrite", "exchange"]


def _left(end: float | None) -> float | None:
    if end is None:
        return None
    left = end - time.monotonic()
    if left <= 0:
        raise rex.TimeoutError("no time left for the call")
    return left


async def exchange(conn: Any, packed: list[bytes], end: float | None) -> Any:
    """Send one packed command on ``conn`` (connecting it if needed) and read its reply, all
    before ``end`` (monotonic; None: each socket operation within the socket timeout)."""
    await awrite(conn, packed, end)
    return await aread(conn, end)


async def awrite(conn: Any, packed: list[bytes], end: float | None) -> None:
    """Connect ``conn`` if needed and write ``packed`` to it, within what is left until ``end``.

    Not through redis-py's ``send_packed_command``: with a socket timeout it wraps every
    write in ``asyncio.wait_for``, a Task and two more loop turns per command (before
    Python 3.12) for a write that nearly always goes straight into the kernel's buffer: a
    fifth of the client CPU of an asyncio lock/unlock pair. Here only a write that the
    transport had to buffer (a full socket buffer: a stalled server or network) is awaited,
    bounded as the call is."""
    left = _left(end)
    if not conn.is_connected:
        await aconnect(conn, left)
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


async def aread(conn: Any, end: float | None) -> Any:
    """Read one reply from ``conn`` within what is left until ``end`` (None: its socket
    timeout); on a timeout raise ``TimeoutError`` and disconnect (the reply may still come:
    the next call must not read it as its own).

    With :func:`~ylock.engines.redis.resp.parse` over the connection's stream (see
    :class:`~ylock.engines.redis.sockets.Replies`): redis.asyncio's ``read_response`` adds a
    timeout context and three layers of coroutines per reply. Where replies are decoded to
    ``str``, through ``read_response``, bounded by the connection's ``socket_timeout`` (its
    ``timeout`` argument answers None when time runs out and keeps
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
        if reply.__class__ is not Push:
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
    """One reply (or push message) from ``conn``'s stream, by
    :func:`~ylock.engines.redis.resp.parse`, within ``end``."""
    stream = conn._reader
    if stream is None:
        raise rex.ConnectionError("the connection was closed")
    state = conn.__dict__.get("ylock_in")
    if state is None or state[0] is not stream:      # a new stream (a reconnection): no old bytes
        state = conn.ylock_in = [stream, b""]
    error = conn._parser.parse_error
    while (got := split(state[1], error)) is None:
        left = conn.socket_timeout if end is None else end - time.monotonic()
        try:
            if left is None:
                data = await stream.read(65536)
            else:
                if left <= 0:
                    raise TimeoutError
                data = await ReadWatch.of(conn).read(stream, left)
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


class ReadWatch:
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
    def of(conn: Any) -> ReadWatch:
        """``conn``'s watch, made for the running loop."""
        watch: ReadWatch | None = conn.__dict__.get("ylock_watch")
        loop = asyncio.get_running_loop()
        if watch is None or watch.loop is not loop:
            watch = conn.ylock_watch = ReadWatch(loop)
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


async def aconnect(conn: Any, left: float | None) -> None:
    """:func:`~ylock.engines.redis.sockets.connect` for a ``redis.asyncio`` connection: connect and run the handshake
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

