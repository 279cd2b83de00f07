"""Connection poolers and proxies between the PostgreSQL engine and the server.

Under a pooler in transaction (or statement) mode -- PgBouncer's ``pool_mode =
transaction``, RDS Proxy between pinnings -- a session advisory lock stays on the server
backend that took it, the unlock may run on another backend (and fail), and a client that
gets the holder's backend next re-enters the lock: two holders. Session settings leak the
same way onto backends the rest of the application then uses. Transaction scope
(``?scope=transaction``) works there; a TCP proxy or a pooler in session mode is harmless
(``?pooler=session`` says so and skips the check).

**How one is found** (:func:`probe_io`, on two connections that have set nothing): A asks
its backend's pid; B opens a transaction (which pins a backend to B for its duration) and
asks its pid; A asks again. Behind a transaction pooler B is handed the backend A just
gave back (PgBouncer reuses the most recently used server connection first), or A's
second statement runs on another backend than its first (B holds A's): either proves that
a client session is not a server session. Directly, or behind a proxy or pooler that keeps
sessions, neither can happen. Prepared statements are no proof (PgBouncer 1.21 and later
with ``max_prepared_statements`` keep protocol-level ones working across backends), and
the probe prepares nothing, sets nothing and takes no lock: it leaves nothing on a pooled
backend.

PgBouncer in statement mode refuses the probe's ``BEGIN`` (and closes the connection
after saying so): both scopes need transactions, so that is a
:class:`~ylock.ConfigurationError` in both (:func:`statement_mode`).

**Where**: on an engine's first connection in a process, when the connection is not a
plain direct TCP one (the server sees other ports than ours, or a unix socket at either
end), before that connection sets anything, prepares anything or takes any lock
(:meth:`~ylock.engines.postgres.executor.Executor.open_io`): for a session-scope engine a
transaction pooler found is a :class:`~ylock.ConfigurationError` (:func:`refusal`), then
and at every later acquisition; a transaction-scope engine goes on.
On demand, for deployment checks (Django's W004): :func:`detect_io`, which also tells a
pooler that keeps sessions (a new client connection is handed the backend of one just
closed) from a proxy of unknown kind. :func:`check_session` stays as the last guard on
every session-scope acquisition (the lock landed on another backend than its
connection's), and a prepared statement that collides ("already exists", "does not
exist") is reported as a pooler too (:func:`pooler_error`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

from ylock import options as opt
from ylock.engines.postgres.connection import Conn, proxied
from ylock.engines.postgres.wire import IO, Broken, ServerError, connect_io, query_io
from ylock.errors import ConfigurationError

#: What a bare connection asks first: its backend, the ports seen from both ends, the version.
IDENTITY = (b"SELECT pg_backend_pid(), inet_server_port(), inet_client_port(), "
            b"current_setting('server_version_num')::int")

#: How many times the probe looks (each look: four short statements).
ROUNDS = 2

#: A prepared statement that collides: another client's session shares our backend, or
#: ours moved to another backend.
COLLISIONS = ("42P05", "26000")


#: How PgBouncer in statement mode answers a BEGIN (and closes the client connection).
STATEMENT_MODE = "transaction blocks not allowed in statement pooling mode"


class Found(NamedTuple):
    """What :func:`detect_io` found: whether a proxy stands in between (``proxied``), and
    whether it is a transaction pooler (``moved``: a client session is not a server
    session) or proved to keep sessions (``keeps``: it handed a new client connection the
    backend of one just closed), or a pooler in statement mode (``statement``: it refuses
    transactions, which both scopes need)."""

    proxied: bool
    moved: bool
    keeps: bool
    statement: bool = False


def _pid(pg: Any, sql: bytes = b"SELECT pg_backend_pid()") -> IO[int]:
    rows = yield from query_io(pg, [lambda pg: pg.send_query_params(sql, None)])
    return int(rows[-1][0][0] or 0)


def needs_probe(pg: Any, server_port: bytes | None, client_port: bytes | None) -> bool:
    """Return whether a connection may go through a pooler: anything but a direct TCP
    connection (the server sees our ports)."""
    return proxied(pg, server_port, client_port) is not False


def probe_io(a: Any, b: Any) -> IO[str | None]:
    """Return what kind of pooler the two connections ``a`` and ``b`` (set up with
    nothing) go through: "transaction" (a pooler in transaction or statement mode, see the
    module docstring), "statement" (one that refuses transactions: PgBouncer in statement
    mode), or None (none, or one that keeps sessions)."""
    for _ in range(ROUNDS):
        first = yield from _pid(a)
        try:
            # BEGIN alone, as a simple query: a pooler that refuses it closes the connection
            # right after saying why, and nothing we sent is left unread (which would turn
            # its closing into a reset that loses what it said).
            yield from query_io(b, [lambda pg: pg.send_query(b"BEGIN")])
        except Broken as exc:
            if STATEMENT_MODE in str(exc):
                return "statement"
            raise
        pinned = yield from _pid(b)
        try:
            if pinned == first:
                return "transaction"           # B was handed the backend A had just used
            if (yield from _pid(a)) != first:
                return "transaction"           # A's session moved while B held its backend
        finally:
            yield from query_io(b, [lambda pg: pg.send_query_params(b"ROLLBACK", None)])
    return None


def detect_io(conninfo: bytes) -> IO[Found]:
    """Open two bare connections (closed afterwards; they set nothing) and find out what
    stands between them and the server (:class:`Found`)."""
    a = b = None
    try:
        a = yield from connect_io(conninfo)
        rows = yield from query_io(a, [lambda pg: pg.send_query_params(IDENTITY, None)])
        _, server_port, client_port, _ = rows[0][0]
        between = needs_probe(a, server_port, client_port)
        b = yield from connect_io(conninfo)
        kind = yield from probe_io(a, b)
        if kind == "statement":
            return Found(True, True, False, statement=True)
        moved = kind is not None
        keeps = False
        if between and not moved:
            # A pooler that keeps sessions hands a new client the backend of one that left.
            left = {(yield from _pid(a)), (yield from _pid(b))}
            for _ in range(3):
                for pg in (a, b):
                    if pg is not None:
                        pg.finish()
                a = b = None
                a = yield from connect_io(conninfo)
                pid = yield from _pid(a)
                if pid in left:
                    keeps = True
                    break
                left.add(pid)
        return Found(between, moved, keeps)
    finally:
        for pg in (a, b):
            if pg is not None:
                with contextlib.suppress(Exception):
                    pg.finish()


def refusal(where: str, group: str | None = None, name: str | None = None) -> ConfigurationError:
    """Return the error of a session-scope engine behind a pooler in transaction mode."""
    return ConfigurationError(
        f"a connection pooler in transaction (or statement) mode, such as PgBouncer with pool_mode=transaction "
        f"or RDS Proxy, serves the PostgreSQL engine at {where}: one client session runs on several server "
        "sessions, where session advisory locks and settings break; nothing was locked or set",
        code=opt.E_ENGINE_URL,
        hint="add ?scope=transaction to the engine's URL (transaction-scope locks work behind it), or connect "
             "to PostgreSQL directly", group=group, name=name)


def statement_mode(where: str, group: str | None = None, name: str | None = None) -> ConfigurationError:
    """Return the error of any engine behind PgBouncer in statement mode."""
    return ConfigurationError(
        f"a pooler in statement mode (PgBouncer with pool_mode=statement) serves the PostgreSQL engine at {where}: "
        "it refuses transactions, which the engine needs in both scopes", code=opt.E_ENGINE_URL,
        hint="point the engine at a pool in transaction mode with ?scope=transaction, at one in session mode, or "
             "at PostgreSQL directly", group=group, name=name)


def pooler_error(exc: Exception, where: str, group: str | None = None,
                 name: str | None = None) -> ConfigurationError | None:
    """Return the pooler's :func:`refusal` if ``exc`` is a prepared statement that collided
    in session scope, else None."""
    if isinstance(exc, ServerError) and exc.sqlstate in COLLISIONS:
        error = refusal(where, group, name)
        error.__cause__ = exc
        return error
    return None


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


def verdict(found: Found, scope: str, pooler: str, where: str) -> str | None:
    """Return what :func:`detect_io` found means for an engine (a sentence for a
    warning), or None if its locks are safe there."""
    if found.statement:
        return (f"a pooler in statement mode (PgBouncer with pool_mode=statement) serves the PostgreSQL engine at "
                f"{where}: it refuses transactions, which the engine needs in both scopes: use a pool in "
                "transaction mode with ?scope=transaction, one in session mode, or connect to PostgreSQL directly")
    if scope == "transaction":
        return None
    if found.moved:                            # whatever ?pooler= says: this is proof
        return (f"a connection pooler in transaction (or statement) mode serves the PostgreSQL engine at {where} "
                "(such as PgBouncer with pool_mode=transaction): one client session ran on several server "
                "backends. Session advisory locks break there (an unlock may run on another backend, another "
                "client may re-enter the holder's lock), and the engine refuses to take them: use "
                "?scope=transaction or connect to PostgreSQL directly")
    if found.proxied and not found.keeps and pooler != "session":
        return (f"a proxy stands between the PostgreSQL engine at {where} and the server (the server sees other "
                "ports than the client); if it is a pooler in transaction mode, session locks break: make sure "
                "it keeps sessions (pgbouncer pool_mode=session; a TCP proxy does), then set ?pooler=session, "
                "or use ?scope=transaction")
    return None
