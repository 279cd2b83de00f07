"""The MySQL engine: locks and semaphores on MySQL 8 and MariaDB 10.6+, through PyMySQL
(``pip install 'ylock[mysql]'``).

URL::

    mysql://user:password@host:3306/database[?options]      (also mariadb://)

The password may be percent-encoded; it never shows in an error, a log line or ``repr``.
Options (query parameters or keyword arguments): ``max_connections`` (10: connections this
engine may open in this process), ``idle_connections`` (2: kept open while unused),
``socket_timeout`` (2 s: the longest a frozen or unreachable server can stall a call past
its own deadline), ``connect_timeout`` (2 s), ``keepalive`` (10 s: TCP keepalive, how soon
a waiter notices the server's machine gone), ``prefix`` (``ylock``: of the tables and the
``GET_LOCK`` names), ``proxy`` (``check``; ``session``: a proxy in between keeps each client
on one server connection). TLS and the socket are PyMySQL's options: ``ssl_ca``,
``ssl_cert``, ``ssl_key``, ``ssl_key_password``, ``ssl_verify_cert``, ``ssl_verify_identity``,
``ssl_disabled``, ``unix_socket``; any other is a :class:`~ylock.ConfigurationError` naming it.
``django://ALIAS`` builds the same engine from a MySQL or MariaDB ``DATABASES`` entry.

**Locks.** ``GET_LOCK`` is exclusive only, and it is the only lock of the server that is
queued FIFO, bounded by a timeout, released when its session ends and free of
transactions. So each lock is a *turnstile*: the ``GET_LOCK`` name ``<prefix>.x.<key>``
(a keyed hash of database, group and name: names of any length fit in 64 characters).
Every acquisition queues for it in the server; a writer keeps it for its whole hold, a
reader only while it enters. Each hold also takes a ``GET_LOCK`` of its own (its *mark*,
a random name) and writes a row in ``<prefix>_holds``. A writer that gets the turnstile and
finds readers' rows waits for their marks (``GET_LOCK`` on each: woken when the reader
releases or its session ends), still holding the turnstile, so nobody enters behind it. A
reader queued behind a writer waits behind it (fair); a run of queued readers enters one
after another as soon as the writer leaves, each in its own round trip but without waiting
for the others. ``fair=False`` is served fairly too. A downgrade needs no round trip: the
writer's turnstile keeps everyone out; at its write release its row becomes a reader's and
the turnstile opens (queued readers enter, the next writer waits for its mark). Costs: an
uncontended acquisition is one round trip of four short statements (a writer: six), one row inserted
(a commit) and one deleted at release; each hold keeps one connection.

**Semaphores**: the queue is ``GET_LOCK(<prefix>.q.<key>)``; its head is admitted when fewer
than ``permits`` live rows hold the semaphore, else it waits for the oldest holder's mark
(a release wakes it at once; another holder's release is seen at its next poll).

**The lease.** A hold's session runs with ``wait_timeout`` = the lease, rounded up to whole
seconds, and the watchdog pings it (``COM_PING``, all holds in one wait) every lease/3. A
holder that stops (SIGSTOP, a GC pause) is disconnected by the server after its lease, which
drops its locks, and learns it at its next ping or release. A holder that dies frees its
locks when the server sees its connection close (at once for a killed process); a waiter
that dies leaves the queue within about a second (the server notices the closed socket).
A cancelled asyncio wait has its session killed (``KILL`` from another connection) at once.

**Fencing.** The token is the hold row's ``AUTO_INCREMENT`` id, drawn when the row is
written, after the grant; the turnstile orders the grants, so tokens increase with them,
across all names. InnoDB persists the counter (redo-logged when it changes; MySQL 8.0 and
MariaDB 10.2.4 on): a token is never handed out twice across a restart or crash when the
acquisition's commit reached the log (``innodb_flush_log_at_trx_commit=1``, the default;
with 2, across a server crash but not an OS crash). Across a replica promotion: a replica
that applied the acquisitions' inserts continues above their ids, so tokens do not repeat
when every acquisition had reached the promoted replica (semi-synchronous replication with
``rpl_semi_sync_master_wait_point=AFTER_SYNC``, and the failover applies its relay log
before it takes writes); with asynchronous replication the tokens drawn in the lag can.
A promotion ends every hold (``GET_LOCK`` lives in the old primary's memory).

**What holders are doing** (``ylock.context``): stored in their rows; waiters' rides in
the leading comment of their waiting statement, which ``describe`` reads from the process
list.

**force_release** kills the holders' sessions (``KILL``): queued waiters get the lock in
order; each killed holder loses only this lock and learns it at its next heartbeat.

**Tickets** (``detach``/``adopt``): a hold lives in its connection's session, so only the
process that detached it can adopt it. Nobody renews a detached hold: after its lease the
server ends the session, and adopting raises ``LockLost``.

**What MySQL refuses, and the engine says**: a read-only server (a replica:
``read_only``) is a :class:`~ylock.ConfigurationError` at the first connection; too many
connections (``max_connections``, ``max_user_connections``) an :class:`~ylock.EngineUnavailable`
naming the setting; a proxy that multiplexes client sessions (ProxySQL with multiplexing, a
pooler in transaction mode) is found on the first connection that goes through something
and refused (:mod:`~.proxies`; Django's W004 warns at ``check --deploy``).

The modules, by concern: :mod:`~.engine` (the engine protocol, options, error translation),
:mod:`~.steps` (acquire, release, give back: generators of :mod:`~.ops` operations),
:mod:`~.executor` (does them, blocking or awaited; opens connections), :mod:`~.connection`
(URL, handshake, one connection), :mod:`~.wire` (the protocol without blocking, with
deadlines), :mod:`~.sql` (the statements and names), :mod:`~.inspection` (describe),
:mod:`~.proxies`. The pool of connections, the held table and the heartbeats, and the frames
of the engine, its steps and its executor, are the session engines'
(:mod:`ylock.engines.sessions`), shared with the PostgreSQL engine.
"""
from __future__ import annotations

from ylock.engines.mysql.engine import MySQLEngine
from ylock.engines.mysql.sql import lock_key

__all__ = ["MySQLEngine", "lock_key"]
