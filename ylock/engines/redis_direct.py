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
  like the engine's redis-py ``Retry`` of one attempt; a ``TimeoutError`` is not retried,
  so a frozen server stalls a call for one socket timeout only;
* an error reply (``NOSCRIPT``, a script error) leaves the connection clean and usable;
  anything else (an interrupt mid-reply) disconnects it, so no stale reply is ever read.

Redis Cluster keeps redis-py's own path (it routes by slot and follows ``MOVED``).
"""
from __future__ import annotations

from typing import Any

import redis.exceptions as rex


class DirectCalls:
    """Send commands over ``pool``'s connections without redis-py's per-command layers."""

    __slots__ = ("pool", "idle")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []

    def __call__(self, *args: Any) -> Any:
        """Send one command and return its raw reply (no response callbacks: the lock path
        only sends EVALSHA and BLPOP, whose replies redis-py does not convert)."""
        idle = self.idle
        try:
            conn = idle.pop()
        except IndexError:
            conn = self.pool.get_connection()
        try:
            try:
                conn.send_command(*args, check_health=False)
                reply = conn.read_response()
            except rex.ConnectionError:
                conn.disconnect()
                conn.send_command(*args, check_health=False)   # connects anew, once
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
