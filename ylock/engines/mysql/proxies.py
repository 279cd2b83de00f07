"""Proxies and poolers between the MySQL engine and the server.

A proxy that multiplexes client sessions over server connections -- ProxySQL with
multiplexing on, MaxScale's read/write split, a pooler in transaction mode -- breaks
``GET_LOCK``: a lock belongs to the server session that took it, a release may run on
another, and another client handed that session later re-enters it (two holders). ProxySQL
pins a client to its server connection once it calls ``GET_LOCK``, but not for every
statement around it; a TCP proxy or one that keeps sessions is harmless (``?proxy=session``
says so and skips the check).

**How one is found** (:func:`probe`, on two connections): A asks its ``CONNECTION_ID()``;
B opens a transaction (which pins a server connection to B) and asks its own; A asks again.
Behind a multiplexer B is handed the server connection A just gave back, or A's second
question runs on another server connection than its first: either proves that a client
session is not a server session. Directly, or behind a proxy that keeps sessions, neither
can happen.

**When**: on the engine's first connection in a process, when the server sees another
client port than ours (something stands in between), before the connection locks
anything: a multiplexer found is a :class:`~ylock.ConfigurationError` then and at every
later acquisition (:func:`refusal`). On demand, for deployment checks (Django's W004):
:meth:`MySQLEngine.detect_pooler <ylock.engines.mysql.MySQLEngine.detect_pooler>`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

from ylock import options as opt
from ylock.engines.mysql.connection import Conn
from ylock.engines.mysql.wire import drive
from ylock.errors import ConfigurationError

ROUNDS = 2


def client_port(host: str) -> int | None:
    """The client's port in the process list's ``HOST`` (``127.0.0.1:54321``; None for a
    unix socket's ``localhost``)."""
    _, sep, port = host.rpartition(":")
    return int(port) if sep and port.isdigit() else None


def _id(conn: Conn, end: float, sql: bytes = b"SELECT CONNECTION_ID()") -> int:
    return int(drive(conn.wire.query(sql), end)[-1][0][0] or 0)


def probe(a: Conn, open_other: Callable[[], Conn], end: float) -> bool:
    """Return True if ``a`` goes through a proxy that multiplexes sessions (see the module
    docstring); ``open_other`` opens the second connection."""
    b = open_other()
    try:
        for _ in range(ROUNDS):
            first = _id(a, end)
            pinned = _id(b, end, b"START TRANSACTION;\nSELECT CONNECTION_ID()")
            try:
                if pinned == first or _id(a, end) != first:
                    return True
            finally:
                drive(b.wire.query(b"ROLLBACK"), end)
        return False
    finally:
        with contextlib.suppress(Exception):
            b.close()


def refusal(where: str, group: str | None = None, name: str | None = None) -> ConfigurationError:
    """The error of an engine behind a proxy that multiplexes sessions."""
    return ConfigurationError(
        f"a proxy that multiplexes client sessions over server connections (ProxySQL with multiplexing, a pooler "
        f"in transaction mode) serves the MySQL engine at {where}: one client session ran on several server "
        "sessions, where GET_LOCK locks break; nothing was locked",
        code=opt.E_ENGINE_URL, hint="connect the engine to MySQL directly, or through a proxy that keeps each client "
                                    "on one server connection (then add ?proxy=session)", group=group, name=name)


def verdict(proxied: bool, multiplexed: bool, trusted: bool, where: str) -> str | None:
    """What :meth:`detect_pooler` found, as a sentence for a warning, or None if locks are safe."""
    if multiplexed:
        return (f"a proxy that multiplexes sessions serves the MySQL engine at {where}: one client session ran on "
                "several server connections; GET_LOCK locks break there (a release on another session, another "
                "client re-entering the holder's lock), and the engine refuses to take them: connect to MySQL "
                "directly")
    if proxied and not trusted:
        return (f"a proxy stands between the MySQL engine at {where} and the server (the server sees another client "
                "port than ours); if it multiplexes sessions (ProxySQL, MaxScale), GET_LOCK locks break: make sure "
                "it keeps each client on one server connection, then set ?proxy=session")
    return None
