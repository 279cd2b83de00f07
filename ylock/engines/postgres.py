"""PostgresEngine: locks on PostgreSQL advisory locks, through psycopg 3 (``ylock[postgres]``).

URL (libpq's, as psycopg takes it)::

    postgresql://[user:password@]host:5432/dbname[?options]      (also postgres://)

Options (query parameters or keyword arguments): ``scope`` (``session``, the default, or
``transaction``: see below), ``max_connections`` (10: connections this engine may open
in this process), ``idle_connections`` (2: how many it keeps open while unused),
``socket_timeout`` (2 s: the longest a frozen or unreachable server can stall a call past
its own deadline), ``connect_timeout`` (2 s), ``keepalive`` (10 s: how soon the server
notices a holder's machine or network gone, and we notice the server's), ``prefix``
(``ylock``: of the tables, and mixed into the keys), ``pooler`` (``check``; ``session``: a
proxy in between keeps sessions, see ``detect_pooler``). Any other query parameter is a libpq
connection parameter (``sslmode``, ``application_name``...); one libpq does not know is a
:class:`~ylock.ConfigurationError` naming it. Django: ``django://ALIAS`` builds the same
engine from ``DATABASES[ALIAS]`` (:mod:`django_ylock.database`).

**Modes.** A lock is one 64-bit advisory key (a hash of prefix, group and name): write =
``pg_advisory_lock`` (exclusive), read = ``pg_advisory_lock_shared``. Reentrancy is the
facade's; the server lock is taken once per owner and mode. A write holder that takes the
read lock too (downgrade) gets it at once even behind queued writers (a backend holding a
conflicting lock is put ahead of the waiters it blocks); when it then releases the write
lock, queued readers enter and queued writers still wait.

**Fairness: the server's own queue, always.** PostgreSQL queues advisory lock requests FIFO
and grants a run of queued shared requests together (phase-fair): with a writer queued, a
new reader queues behind it, and even ``pg_try_advisory_lock_shared`` fails (a try never
barges). So ``fair=False`` is served fairly too. Each waiting owner waits on the server on
its own connection; the order is ``pg_locks.waitstart``.

**Connections.** Advisory locks belong to a backend, and one backend re-enters its own
locks: two owners sharing a connection would not exclude each other. So each owner that
holds or waits for a lock has a connection of its own, for that lock (its write and read
holds of that lock share it): a process uses as many connections as it has owners holding
or waiting at once, up to ``max_connections``; ``idle_connections`` of them are kept for
the next acquisition, the others closed. At the bound, an acquisition waits (FIFO, within
its timeout) for another to give one back, then raises :class:`~ylock.EngineUnavailable`
naming ``max_connections``. ``describe``, ``force_release`` and statistics borrow one.

**The lease.** A hold's connection runs with ``idle_session_timeout`` = the lock's lease,
and the process watchdog sends a heartbeat (a bare Sync message, all holds in one wait)
every lease/3. A holder that stops (SIGSTOP, a GC pause, a frozen machine) is ended by the server
after its lease: its locks are free, and the holder learns it at its next heartbeat or
release (``lost``, ``LockLost``). A holder that dies frees its locks as soon as the server
sees its connection close (at once when the process dies; about ``keepalive`` seconds, or
its lease if shorter, when its machine or network vanishes: server-side
``tcp_keepalives_*`` and ``tcp_user_timeout``). A waiter that dies leaves the queue within a
second (``client_connection_check_interval``); a waiter that freezes keeps its place until
it is granted the lock, and loses it a lease later. Measured (tests/postgres): a SIGKILLed
holder's lock is taken over in about 15 ms, a SIGSTOPped one's after its lease (1.00 s for
a 1 s lease, both scopes), a cut-off one's after its lease (2.0 s for 2 s).

**Fencing.** The acquiring statement draws the token (``nextval`` of the ``<prefix>_fence``
sequence) after the grant, in the same round trip: one statement per uncontended acquire
and one per release. Tokens increase across all names, so per name too; a sequence does not
go back after a crash (its WAL is flushed with the commit: the lock connections set
``synchronous_commit=on``). After a failover to an asynchronous replica, tokens can repeat.

**Timeouts and cancellation.** A wait is bounded on the server (``lock_timeout`` = what is
left of the timeout) and on the client (every exchange has a deadline: the timeout plus
``socket_timeout``, after which the connection is closed). The grant can race with the
timeout or a cancellation: the call fails although the server granted the lock. So after
a failed or cancelled wait the engine gives back whatever its connection holds of that
key (an unlock guarded by ``pg_locks``) before the connection is reused. A cancelled
asyncio wait sends a cancel request, reads the outcome and gives the lock back.

**describe / force_release.** ``describe`` reads ``pg_locks`` and ``pg_stat_activity``: a
key is named through the ``<prefix>_names`` table (written on first use of a name), the
holder or waiter through its connection's ``application_name`` (``token:owner``, up to 63
bytes: a longer owner id is cut). Two names whose keys collide (64-bit hash: about one
chance in 10^7 among a million names) are one lock: they exclude each other (never less
exclusion), and ``describe`` shows both. ``force_release`` ends the sessions that hold the
lock (``pg_terminate_backend``, waiting for them to exit): queued waiters then get it in
order; each terminated holder loses only this lock (a connection carries one lock's holds)
and learns it at its next heartbeat. The engine's role must be allowed to signal those
backends (the same role, or ``pg_signal_backend``).

**Transaction scope** (``?scope=transaction``): each hold is a transaction on its lock
connection, ``BEGIN`` + ``pg_advisory_xact_lock`` in one round trip, released by
``COMMIT``; the lease is ``idle_in_transaction_session_timeout``. This is the scope that
works through a pooler in transaction mode (``detect_pooler``), where a session lock lands
on whichever server connection the pooler picked. Differences: a downgraded hold stays
exclusive until its read lock is released too (a transaction lock cannot be released
alone), a semaphore's head waiter polls instead of being notified, and each hold keeps a
transaction open (do not hold for hours: it holds back vacuum if it drew a new sequence
page). With Django's ``@locked(on_commit=True)`` the lock is released right after the
view's transaction commits (or at the end of the request after a rollback), whatever the
scope; in transaction scope that release is the ``COMMIT`` of the lock's own transaction.

**What holders are doing** (``ylock.context``, ``LockInfo.context``): an acquisition that says
it sends its statement unprepared with the JSON in a leading comment; ``describe`` reads it
back from ``pg_stat_activity.query`` (the statement a session ran last: heartbeats are bare
Sync messages, which leave it alone), and "since" from ``query_start``. Nothing is written.
Other roles than the engine's see it only with ``pg_read_all_stats``.

**Tickets** (``detach``/``adopt``): a hold lives in its connection's session, so only the
process that detached it can adopt it (``adopts_across_processes = False``); adopting hands
the connection to the new owner. Nobody renews a detached hold: after its lease the server
ends the session, and adopting it then raises ``LockLost``.

**Semaphores**: a semaphore's holders hold its key shared (``pg_locks`` counts them); its
waiters queue for a second key exclusively (FIFO); the head is admitted when fewer than
``permits`` hold, and waits for a ``NOTIFY`` from a release meanwhile (polling stays the
fallback: a holder that vanished notifies nobody).

Each connection holds at most two advisory keys, so a process holds at most
2 × ``max_connections`` entries of the server's shared lock table (sized
``max_locks_per_transaction`` × ``max_connections``; when it is full, new connections fail too).

Requires PostgreSQL 14 or later (``idle_session_timeout``, ``pg_locks.waitstart``).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ylock import options as opt
from ylock.engines.base import (
    LOCK,
    PERMIT,
    READ,
    SEMAPHORE,
    WRITE,
    Abandon,
    AcquireRequest,
    Engine,
    LockInfo,
    Mailbox,
    RenewItem,
    Steps,
    arun_steps,
    holder_context,
    run_steps,
    split_url_options,
)
from ylock.engines.postgres_io import (
    Broken,
    Exchange,
    NoAnswer,
    ServerError,
    adrive,
    cancel_io,
    connect_io,
    drive,
    drive_many,
    notified_io,
    query_io,
    stale,
)
from ylock.engines.postgres_sql import WHO, Statements
from ylock.errors import ConfigurationError, EngineUnavailable, LockError, LockTimeout
from ylock.holds import HOLDS

logger = logging.getLogger(__name__)

_MASK = (1 << 64) - 1
_INT_MAX = 2**31 - 1
_SLOT = "slot"                      # handed to a waiter for a connection: "open one yourself"
_GONE = ("57P01", "57P02", "57P03", "57P05")   # the server ended the session
_DUPLICATE = ("23505", "42P07", "42710")       # two first uses created the tables at once
_OURS = {"scope", "max_connections", "idle_connections", "socket_timeout", "connect_timeout", "keepalive",
         "prefix", "pooler"}

#: Statements prepared on every session-scope connection (name -> Statements method).
_PREPARED: dict[str, Callable[[Statements], str]] = {
    "try_x": lambda s: s.lock_try(False), "try_s": lambda s: s.lock_try(True),
    "wait_x": lambda s: s.lock_wait(False), "wait_s": lambda s: s.lock_wait(True),
    "down": Statements.downgrade, "rel": Statements.release, "give": Statements.give_back,
    "sem_try": Statements.sem_try, "sem_wait": Statements.sem_wait, "sem_admit": Statements.sem_admit,
    "sem_unq": Statements.sem_unqueue, "sem_rel": Statements.sem_release, "ping": lambda s: "SELECT 1",
    "register": Statements.register, "sem_register": Statements.sem_register,
}


def advisory_key(prefix: str, kind: str, group: str, name: str) -> int:
    """The signed 64-bit advisory key of a lock (``kind`` "lock"), a semaphore's holders
    ("semaphore") or its queue ("queue")."""
    digest = hashlib.blake2b(f"{kind}\0{group}\0{name}".encode(), digest_size=8,
                             key=prefix.encode()[:64]).digest()
    return int.from_bytes(digest, "big", signed=True)


def _halves(key: int) -> tuple[bytes, bytes]:
    """pg_locks' (classid, objid) of a bigint key, as text."""
    unsigned = key & _MASK
    return str(unsigned >> 32).encode(), str(unsigned & 0xFFFFFFFF).encode()


