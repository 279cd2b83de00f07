"""Connection poolers and proxies between the PostgreSQL engine and the server.

Under a pooler in transaction (or statement) mode a session advisory lock stays on the
server backend that took it, the unlock may run on another backend (and fail), and a
client that gets the holder's backend next re-enters the lock: two holders. Transaction
scope (``?scope=transaction``) works there; a TCP proxy or a pooler in session mode is
harmless (``?pooler=session`` says so).

Two places find one: :func:`detect_steps` on demand (deployment checks: Django's W004),
and :func:`check_session` on every session-scope acquisition (the lock landed on another
backend than its connection's). Whatever else tells a transaction pooler apart (a real
PgBouncer answers a second ``PREPARE`` of a name on a shared backend with "already
exists") belongs here too.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from ylock import options as opt
from ylock.engines.base import Steps
from ylock.engines.postgres.connection import Conn
from ylock.engines.postgres.ops import Query, Stmt
from ylock.engines.postgres.pool import Pool
from ylock.errors import ConfigurationError


def check_session(conn: Conn, pid: int, where: Callable[[], str], group: str, name: str) -> None:
    """Raise ConfigurationError (and close ``conn``) if a session lock taken on ``conn``
    landed on another server backend (``pid``) than the connection's own."""
    if pid != conn.pid:
        conn.close()
        raise ConfigurationError(
            f"the lock landed on another server session than its connection's ({pid}, not {conn.pid}): a pooler "
            f"in transaction mode is between ylock and PostgreSQL at {where()}; session locks "
            "break there (use ?scope=transaction, or connect to PostgreSQL directly)",
            code=opt.E_ENGINE_URL, group=group, name=name)


def detect_steps(pool: Pool, connect_timeout: float, socket_timeout: float) -> Steps:
    """Open two connections (never pooled afterwards: a pooler's backends are shared) and
    return (whether either sees a proxy, whether both ran on one server backend)."""
    a = yield from pool.checkout(time.monotonic() + connect_timeout)
    b = None
    try:
        b = yield from pool.checkout(time.monotonic() + connect_timeout)
        end = time.monotonic() + socket_timeout
        pa = (yield Query(a, [Stmt("SELECT pg_backend_pid()")], end))[0][0][0]
        pb = (yield Query(b, [Stmt("SELECT pg_backend_pid()")], end))[0][0][0]
        return a.proxied or b.proxied, pa == pb
    finally:
        for conn in (a, b):
            if conn is not None:
                pool.discard(conn)


def verdict(proxied: bool, shared: bool, scope: str, pooler: str, where: str) -> str | None:
    """Return what :func:`detect_steps` found means for an engine (a sentence for a
    warning), or None if its locks are safe there."""
    if shared:
        if scope == "transaction":
            return None
        return (f"a connection pooler in transaction (or statement) mode serves the PostgreSQL engine at {where}: "
                "two of its connections ran on one server backend. Session advisory locks break there (an "
                "unlock may run on another backend, another client may re-enter the holder's lock): use "
                "?scope=transaction or connect to PostgreSQL directly")
    if proxied and scope == "session" and pooler != "session":
        return (f"a proxy stands between the PostgreSQL engine at {where} and the server (the server sees other "
                "ports than the client); if it is a pooler in transaction mode, session locks break: make sure "
                "it keeps sessions (pgbouncer pool_mode=session; a TCP proxy does), then set ?pooler=session, "
                "or use ?scope=transaction")
    return None
