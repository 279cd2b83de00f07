"""The PostgreSQL engine: locks and semaphores on advisory locks, through psycopg 3's libpq
(``pip install 'ylock[postgres]'``; PostgreSQL 14 or later, for ``idle_session_timeout`` and
``pg_locks.waitstart``).

URL (libpq's, as psycopg takes it)::

    postgresql://[user:password@]host:5432/dbname[?options]      (also postgres://)

Options (query parameters or keyword arguments): ``scope`` (``session``, the default, or
``transaction``), ``max_connections`` (10: connections this engine may open in this
process), ``idle_connections`` (2: how many it keeps open while unused), ``socket_timeout``
(2 s: the longest a frozen or unreachable server can stall a call past its own deadline),
``connect_timeout`` (2 s), ``keepalive`` (10 s: how soon the server notices a holder's
machine or network gone, and we notice the server's), ``prefix`` (``ylock``: of the tables,
and mixed into the keys), ``pooler`` (``check``; ``session``: a proxy in between keeps
sessions). Any other query parameter is a libpq connection parameter (``sslmode``,
``application_name``...); one libpq does not know is a :class:`~ylock.ConfigurationError`
naming it. ``django://ALIAS`` builds the same engine from ``DATABASES[ALIAS]``
(:mod:`django_ylock.database`).

**Modes.** A lock is one 64-bit advisory key (a keyed hash of group and name): write =
``pg_advisory_lock``, read = ``pg_advisory_lock_shared``. The server lock is taken once per
owner and mode (reentrancy is the facade's). A write holder's read lock (a downgrade) is
granted at once even behind queued writers; when it then releases the write lock, queued
readers enter and queued writers still wait. Two names whose keys collide (about one
chance in 10^7 among a million names) are one lock: never less exclusion, and ``describe``
shows both.

**Fairness** is the server's queue, always: FIFO, with a run of queued shared requests
granted together; even ``pg_try_advisory_lock_shared`` fails behind a queued writer. So
``fair=False`` is served fairly too.

**The lease.** A hold's connection runs with ``idle_session_timeout`` = the lock's lease,
and the watchdog sends a heartbeat (a bare Sync message, all holds in one wait) every
lease/3. A holder that stops (SIGSTOP, a GC pause, a frozen machine) is ended by the server
after its lease, and learns it at its next heartbeat or release. A holder that dies frees
its locks when the server sees its connection close: at once when the process dies; about
``keepalive`` seconds, or its lease if shorter, when its machine or network vanishes
(server-side ``tcp_keepalives_*`` and ``tcp_user_timeout``). A waiter that dies leaves the
queue within a second (``client_connection_check_interval``); one that freezes keeps its
place until granted, and loses the lock a lease later. Measured (tests/postgres): a
SIGKILLed holder's lock is taken over in about 15 ms, a SIGSTOPped one's after its lease
(1.00 s for a 1 s lease, both scopes), a cut-off one's after its lease (2.0 s for 2 s).

**Fencing.** The acquiring statement draws the token (``nextval`` of ``<prefix>_fence``)
after the grant, in the same round trip. Tokens increase across all names. A sequence
WAL-logs a value 32 ahead of the one it hands out (once per 32 values, and at the first
``nextval`` after a checkpoint); after a crash, or on a promoted replica, it continues past
the last logged value it has, so a token never repeats if the WAL record that covers it
was flushed (crash) or had reached the replica (promotion). In session scope the
acquisition that writes that record commits it before its token is returned, with
``synchronous_commit=on`` (flushed, and waited for by synchronous standbys): tokens do not
repeat after a crash, nor after a promotion of a synchronous standby; after a promotion of
an asynchronous one, the tokens drawn in the replication lag can. In transaction scope the
record is committed with the hold, at its release: a crash or a failover during a hold
can hand its token again. A promotion ends every hold (advisory locks live in the old
primary's memory); holders learn it at their next heartbeat.

**Transaction scope** (``?scope=transaction``): each hold is a transaction on its lock
connection, ``BEGIN`` + ``pg_advisory_xact_lock`` in one round trip, released by ``COMMIT``;
the lease is ``idle_in_transaction_session_timeout``. It works through a pooler in
transaction mode, where every setting it makes is local to the hold's transaction (nothing
stays on a pooled server session). A session-scope engine refuses such a pooler: a
:class:`~ylock.ConfigurationError` at its first connection, before it sets or locks
anything (:mod:`~ylock.engines.postgres.poolers`); behind a pooler in session mode it works,
and says ``DISCARD ALL`` before it closes a connection. Differences: a downgraded hold
stays exclusive until its read lock is released too (a transaction lock cannot be released
alone), a semaphore's head waiter polls instead of being notified, and each hold keeps a
transaction open (do not hold for hours: it holds back vacuum if it drew a new sequence
page). Django's ``@locked(on_commit=True)`` releases after the view's transaction commits,
whatever the scope; in transaction scope that release is the lock transaction's ``COMMIT``.

**What holders are doing** (``ylock.context``, ``LockInfo.context``): an acquisition that
says it sends its statement unprepared with the JSON in a leading comment; ``describe``
reads it back from ``pg_stat_activity.query`` (heartbeats leave it alone) and "since" from
``query_start``. Nothing is written. Other roles see it only with ``pg_read_all_stats``.

**force_release** ends the sessions that hold the lock (``pg_terminate_backend``, waiting
for them to exit): queued waiters then get it in order; each terminated holder loses only
this lock (a connection carries one lock's holds) and learns it at its next heartbeat. The
engine's role must be allowed to signal those backends (the same role, or
``pg_signal_backend``).

**Tickets** (``detach``/``adopt``): a hold lives in its connection's session, so only the
process that detached it can adopt it (``adopts_across_processes = False``). Nobody renews a
detached hold: after its lease the server ends the session, and adopting raises ``LockLost``.

**Semaphores**: the holders hold the semaphore's key shared (``pg_locks`` counts them); its
waiters queue for a second key exclusively (FIFO); the head is admitted when fewer than
``permits`` hold, and waits for a ``NOTIFY`` from a release meanwhile (polling stays the
fallback: a holder that vanished notifies nobody).

**Server resources.** Each connection holds at most two advisory keys, so a process takes
at most 2 × ``max_connections`` entries of the server's shared lock table (sized
``max_locks_per_transaction`` × ``max_connections``; when it is full, new connections fail too).

The modules, by concern: :mod:`~.engine` (the engine protocol, options, error
translation), :mod:`~.steps` (acquire, downgrade, release, give back: generators of
:mod:`~.ops` operations), :mod:`~.executor` (does them, blocking or awaited),
:mod:`~.connection` (one connection, its settings), :mod:`~.wire` (libpq without blocking,
with deadlines), :mod:`~.sql` (the statements and keys), :mod:`~.inspection` (describe),
:mod:`~.poolers` (poolers and proxies in between). The pool of connections, the held table
and the heartbeats, and the frames of the engine, its steps and its executor, are the
session engines' (:mod:`ylock.engines.sessions`), shared with the MySQL engine.
"""
from __future__ import annotations

from ylock.engines.postgres.engine import PostgresEngine
from ylock.engines.postgres.sql import advisory_key

__all__ = ["PostgresEngine", "advisory_key"]