def _b(value: object) -> bytes:
    if value is True:
        return b"t"
    if value is False:
        return b"f"
    return str(value).encode()


class _Conn:
    """One lock connection: a libpq connection and what it carries (one owner's holds of
    one lock, or nothing while pooled)."""

    __slots__ = ("pg", "pid", "proxied", "busy", "pending", "reused", "answered", "broken", "cut", "hold", "key",
                 "modes", "token", "listening", "channel", "queue_key")

    def __init__(self, pg: Any, pid: int, proxied: bool) -> None:
        self.pg = pg
        self.pid = pid
        self.proxied = proxied
        self.busy = threading.Lock()          # whoever runs an exchange on it (owner or watchdog)
        self.pending: Exchange | None = None  # an exchange in flight
        self.reused = False                   # taken from the idle pool (maybe stale)
        self.answered = False                 # answered since it was taken
        self.broken = False                   # unusable: closed or in the middle of a message
        self.cut = False                      # closed by us: the server did not answer in time
        self.hold: tuple[str, str, str, str] | None = None   # (group, name, owner, kind) it carries
        self.key = 0
        self.modes: set[str] = set()
        self.token = 0
        self.listening = False
        self.channel = ""
        self.queue_key = 0

    def close(self) -> None:
        self.broken = True
        with contextlib.suppress(Exception):
            self.pg.finish()


