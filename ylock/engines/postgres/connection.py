"""One lock connection of the PostgreSQL engine and how it is configured: the libpq
connection string (checked once, when the engine is built), the session settings of a
lock connection, and what a connection carries while it serves a hold."""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ylock import options as opt
from ylock.engines.postgres.wire import IO, drive, query_io, stale
from ylock.engines.sessions.connection import Hold, SessionConn, keepalive_timing
from ylock.errors import ConfigurationError

__all__ = ["Conn", "Hold", "conninfo", "keepalive_timing", "proxied", "session_settings"]


class Conn(SessionConn):
    """One lock connection: a libpq connection and what it carries (one owner's holds of
    one lock, or nothing while pooled)."""

    __slots__ = ("pg", "pid", "proxied", "key", "listening", "channel", "queue_key")

    def __init__(self, pg: Any, pid: int, proxied: bool | None) -> None:
        super().__init__()
        self.pg = pg
        self.pid = pid
        self.proxied = proxied
        self.key = 0
        self.listening = False
        self.channel = ""
        self.queue_key = 0

    def close(self) -> None:
        self.broken = True
        with contextlib.suppress(Exception):
            self.pg.finish()

    def retire(self, timeout: float = 1.0) -> None:
        """Close a healthy session-scope connection that may go through a pooler in session
        mode, which would hand its server session to its next client with what ylock left on
        it (settings, prepared statements, a lock: PgBouncer's ``server_reset_query`` cleans
        it, unless it is turned off). Say ``DISCARD ALL`` first and wait for the answer (at
        most ``timeout`` seconds): a pooler that sees its client leave while the server
        session is still busy closes that session, and the next client pays for a new one."""
        if self.proxied is not False and not self.broken and self.pending is None:
            with contextlib.suppress(Exception):
                drive(query_io(self.pg, [lambda pg: pg.send_query(b"DISCARD ALL")]), time.monotonic() + timeout)
        self.close()

    def stale(self) -> bool:
        return stale(self.pg)

    def heartbeat(self) -> IO[Any]:
        """A bare Sync message: it resets the session's idle timer (the lease) and proves the
        session alive, and leaves what ``pg_stat_activity`` shows of it alone."""
        return query_io(self.pg, [])

    def unbind(self) -> None:
        super().unbind()
        self.key = 0

    def reusable(self) -> bool:
        return not self.broken and self.pending is None and not self.listening


def conninfo(url: str, libpq: dict[str, Any], keepalive: float, ours: Iterable[str]) -> tuple[bytes, str, str]:
    """Return the libpq connection string (URL and keyword parameters ``libpq``), checked;
    the connection's own application name; the URL to display (no password). ``ours``: the
    engine's own options, named in the error for a parameter libpq does not know."""
    known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
    unknown = sorted(set(libpq) - known)
    if unknown:
        raise ConfigurationError(f"unknown PostgreSQL engine option{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(unknown)}", code=opt.E_ENGINE_URL,
                                 hint=f"ylock's: {', '.join(sorted(ours))}; or a libpq connection parameter")
    try:
        params = conninfo_to_dict(url, **{k: v for k, v in libpq.items() if v is not None})
    except (psycopg.Error, ValueError) as exc:      # ValueError: text that has no UTF-8 form
        raise ConfigurationError(f"invalid PostgreSQL URL or option: {exc}", code=opt.E_ENGINE_URL) from exc
    idle, interval = keepalive_timing(keepalive)
    # The client's side of keepalives: a waiter that waits forever notices a dead server.
    for name, value in (("keepalives", 1), ("keepalives_idle", idle), ("keepalives_interval", interval),
                        ("keepalives_count", 3), ("tcp_user_timeout", int(keepalive * 1000)),
                        ("client_encoding", "UTF8")):
        params.setdefault(name, value)
    app = str(params.setdefault("application_name", "ylock"))
    display = (f"postgresql://{params.get('user') or ''}{'@' if params.get('user') else ''}"
               f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}")
    try:
        text = make_conninfo("", **params).encode()
    except (psycopg.Error, ValueError) as exc:
        raise ConfigurationError(f"invalid PostgreSQL URL or option: {exc}", code=opt.E_ENGINE_URL) from exc
    return text, app, display


def session_settings(keepalive: float, local: bool = False) -> str:
    """Return the lock connections' session settings, as set_config() calls (``local``:
    for the transaction only): no statement timeouts, commits flushed (the token sequence
    must not go back), the server's side of keepalives (a holder's vanished machine frees
    its locks within ``keepalive`` seconds), and a check for a vanished client while a
    waiter waits."""
    idle, interval = keepalive_timing(keepalive)
    settings = {"idle_session_timeout": 0, "idle_in_transaction_session_timeout": 0, "lock_timeout": 0,
                "statement_timeout": 0, "synchronous_commit": "on", "tcp_keepalives_idle": idle,
                "tcp_keepalives_interval": interval, "tcp_keepalives_count": 3,
                "tcp_user_timeout": int(keepalive * 1000), "client_connection_check_interval": 1000}
    return "".join(f"set_config('{k}', '{v}', {'true' if local else 'false'}), " for k, v in settings.items())


def proxied(pg: Any, server_port: bytes | None, client_port: bytes | None) -> bool | None:
    """Return whether something stands between us and the server (what it means is
    :mod:`~ylock.engines.postgres.poolers`' to judge): True if the server sees other ends
    than ours (other TCP ports, or a unix socket where we have TCP), False for a direct TCP
    connection, None when it cannot tell (unix sockets at both ends)."""
    try:
        with socket.socket(fileno=os.dup(pg.socket)) as sock:
            family = sock.family
            if family == socket.AF_UNIX:
                return None if server_port is None else True
            local, remote = sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    if server_port is None or client_port is None:
        return True                                # we speak TCP, the server sees a unix socket
    return int(server_port) != int(remote[1]) or int(client_port) != int(local[1])
