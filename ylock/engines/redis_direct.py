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
* each call takes a ``timeout`` that bounds all of it, a reconnection and its handshake
  included (the socket's timeout is set per call: redis-py's ``read_response`` takes no
  timeout before redis-py 8), so that an acquisition ends within its deadline plus one
  socket timeout whatever the server or the network does;
* an error reply (``NOSCRIPT``, a script error) leaves the connection clean and usable;
  anything else (an interrupt mid-reply) disconnects it, so no stale reply is ever read.

Redis Cluster keeps redis-py's own path (it routes by slot and follows ``MOVED``).
"""
from __future__ import annotations

import time
from typing import Any

import redis.exceptions as rex


class DirectCalls:
    """Send commands over ``pool``'s connections without redis-py's per-command layers."""

    __slots__ = ("pool", "idle")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []

    def __call__(self, *args: Any, timeout: float | None = None) -> Any:
        """Send one command and return its raw reply (no response callbacks: the lock path
        only sends EVALSHA and BLPOP, whose replies redis-py does not convert). The whole
        call, a reconnection included, ends within ``timeout`` seconds (default: the
        connection's socket timeout)."""
        idle = self.idle
        try:
            conn = idle.pop()
        except IndexError:
            try:
                conn = self.pool.get_connection()     # redis-py 8 connects here
            except rex.ResponseError as exc:
                raise rex.ConnectionError(f"the server refused to set up the connection: {exc}") from exc
        end = None if timeout is None else time.monotonic() + timeout
        try:
            try:
                _send(conn, args, end)
                reply = conn.read_response()
            except rex.ConnectionError:
                conn.disconnect()
                _send(conn, args, end)      # connects anew, once, within what is left
                reply = conn.read_response()
        except rex.ResponseError:
            idle.append(conn)          # an error reply was read whole: the connection is fine
            raise
        except BaseException:
            conn.disconnect()          # the next use connects anew; no half-read reply survives
            idle.append(conn)
            raise
        idle.append(conn)
        return reply


def _send(conn: Any, args: tuple[Any, ...], end: float | None) -> None:
    """Connect ``conn`` if needed and send ``args``, its socket reading for what is left
    until ``end`` (monotonic; None: the connection's own socket timeout; a blocking pop
    passes more than the socket timeout)."""
    left = None if end is None else end - time.monotonic()
    if left is not None and left <= 0:
        raise rex.TimeoutError("no time left for the call")
    if conn._sock is None:
        _connect(conn, left)
    conn._sock.settimeout(conn.socket_timeout if left is None else left)
    conn.send_command(*args, check_health=False)


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