class PostgresEngine(Engine):
    """PostgreSQL engine (see module docstring)."""

    scheme = "postgres"
    url_options = {"scope": str, "max_connections": int, "idle_connections": int, "socket_timeout": float,
                   "connect_timeout": float, "keepalive": float, "prefix": str, "pooler": str}

    def __init__(self, url: str, *, scope: str = "session", max_connections: int = 10, idle_connections: int = 2,
                 socket_timeout: float = 2.0, connect_timeout: float = 2.0, keepalive: float = 10.0,
                 prefix: str = "ylock", pooler: str = "check", **libpq: Any) -> None:
        super().__init__()
        where = "PostgreSQL engine option"
        code = opt.E_ENGINE_URL
        self.scope = opt.choice(scope, f"{where} scope", ("session", "transaction"), code=code)
        self.max_connections = opt.number(max_connections, f"{where} max_connections", minimum=1, maximum=10_000,
                                          integer=True, code=code)
        self.idle_connections = opt.number(idle_connections, f"{where} idle_connections", minimum=0,
                                           maximum=10_000, integer=True, code=code)
        self.socket_timeout = opt.seconds(socket_timeout, f"{where} socket_timeout", maximum=3600, code=code)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600, code=code)
        self.keepalive = opt.seconds(keepalive, f"{where} keepalive", minimum=1, maximum=86400, above=None,
                                     code=code)
        self.pooler = opt.choice(pooler, f"{where} pooler", ("check", "session"), code=code)
        if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", prefix):
            raise ConfigurationError(f"{where} prefix must be a lower-case SQL name (letters, digits, _; at most "
                                     f"40), got {prefix!r}", code=code)
        self.prefix = prefix
        self.url = url
        self.conninfo, self.app_name, self._display = self._conninfo(url, libpq)
        self.sql = Statements(prefix, self.scope)
        self._texts = {name: make(self.sql).encode() for name, make in _PREPARED.items()}
        self._who = (f"SELECT {self._settings() if self.scope == 'session' else ''}{WHO}").encode()
        self._reset_state()

    def _reset_state(self) -> None:
        self._mutex = threading.Lock()
        self._idle: list[_Conn] = []
        self._open = 0
        self._slot_waiters: collections.deque[Mailbox] = collections.deque()
        self._held: dict[tuple[str, str, str, str], _Conn] = {}
        self._ready = False                      # the tables exist (checked on the first connection)
        self._registered: dict[int, int | None] = {}   # keys named in the names table (semaphores: permits)

    def _conninfo(self, url: str, libpq: dict[str, Any]) -> tuple[bytes, str, str]:
        """The libpq connection string (URL and keyword parameters), checked; the connection's
        own application name; the URL to display (no password)."""
        known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
        unknown = sorted(set(libpq) - known)
        if unknown:
            raise ConfigurationError(f"unknown PostgreSQL engine option{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(unknown)}", code=opt.E_ENGINE_URL,
                                     hint=f"ylock's: {', '.join(sorted(_OURS))}; or a libpq connection parameter")
        try:
            params = conninfo_to_dict(url, **{k: v for k, v in libpq.items() if v is not None})
        except (psycopg.Error, ValueError) as exc:      # ValueError: text that has no UTF-8 form
            raise ConfigurationError(f"invalid PostgreSQL URL or option: {exc}", code=opt.E_ENGINE_URL) from exc
        idle, interval = max(1, round(self.keepalive / 2)), max(1, round(self.keepalive / 6))
        # The client's side of keepalives: a waiter that waits forever notices a dead server.
        for name, value in (("keepalives", 1), ("keepalives_idle", idle), ("keepalives_interval", interval),
                            ("keepalives_count", 3), ("tcp_user_timeout", int(self.keepalive * 1000)),
                            ("client_encoding", "UTF8")):
            params.setdefault(name, value)
        app = str(params.setdefault("application_name", "ylock"))
        display = (f"postgresql://{params.get('user') or ''}{'@' if params.get('user') else ''}"
                   f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}")
        try:
            conninfo = make_conninfo("", **params).encode()
        except (psycopg.Error, ValueError) as exc:
            raise ConfigurationError(f"invalid PostgreSQL URL or option: {exc}", code=opt.E_ENGINE_URL) from exc
        return conninfo, app, display

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresEngine:
        """Build an engine from a URL: ylock's options are taken out of the query and parsed,
        libpq's stay (and are checked); keyword ``options`` win."""
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise ConfigurationError(f"invalid PostgreSQL URL {url!r}: {exc}", code=opt.E_ENGINE_URL) from exc
        if scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(f"not a PostgreSQL URL: {url!r}", code=opt.E_ENGINE_URL)
        base, ours, rest = split_url_options(url, cls.url_options)
        return cls(base, **{**rest, **ours, **options})

    def url_for_display(self) -> str:
        return self._display

    def _settings(self, local: bool = False) -> str:
        """The lock connections' session settings (session scope), as set_config() calls:
        no statement timeouts, commits flushed (the token sequence must not go back), the
        server's side of keepalives (a holder's vanished machine frees its locks within
        ``keepalive`` seconds), and a check for a vanished client while a waiter waits."""
        idle, interval = max(1, round(self.keepalive / 2)), max(1, round(self.keepalive / 6))
        settings = {"idle_session_timeout": 0, "idle_in_transaction_session_timeout": 0, "lock_timeout": 0,
                    "statement_timeout": 0, "synchronous_commit": "on", "tcp_keepalives_idle": idle,
                    "tcp_keepalives_interval": interval, "tcp_keepalives_count": 3,
                    "tcp_user_timeout": int(self.keepalive * 1000), "client_connection_check_interval": 1000}
        return "".join(f"set_config('{k}', '{v}', {'true' if local else 'false'}), " for k, v in settings.items())

    # -- errors: the one place they are translated ----------------------------------------------------

    def _translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a driver's or the server's error."""
        where = self.url_for_display()
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, NoAnswer):
            return EngineUnavailable(f"PostgreSQL at {where} did not answer within its timeout (socket_timeout "
                                     f"{self.socket_timeout:g} s); the connection was closed", group=group, name=name)
        if isinstance(exc, (Broken, OSError, psycopg.Error)):
            return EngineUnavailable(f"PostgreSQL at {where} is unavailable: {exc}", group=group, name=name)
        if isinstance(exc, ServerError):
            state = exc.sqlstate
            if state == "55P03":
                return LockTimeout(f"lock_timeout: {exc.message}", group=group, name=name)
            if state[:2] in ("08", "28", "3D", "53") or state[:3] == "57P" or exc.fatal:
                hint = (" (the server's lock table is full: raise max_locks_per_transaction)"
                        if state == "53200" else "")
                return EngineUnavailable(f"PostgreSQL at {where} is unavailable: {exc}{hint}", group=group, name=name)
            if state == "42501":
                return LockError(f"PostgreSQL at {where} refused: {exc} (the engine's role needs CREATE on the "
                                 f"schema for its tables {self.prefix}_*, and to signal backends for force_release)",
                                 group=group, name=name)
            return LockError(f"PostgreSQL at {where} failed: {exc}", group=group, name=name)
        return exc

    # -- the executors: each operation of the steps, blocking or awaited ---------------------------------

    def _do(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        if kind == "query":
            conn = op[1]
            ex = conn.pending = Exchange(query_io(conn.pg, self._sends(op[2])))
            try:
                result: Any = drive(ex, op[3])
            except BaseException as exc:
                self._failed(conn, exc)
                raise
            conn.pending = None
            conn.answered = True
            return result
        if kind == "open":
            return drive(self._open_io(), op[1])
        if kind == "wait":
            return op[1].wait(op[2])
        if kind == "claim":
            if not op[1].busy.acquire(timeout=max(0.0, op[2] - time.monotonic())):
                raise NoAnswer("the connection stayed busy")
            return None
        if kind == "notified":
            try:
                return drive(notified_io(op[1].pg), time.monotonic() + op[2])
            except NoAnswer:
                return False
        if kind in ("cancel", "finish"):
            return self._cancel(op[1], op[2], drive, kind == "cancel")
        time.sleep(op[1])                          # "sleep"
        return None

    async def _ado(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        if kind == "query":
            conn = op[1]
            ex = conn.pending = Exchange(query_io(conn.pg, self._sends(op[2])))
            try:
                result: Any = await adrive(ex, op[3])
            except asyncio.CancelledError:
                raise                              # the exchange stays pending: the steps cancel it
            except BaseException as exc:
                self._failed(conn, exc)
                raise
            conn.pending = None
            conn.answered = True
            return result
        if kind == "open":
            io = self._open_io()
            try:
                return await adrive(io, op[1])
            except BaseException:
                io.close()                         # closes a half-open connection
                raise
        if kind == "wait":
            return await op[1].await_(op[2])
        if kind == "claim":
            while not op[1].busy.acquire(blocking=False):     # the watchdog's heartbeat: short
                if time.monotonic() > op[2]:
                    raise NoAnswer("the connection stayed busy")
                await asyncio.sleep(0.001)
            return None
        if kind == "notified":
            try:
                return await adrive(notified_io(op[1].pg), time.monotonic() + op[2])
            except NoAnswer:
                return False
        if kind in ("cancel", "finish"):
            return await self._acancel(op[1], op[2], kind == "cancel")
        await asyncio.sleep(op[1])
        return None

    def _failed(self, conn: _Conn, exc: BaseException) -> None:
        """An exchange failed: decide whether the connection can still be used."""
        if isinstance(exc, NoAnswer):
            conn.cut = True
            conn.close()                           # in the middle of a message: useless
        elif isinstance(exc, Broken) or (isinstance(exc, ServerError) and (exc.fatal or exc.sqlstate in _GONE)):
            conn.close()
        elif isinstance(exc, ServerError):
            conn.pending = None                    # an error answer: the connection is fine
            conn.answered = True
        elif not isinstance(exc, Exception):
            conn.close()                           # interrupted (KeyboardInterrupt...)

    def _cancel(self, conn: _Conn, end: float, run: Callable[..., Any], cancel: bool = True) -> Any:
        """Cancel the exchange in flight on ``conn`` (unless ``cancel`` is False: only finish
        it) and read its outcome: its rows, or the error it ended with (never raised: the
        caller gives back whatever it holds)."""
        if conn.pending is None or conn.broken:
            return None
        try:
            if cancel:
                run(cancel_io(conn.pg), end)
            return run(conn.pending, end)
        except ServerError as exc:
            self._failed(conn, exc)
            return exc
        except BaseException as exc:
            self._failed(conn, exc if isinstance(exc, Exception) else NoAnswer())
            conn.close()
            return exc
        finally:
            conn.pending = None

    async def _acancel(self, conn: _Conn, end: float, cancel: bool = True) -> Any:
        if conn.pending is None or conn.broken:
            return None
        try:
            if cancel:
                await adrive(cancel_io(conn.pg), end)
            return await adrive(conn.pending, end)
        except ServerError as exc:
            self._failed(conn, exc)
            return exc
        except BaseException as exc:
            conn.close()
            return exc
        finally:
            conn.pending = None

    def _sends(self, items: Sequence[tuple[Any, ...]]) -> list[Callable[[Any], None]]:
        """How to send each (statement, params): prepared in session scope, else unnamed
        (what a pooler in transaction mode lets through)."""
        sends: list[Callable[[Any], None]] = []
        prepared = self.scope == "session"
        for item in items:
            name, params = item[0], (item[1] if len(item) > 1 else None)
            said = item[2] if len(item) > 2 else ""
            values = None if params is None else [None if p is None else p if isinstance(p, bytes) else _b(p)
                                                  for p in params]
            if prepared and name in _PREPARED and not said:
                sends.append(_send_prepared(f"ylock_{name}".encode(), values))
            else:
                text = self._texts.get(name) or name.encode()
                if said:
                    # What the owner is doing rides in a comment: pg_stat_activity shows the
                    # statement a session ran last, so describe() reads it from there (no write).
                    text = b"/* ylock:" + said.replace("*/", "*\\/").encode() + b" */ " + text
                sends.append(_send_params(text, values))
        return sends

    def _open_io(self) -> Any:
        """Connect and set the session up: its settings and prepared statements, in one
        pipeline (one round trip); the tables first, on the engine's first connection.
        Return a :class:`_Conn` ready for the pool."""
        pg = yield from connect_io(self.conninfo)
        pg.notice_handler = _ignore_notice
        try:
            if not self._ready:
                setup = self.sql.setup().encode()
                for attempt in range(3):
                    try:
                        yield from query_io(pg, [lambda pg: pg.send_query(setup)])
                        break
                    except ServerError as exc:
                        if exc.sqlstate not in _DUPLICATE or attempt == 2:
                            raise
                self._ready = True
            sends = [_send_params(self._who, None)]
            if self.scope == "session":
                sends += [_send_prepare(f"ylock_{name}".encode(), self._texts[name]) for name in _PREPARED]
            results = yield from query_io(pg, sends)
            pid, server_port, client_port, version = results[0][0][-4:]
            if int(version or 0) < 140000:
                raise ConfigurationError(f"PostgreSQL at {self.url_for_display()} is version {int(version or 0)}; "
                                         "ylock needs 14 or later", code=opt.E_ENGINE_URL)
            return _Conn(pg, int(pid or 0), _proxied(pg, server_port, client_port))
        except BaseException:
            pg.finish()
            raise

    # -- the pool -----------------------------------------------------------------------------------------

    def _checkout(self, deadline: float | None) -> Steps:
        """Take an idle connection, open one, or wait (FIFO) until another is given back."""
        while True:
            mailbox = None
            with self._mutex:
                while self._idle:
                    conn = self._idle.pop()
                    if not stale(conn.pg):
                        conn.reused, conn.answered = True, False
                        return conn
                    conn.close()
                    self._open -= 1
                if self._open < self.max_connections:
                    self._open += 1
                else:
                    mailbox = Mailbox()
                    self._slot_waiters.append(mailbox)
            if mailbox is not None:
                got = yield from self._wait_slot(mailbox, deadline)
                if got != _SLOT:
                    if not stale(got.pg):
                        got.reused, got.answered = True, False
                        return got
                    got.close()                # its slot is ours now
            try:
                conn = yield ("open", time.monotonic() + self.connect_timeout)
            except BaseException:
                self._free_slot()
                raise
            conn.answered = True
            return conn

    def _wait_slot(self, mailbox: Mailbox, deadline: float | None) -> Steps:
        got = None
        try:
            while got is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise EngineUnavailable(f"all {self.max_connections} connections of the PostgreSQL engine at "
                                            f"{self.url_for_display()} are in use (max_connections); none came "
                                            "back in time")
                got = yield ("wait", mailbox, left)
            return got
        finally:
            if got is None:
                with self._mutex:
                    with contextlib.suppress(ValueError):
                        self._slot_waiters.remove(mailbox)
                late = mailbox.take()
                if isinstance(late, _Conn):
                    self._checkin(late)
                elif late == _SLOT:
                    self._free_slot()

    def _free_slot(self) -> None:
        """A connection was closed: hand its slot to a waiter, else count it gone."""
        with self._mutex:
            if self._slot_waiters:
                self._slot_waiters.popleft().put(_SLOT)
                return
            self._open -= 1

    def _checkin(self, conn: _Conn) -> None:
        """Give a connection back (to a waiter, the idle pool, or closed)."""
        if conn.hold is not None:
            self._held.pop(conn.hold, None)
        conn.hold, conn.modes, conn.token, conn.key = None, set(), 0, 0
        if conn.busy.locked():
            with contextlib.suppress(RuntimeError):
                conn.busy.release()
        if conn.broken or conn.pending is not None or conn.listening:
            conn.close()
            self._free_slot()
            return
        with self._mutex:
            if self._slot_waiters:
                self._slot_waiters.popleft().put(conn)
                return
            if len(self._idle) < self.idle_connections:
                self._idle.append(conn)
                return
            self._open -= 1
        conn.close()

    def _discard(self, conn: _Conn) -> None:
        conn.close()
        self._checkin(conn)

    def _bind(self, conn: _Conn, hold: tuple[str, str, str, str], key: int, mode: str, token: int) -> None:
        conn.hold, conn.key, conn.modes, conn.token = hold, key, {mode}, token
        self._held[hold] = conn

    # -- acquiring --------------------------------------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        return run_steps(self._acquire_steps(r), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._translate(exc, r.group, r.name))

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        return await arun_steps(self._acquire_steps(r), self._ado,  # type: ignore[no-any-return]
                                lambda exc: self._translate(exc, r.group, r.name))

    def _acquire_steps(self, r: AcquireRequest) -> Steps:
        kind = SEMAPHORE if r.mode == PERMIT else LOCK
        hold = (r.group, r.name, r.owner, kind)
        bound = self._held.get(hold)
        if bound is not None:
            if r.mode == READ and bound.modes == {WRITE}:
                return (yield from self._downgrade_steps(bound, r))
            raise LockError(f"{r.owner} already holds {'/'.join(sorted(bound.modes))} here", group=r.group,
                            name=r.name)
        conn: _Conn | None = yield from self._checkout(r.deadline)
        assert conn is not None
        try:
            while True:
                try:
                    if kind == LOCK:
                        token, dirty = yield from self._lock_steps(conn, r, hold)
                    else:
                        token, dirty = yield from self._sem_steps(conn, r, hold)
                except EngineUnavailable:
                    if conn.reused and not conn.answered and conn.broken and not conn.cut:
                        # A pooled connection that died while idle (a server restart): once more
                        # on a new one.
                        self._checkin(conn)
                        conn = None
                        conn = yield from self._checkout(r.deadline)
                        continue
                    raise
                if token is None:
                    if dirty:                      # a wait that ended: the grant may have raced it
                        yield from self._give_back(conn, r, kind)
                    else:
                        self._checkin(conn)
                conn = None
                return token
        except GeneratorExit:
            if conn is not None:
                self._discard(conn)
            raise
        except Abandon:
            if conn is not None:
                yield ("cancel", conn, time.monotonic() + self.socket_timeout)
                yield from self._give_back(conn, r, kind)
            raise
        except BaseException:
            if conn is not None:
                if conn.pending is not None:
                    conn.close()
                yield from self._give_back(conn, r, kind)
            raise

    def _lease_ms(self, r: AcquireRequest) -> int:
        return max(1, min(_INT_MAX, int(r.lease * 1000)))

    def _wait_ms(self, deadline: float | None) -> int:
        if deadline is None:
            return 0
        left = int((deadline - time.monotonic()) * 1000 + 0.999)
        return 0 if left > _INT_MAX else max(1, left)

    def _begin(self) -> list[tuple[Any, ...]]:
        """Transaction scope: what opens a hold's transaction (sent with its first statement):
        the session settings, local to the transaction (a pooler's server connection is
        shared: nothing may outlive the hold on it)."""
        return [("BEGIN",), (f"SELECT {self._settings(local=True)}1",)]

    def _end(self, deadline: float | None) -> float | None:
        """The client's deadline of an exchange: the call's deadline plus one socket timeout."""
        return None if deadline is None else max(deadline, time.monotonic()) + self.socket_timeout

    def _lock_steps(self, conn: _Conn, r: AcquireRequest, hold: tuple[str, str, str, str]) -> Steps:
        key = advisory_key(self.prefix, LOCK, r.group, r.name)
        xact = self.scope == "transaction"
        shared = r.mode == READ
        if xact and key not in self._registered:
            yield ("query", conn, [("register", [key, r.group, r.name])], self._end(time.monotonic()))
            self._registered[key] = None
        args: list[Any] = [key, r.group, r.name, r.owner, self._lease_ms(r)]
        if r.deadline is not None and time.monotonic() >= r.deadline:
            items = [("try_s" if shared else "try_x", args, r.context)]
        else:
            items = [("wait_s" if shared else "wait_x", [*args, self._wait_ms(r.deadline)], r.context)]
        if xact:
            items = [*self._begin(), *items]
        try:
            results = yield ("query", conn, items, self._end(r.deadline))
        except LockTimeout:
            return None, True                      # lock_timeout: a grant may have raced it
        rows = results[-1]
        if not rows:
            if xact:
                yield ("query", conn, [("ROLLBACK",)], self._end(time.monotonic()))
            return None, False
        token, pid = int(rows[0][0] or 0), int(rows[0][1] or 0)
        self._check_session(conn, pid, r)
        self._bind(conn, hold, key, r.mode, token)
        return token, False

    def _check_session(self, conn: _Conn, pid: int, r: AcquireRequest) -> None:
        if pid != conn.pid and self.scope == "session":
            conn.close()
            raise ConfigurationError(
                f"the lock landed on another server session than its connection's ({pid}, not {conn.pid}): a pooler "
                f"in transaction mode is between ylock and PostgreSQL at {self.url_for_display()}; session locks "
                "break there (use ?scope=transaction, or connect to PostgreSQL directly)",
                code=opt.E_ENGINE_URL, group=r.group, name=r.name)

    def _downgrade_steps(self, conn: _Conn, r: AcquireRequest) -> Steps:
        """The write holder takes the read lock on its own connection: granted at once."""
        end = time.monotonic() + self.socket_timeout
        if not conn.busy.acquire(blocking=False):
            yield ("claim", conn, end)           # a heartbeat is on it: wait (one round trip at most)
        give = ("give", [conn.key, *_halves(conn.key), True, None])      # the read lock only
        try:
            try:
                yield ("query", conn, [("down", [conn.key, max(1, int(self.socket_timeout * 1000))], r.context)],
                       end)
            except LockTimeout:
                yield ("query", conn, [give], time.monotonic() + self.socket_timeout)
                return None
            except EngineUnavailable:
                if conn.broken:
                    return None                    # the write hold went with its connection
                raise
            except Abandon:
                # Cancelled: the statement is granted at once, so read its end and give the
                # read lock back (the write hold stays, on this connection).
                yield ("finish", conn, time.monotonic() + self.socket_timeout)
                if not conn.broken:
                    with contextlib.suppress(LockError, EngineUnavailable):
                        yield ("query", conn, [give], time.monotonic() + self.socket_timeout)
                raise
            conn.modes.add(READ)
            return conn.token
        finally:
            conn.busy.release()

    def _give_back(self, conn: _Conn, r: AcquireRequest, kind: str) -> Steps:
        """After a failed, timed-out or abandoned acquisition: release whatever the
        connection holds of this key (the grant can race with the failure), then pool it.
        A connection that cannot be cleaned is closed: the server drops its locks."""
        if conn.broken:
            self._discard(conn)
            return
        xact = self.scope == "transaction"
        if kind == LOCK:
            key = advisory_key(self.prefix, LOCK, r.group, r.name)
            items: list[tuple[Any, ...]] = [("give", [key, *_halves(key), r.mode == READ, self.app_name])]
        else:
            key = advisory_key(self.prefix, SEMAPHORE, r.group, r.name)
            queue = advisory_key(self.prefix, "queue", r.group, r.name)
            items = [("give", [key, *_halves(key), True, self.app_name]),
                     ("give", [queue, *_halves(queue), False, self.app_name])]
            if conn.listening:
                items.append(("UNLISTEN *",))
        if xact:
            items = [("ROLLBACK",), *items]
        for attempt in range(2):
            try:
                yield ("query", conn, items, time.monotonic() + self.socket_timeout)
                conn.listening = False
                break
            except (LockError, EngineUnavailable) as exc:
                # A cancel request that arrived late cancels the next statement: once more.
                if conn.broken or attempt or "57014" not in str(exc.__cause__ or ""):
                    conn.close()
                    break
        self._checkin(conn)

    # -- semaphores ---------------------------------------------------------------------------------------

    def _sem_steps(self, conn: _Conn, r: AcquireRequest, hold: tuple[str, str, str, str]) -> Steps:
        key = advisory_key(self.prefix, SEMAPHORE, r.group, r.name)
        queue = advisory_key(self.prefix, "queue", r.group, r.name)
        xact = self.scope == "transaction"
        if self._registered.get(key) != r.permits:
            yield ("query", conn, [("sem_register", [key, queue, r.group, r.name, r.permits])],
                   self._end(time.monotonic()))
            self._registered[key] = r.permits
        args: list[Any] = [queue, key, *_halves(key), r.permits, r.owner, self._lease_ms(r)]
        items: list[tuple[Any, ...]] = [("sem_try", args, r.context)]
        if xact:
            items = [*self._begin(), *items]
        results = yield ("query", conn, items, self._end(r.deadline))
        queued, token, pid = results[-1][0]
        if int(queued or 0) and token is None and r.deadline is not None and time.monotonic() >= r.deadline:
            return None, True                      # full, and no time to wait: give the queue back
        if not int(queued or 0) and token is None:
            if r.deadline is not None and time.monotonic() >= r.deadline:
                if xact:
                    yield ("query", conn, [("ROLLBACK",)], self._end(time.monotonic()))
                return None, False
            try:
                results = yield ("query", conn, [("sem_wait", [*args, self._wait_ms(r.deadline)], r.context)],
                                 self._end(r.deadline))
            except LockTimeout:
                return None, True
            queued, token, pid = results[-1][0]
        if token is None:
            # We are the head of the queue: admitted when a holder leaves (we hear its NOTIFY,
            # or find out at a poll: a holder that vanished notifies nobody).
            if not xact:
                yield ("query", conn, [(f'LISTEN "{_channel(key)}"',)], self._end(time.monotonic()))
                conn.listening = True
            intervals = r.polling.intervals()
            while True:
                results = yield ("query", conn, [("sem_admit", args, r.context)], self._end(time.monotonic()))
                queued, token, pid = results[-1][0]
                if token is not None:
                    break
                left = None if r.deadline is None else r.deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None, True              # the caller gives Q back
                wait = next(intervals) if left is None else min(next(intervals), left)
                if conn.listening:
                    yield ("notified", conn, wait)
                else:
                    yield ("sleep", wait)
        self._check_session(conn, int(pid or 0), r)
        conn.channel, conn.queue_key = _channel(key), queue
        self._bind(conn, hold, key, PERMIT, int(token))
        return int(token), False

    # -- releasing --------------------------------------------------------------------------------------

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        return run_steps(self._release_steps(group, name, owner, mode), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._translate(exc, group, name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return await arun_steps(self._release_steps(group, name, owner, mode),  # type: ignore[no-any-return]
                                self._ado, lambda exc: self._translate(exc, group, name))

    def _release_steps(self, group: str, name: str, owner: str, mode: str) -> Steps:
        kind = SEMAPHORE if mode == PERMIT else LOCK
        conn = self._held.get((group, name, owner, kind))
        if conn is None or mode not in conn.modes:
            return False
        end = time.monotonic() + self.socket_timeout
        last = len(conn.modes) == 1
        if not conn.busy.acquire(blocking=False):
            yield ("claim", conn, end)           # a heartbeat is on it: wait (one round trip at most)
        try:
            if conn.broken:
                return False
            items: list[tuple[Any, ...]]
            if self.scope == "transaction":
                if not last:
                    return True                    # a transaction lock is released with the others
                items = [("SELECT pg_notify($1, '')", [conn.channel])] if kind == SEMAPHORE else []
                items.append(("COMMIT",))
            elif kind == SEMAPHORE:
                items = [("sem_rel", [conn.key, conn.channel, self.app_name])]
            else:
                items = [("rel", [conn.key, mode == READ, last, self.app_name])]
            if conn.listening and last:
                items.append(("UNLISTEN *",))
            try:
                results = yield ("query", conn, items, end)
            except EngineUnavailable:
                if conn.cut:
                    raise                          # no answer: we closed it; the server frees the lock on noticing
                return False                       # the server had ended the session: the lock was gone
            conn.listening = False
            return self.scope == "transaction" or results[0][0][0] == b"t"
        finally:
            conn.modes.discard(mode)
            if last or conn.broken:
                self._checkin(conn)
            else:
                conn.busy.release()

    # -- the lease: heartbeats --------------------------------------------------------------------------

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        """Send one heartbeat on each hold's connection, all at once, and wait for them
        together (one round trip's time for any number of holds). A heartbeat is a bare Sync
        message: it resets the session's idle timer (the lease) and proves the session alive,
        and leaves what ``pg_stat_activity`` shows of it alone."""
        results: list[bool | None] = [None] * len(items)
        conns: dict[int, _Conn] = {}
        index: list[tuple[int, int]] = []
        for i, item in enumerate(items):
            conn = self._held.get((item.group, item.name, item.owner, SEMAPHORE if item.mode == PERMIT else LOCK))
            if conn is None or item.mode not in conn.modes or conn.broken:
                results[i] = False
                continue
            if id(conn) not in conns:
                if not conn.busy.acquire(blocking=False):
                    continue                       # its owner is using it: it is alive
                conns[id(conn)] = conn
            index.append((i, id(conn)))
        outcomes = drive_many({cid: query_io(c.pg, []) for cid, c in conns.items()},
                              time.monotonic() + self.socket_timeout)
        for cid, conn in conns.items():
            outcome = outcomes.get(cid)
            if isinstance(outcome, BaseException):
                self._failed(conn, outcome)
                conn.close()                       # its session is gone or unanswering: the hold with it
                logger.info("ylock: heartbeat of %s failed: %s", conn.hold, outcome)
            conn.busy.release()
        for i, cid in index:
            results[i] = not conns[cid].broken
        return results

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _utility(self, items: Sequence[tuple[Any, ...]], group: str | None = None, name: str | None = None) -> Any:
        def steps() -> Steps:
            conn = yield from self._checkout(time.monotonic() + self.socket_timeout)
            try:
                results = yield ("query", conn, items, time.monotonic() + self.socket_timeout)
            except BaseException:
                self._checkin(conn)
                raise
            self._checkin(conn)
            return results
        return run_steps(steps(), self._do, lambda exc: self._translate(exc, group, name))

    def ping(self) -> None:
        self._utility([("ping",)])

    def describe(self, group: str | None = None) -> list[LockInfo]:
        rows = self._utility([(self.sql.describe(), [group])], group)[0]
        locks: dict[tuple[str, str, str], dict[str, Any]] = {}
        queues: dict[tuple[str, str], list[tuple[str, bool, _Who]]] = collections.defaultdict(list)
        for kind_b, grp_b, name_b, permits, mode_b, granted, app, pid, query, since in rows:
            kind, grp, name = kind_b.decode(), grp_b.decode(), name_b.decode()
            row = (mode_b.decode(), granted == b"t", _who(app, pid, query, since))
            if kind == "queue":
                queues[(grp, name)].append(row)
                continue
            entry = locks.setdefault((grp, name, kind), {"rows": [], "permits": permits})
            entry["rows"].append(row)
        for grp, name in queues:
            locks.setdefault((grp, name, SEMAPHORE), {"rows": [], "permits": None})
        infos = []
        for (grp, name, kind), entry in sorted(locks.items()):
            holders = [(m, w) for m, g, w in entry["rows"] if g]
            waiting = [(m, w) for m, g, w in entry["rows"] if not g]
            owners: list[str] = []
            for _, who in holders:
                if who.owner not in owners:
                    owners.append(who.owner)
            token = max((w.token for _, w in holders if w.token is not None), default=None)
            if kind == SEMAPHORE:
                q = queues.get((grp, name), [])
                line = [w for _, g, w in q if g and w.owner not in owners] + [w for _, g, w in q if not g]
                everyone = [w for _, w in holders] + line
                infos.append(LockInfo(grp, name, PERMIT if owners else None, tuple(owners),
                                      tuple(f"permit:{w.owner}" for w in line), None, token, SEMAPHORE,
                                      None if entry["permits"] is None else int(entry["permits"]),
                                      _contexts(everyone)))
                continue
            mode = WRITE if any(m == "ExclusiveLock" for m, _ in holders) else READ if holders else None
            infos.append(LockInfo(grp, name, mode, tuple(owners),
                                  tuple(f"{WRITE if m == 'ExclusiveLock' else READ}:{w.owner}" for m, w in waiting),
                                  None, token, LOCK, None, _contexts([w for _, w in holders + waiting])))
        return infos

    # -- holds that change hands ------------------------------------------------------------------

    #: A hold lives in its connection's server session: only this process can take it over.
    adopts_across_processes = False

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Hand the connection that carries ``old_owner``'s hold to ``new_owner`` (its
        application name says who holds it). A detached hold is not renewed: once its lease
        has passed, the server has ended its session and this returns False."""
        kind = SEMAPHORE if mode == PERMIT else LOCK
        with self._mutex:
            conn = self._held.get((group, name, old_owner, kind))
            if conn is None or mode not in conn.modes or conn.token != token:
                return False
            del self._held[(group, name, old_owner, kind)]

        def steps() -> Steps:
            end = time.monotonic() + self.socket_timeout
            yield ("claim", conn, end)
            try:
                yield ("query", conn, [("SELECT set_config('application_name', $1, false)",
                                        [f"{token}:{new_owner}"])], end)
            except (EngineUnavailable, LockError):
                self._checkin(conn)                # its session ended: the hold with it
                return False
            conn.hold = (group, name, new_owner, kind)
            self._held[conn.hold] = conn
            conn.busy.release()
            return True
        return run_steps(steps(), self._do, lambda exc: self._translate(exc, group, name))  # type: ignore[no-any-return]

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        key = advisory_key(self.prefix, SEMAPHORE if kind == SEMAPHORE else LOCK, group, name)
        wait_ms = max(1, int(self.socket_timeout * 500))
        items: list[tuple[Any, ...]] = [(self.sql.terminate(), [*_halves(key), wait_ms])]
        if kind == SEMAPHORE:
            items.append(("SELECT pg_notify($1, '')", [_channel(key)]))
        rows = self._utility(items, group, name)[0]
        return bool(rows)

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        self._utility([(self.sql.publish_stats(), [process, ttl, data.hex()])])

    def read_stats(self) -> dict[str, bytes]:
        rows = self._utility([(self.sql.prune_stats(),), (self.sql.read_stats(),)])[1]
        return {p.decode(): bytes.fromhex(d.decode()) for p, d in rows}

    def detect_pooler(self) -> str | None:
        """Look for a connection pooler between this engine and PostgreSQL that would break
        session locks; return what was found (a sentence for a warning), or None.

        Connects (use it from deployment checks, not on every request). Two signs: the ports
        that the server sees differ from ours (a proxy of some kind: a TCP proxy or a pooler
        in session mode is harmless), and two client connections served by the same server
        backend (a pooler in transaction or statement mode: certain, when the pooler is
        quiet enough to hand the second the backend the first just used, as pgbouncer does).
        Under a pooler in transaction mode a session advisory lock stays on the backend that
        took it, the unlock may run on another backend (and fail), and a client that gets
        the holder's backend next re-enters the lock: two holders. Transaction scope works
        there."""
        def steps() -> Steps:
            a = yield from self._checkout(time.monotonic() + self.connect_timeout)
            b = None
            try:
                b = yield from self._checkout(time.monotonic() + self.connect_timeout)
                end = time.monotonic() + self.socket_timeout
                pa = (yield ("query", a, [("SELECT pg_backend_pid()",)], end))[0][0][0]
                pb = (yield ("query", b, [("SELECT pg_backend_pid()",)], end))[0][0][0]
                return a.proxied or b.proxied, pa == pb
            finally:
                for conn in (a, b):
                    if conn is not None:
                        conn.close()          # not pooled: a pooler's backends are shared
                        self._checkin(conn)
        proxied, shared = run_steps(steps(), self._do, self._translate)
        where = self.url_for_display()
        if shared:
            if self.scope == "transaction":
                return None
            return (f"a connection pooler in transaction (or statement) mode serves the PostgreSQL engine at {where}: "
                    "two of its connections ran on one server backend. Session advisory locks break there (an "
                    "unlock may run on another backend, another client may re-enter the holder's lock): use "
                    "?scope=transaction or connect to PostgreSQL directly")
        if proxied and self.scope == "session" and self.pooler != "session":
            return (f"a proxy stands between the PostgreSQL engine at {where} and the server (the server sees other "
                    "ports than the client); if it is a pooler in transaction mode, session locks break: make sure "
                    "it keeps sessions (pgbouncer pool_mode=session; a TCP proxy does), then set ?pooler=session, "
                    "or use ?scope=transaction")
        return None

    # -- life cycle ---------------------------------------------------------------------------------------

    def check_options(self) -> None:
        """Everything was checked when the engine was built (libpq parsed the URL)."""

    def close(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
            held = list({id(c): c for c in self._held.values()}.values())
            self._held.clear()
            self._open -= len(idle) + len(held)
        for conn in idle:
            conn.close()
        for conn in held:
            conn.close()
        if held:
            HOLDS.mark_lost(self, detail="the engine was closed: its lock connections with it")

    def _after_fork(self) -> None:
        # The parent's connections are not ours (psycopg does not close a PGconn collected
        # in another process than the one that made it): forget them.
        self._reset_state()


def _send_prepared(name: bytes, values: list[bytes | None] | None) -> Callable[[Any], None]:
    return lambda pg: pg.send_query_prepared(name, values)


def _send_params(text: bytes, values: list[bytes | None] | None) -> Callable[[Any], None]:
    return lambda pg: pg.send_query_params(text, values)


def _send_prepare(name: bytes, text: bytes) -> Callable[[Any], None]:
    return lambda pg: pg.send_prepare(name, text)


def _ignore_notice(result: Any) -> None:
    """Notices (an unlock of what was not held, in a give-back) are expected: not printed."""


def _channel(key: int) -> str:
    return f"ylock_{key & _MASK:016x}"


class _Who(NamedTuple):
    """A holder or waiter as ``describe`` finds it: its token and owner (from its
    connection's application name ``token:owner``, a waiter's ``:owner``), what it said it
    is doing (the comment of the statement it ran last) and since when (that statement's
    start: when it queued, or took the lock without waiting)."""

    token: int | None
    owner: str
    said: str | None
    since: float | None


def _who(app: bytes | None, pid: bytes | None, query: bytes | None, since: bytes | None) -> _Who:
    text = (app or b"").decode("utf-8", "replace")
    token, sep, owner = text.partition(":")
    if not sep or not (token.isdigit() or token == ""):
        token, owner = "", f"pid:{(pid or b'?').decode()}"
    said = None
    statement = (query or b"").decode("utf-8", "replace")
    if statement.startswith("/* ylock:") and " */" in statement:
        said = statement[9:statement.index(" */")]
    return _Who(int(token) if token else None, owner, said, float(since) if since else None)


def _contexts(people: Sequence[_Who]) -> dict[str, dict[str, Any]]:
    return {w.owner: holder_context(w.owner, w.since, w.said) for w in people}


def _proxied(pg: Any, server_port: bytes | None, client_port: bytes | None) -> bool:
    """Whether the server sees other ports than ours: a proxy in between."""
    if server_port is None or client_port is None:
        return False                               # a unix socket
    try:
        with socket.socket(fileno=os.dup(pg.socket)) as sock:
            local, remote = sock.getsockname(), sock.getpeername()
    except OSError:
        return False
    return int(server_port) != int(remote[1]) or int(client_port) != int(local[1])
