"""What the PostgreSQL engine says to the server: its statements, each opening with its
contract (parameters, $n, all sent as text; what it returns; why it is written that way),
and the names it gives things there (advisory keys, notification channels).

Two scopes (see :mod:`ylock.engines.postgres`): ``session`` statements take session-level
advisory locks and are prepared once per connection; ``transaction`` statements take
transaction-level ones (``pg_advisory_xact_*``) inside a ``BEGIN`` sent in the same
pipeline, and are sent unprepared (a pooler in transaction mode may move prepared
statements' sessions). Table names carry the engine's ``prefix``.

Ordering inside one statement is never left to the evaluation order of a target list:
each step is a ``MATERIALIZED`` CTE that reads the one before it, so ``nextval`` runs
after the grant (the token is drawn by the holder, never by a waiter), and
``lock_timeout`` is set before the wait starts. ``set_config(..., false)`` in a
statement that fails is undone with it (GUC changes roll back with the transaction).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

#: All 64 bits of an advisory key, unsigned.
MASK = (1 << 64) - 1


def advisory_key(prefix: str, kind: str, group: str, name: str) -> int:
    """Return the signed 64-bit advisory key of a lock (``kind`` "lock"), a semaphore's
    holders ("semaphore") or its queue ("queue")."""
    digest = hashlib.blake2b(f"{kind}\0{group}\0{name}".encode(), digest_size=8,
                             key=prefix.encode()[:64]).digest()
    return int.from_bytes(digest, "big", signed=True)


def halves(key: int) -> tuple[bytes, bytes]:
    """Return pg_locks' (classid, objid) of a bigint key, as text."""
    unsigned = key & MASK
    return str(unsigned >> 32).encode(), str(unsigned & 0xFFFFFFFF).encode()


def channel(key: int) -> str:
    """Return the LISTEN/NOTIFY channel of a semaphore (``key``: its holders' key)."""
    return f"ylock_{key & MASK:016x}"


#: Created on first use (``IF NOT EXISTS``; a race between two first uses is retried).
#: ``{names}``: which lock (or semaphore) a 64-bit advisory key stands for, so that
#: ``describe()`` can name what ``pg_locks`` shows; one row per name ever used (about 100
#: bytes), written once (``ON CONFLICT DO NOTHING`` writes nothing for a name it has).
#: ``permits``: a semaphore's count as last asked for. ``{fence}``: the fencing tokens (one
#: sequence: tokens increase across all names, so per name too; a sequence writes WAL once
#: per 32 values and never goes back after a crash). ``{stats}``: each process's statistics
#: for the command lines (unlogged: nothing to keep across a crash).
SETUP = """
CREATE SEQUENCE IF NOT EXISTS {fence};
CREATE TABLE IF NOT EXISTS {names} (
    key bigint NOT NULL, kind text NOT NULL, grp text NOT NULL, name text NOT NULL, permits integer,
    PRIMARY KEY (key, grp, name, kind));
CREATE UNLOGGED TABLE IF NOT EXISTS {stats} (
    process text PRIMARY KEY, until timestamptz NOT NULL, data bytea NOT NULL);
"""

#: The connection's identity: its backend, and the ports seen from both ends (a mismatch
#: means a proxy between us and the server, see ``detect_pooler``). Session scope puts the
#: session's settings (set_config calls) in front of it.
WHO = ("pg_backend_pid(), inet_server_port(), inet_client_port(), "
       "current_setting('server_version_num')::int")

_DB = "(SELECT oid FROM pg_database WHERE datname = current_database())"

_REGISTER = "n AS (INSERT INTO {names} (key, kind, grp, name) VALUES ($1, 'lock', $2, $3) ON CONFLICT DO NOTHING)"

_GRANTED = ("SELECT token, pg_backend_pid(), set_config('application_name', token || ':' || $4, {local}), "
            "set_config('{idle}', $5, {local}) FROM t")


@dataclass(frozen=True)
class Statements:
    """Every statement of one engine (its prefix and scope), as text."""

    prefix: str
    scope: str

    @property
    def xact(self) -> bool:
        return self.scope == "transaction"

    def _fill(self, sql: str) -> str:
        local = "true" if self.xact else "false"
        idle = "idle_in_transaction_session_timeout" if self.xact else "idle_session_timeout"
        return (sql.replace("{names}", f"{self.prefix}_names").replace("{fence}", f"{self.prefix}_fence")
                .replace("{stats}", f"{self.prefix}_stats").replace("{local}", local).replace("{idle}", idle)
                .replace("{xact_}", "xact_" if self.xact else ""))

    def setup(self) -> str:
        return self._fill(SETUP)

    def lock_try(self, shared: bool) -> str:
        """Try once. $1 key, $2 group, $3 name, $4 owner, $5 lease (ms).
        Returns (token, backend pid, ...) when granted, no row when not. A try respects the
        server's queue: it fails while anyone waits, so it never barges."""
        fn = f"pg_try_advisory_{{xact_}}lock{'_shared' if shared else ''}"
        return self._fill(f"WITH {_REGISTER}, l AS MATERIALIZED (SELECT 1 WHERE {fn}($1)), "
                          f"t AS MATERIALIZED (SELECT nextval('{{fence}}') AS token FROM l) {_GRANTED}")

    def lock_wait(self, shared: bool) -> str:
        """Wait in the server's FIFO queue. $1-$5 as :meth:`lock_try`, $6 lock_timeout (ms;
        0: forever). Returns one row, or fails with 55P03 when lock_timeout fires. The
        application name says who waits (for ``describe``) while it waits."""
        fn = f"pg_advisory_{{xact_}}lock{'_shared' if shared else ''}"
        return self._fill(
            f"WITH {_REGISTER}, s AS MATERIALIZED (SELECT set_config('lock_timeout', $6, true), "
            f"set_config('application_name', ':' || $4, {{local}})), "
            f"l AS MATERIALIZED (SELECT {fn}($1) FROM s), "
            f"t AS MATERIALIZED (SELECT nextval('{{fence}}') AS token FROM l) {_GRANTED}")

    def downgrade(self) -> str:
        """A write holder takes the read lock too. $1 key, $2 lock_timeout (ms). A backend
        that holds a lock conflicting with a queued request is put ahead of it, so this is
        granted at once even behind queued writers; the write release that follows lets the
        queued readers in and keeps the queued writers out."""
        return self._fill("WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', $2, true)), "
                          "l AS MATERIALIZED (SELECT pg_advisory_{xact_}lock_shared($1) FROM s) SELECT 1 FROM l")

    def release(self) -> str:
        """Session scope: release one mode. $1 key, $2 shared (bool), $3 last (bool: the
        connection goes back to the pool, so its lease and name are reset), $4 the
        connection's own application name. Returns (true if this session held it, ...)."""
        return ("SELECT CASE WHEN $2::bool THEN pg_advisory_unlock_shared($1) ELSE pg_advisory_unlock($1) END, "
                "CASE WHEN $3::bool THEN set_config('idle_session_timeout', '0', false) END, "
                "CASE WHEN $3::bool THEN set_config('application_name', $4, false) END")

    def give_back(self) -> str:
        """After a failed or abandoned acquisition: release what this session holds of key $1
        in the mode $4 (shared, bool), and reset the connection ($5: its own application
        name; NULL: the connection keeps holding other locks, change nothing). $2, $3: the
        key's halves as pg_locks shows them. Checked first, so that nothing
        is unlocked that is not held (the unlock would warn in the server's log). Returns
        (true if it was held: the grant raced with the failure, ...). In transaction scope the
        settings are local (a pooler's server session is not ours to change: after the
        ROLLBACK that precedes it, they die with the statement)."""
        return self._fill(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
                "AND granted AND pid = pg_backend_pid() AND classid = $2::oid AND objid = $3::oid "
                "AND mode = CASE WHEN $4::bool THEN 'ShareLock' ELSE 'ExclusiveLock' END) "
                "THEN CASE WHEN $4::bool THEN pg_advisory_unlock_shared($1) ELSE pg_advisory_unlock($1) END "
                "ELSE false END, set_config('idle_session_timeout', CASE WHEN $5::text IS NULL THEN "
                "current_setting('idle_session_timeout') ELSE '0' END, {local}), "
                "set_config('application_name', coalesce($5, current_setting('application_name')), {local})")

    # -- semaphores ------------------------------------------------------------------------
    #
    # A semaphore is two advisory keys: its holders hold H shared (so pg_locks counts them),
    # and its waiters queue for Q exclusively (the server's FIFO). Only the holder of Q -- the
    # head of the queue -- is admitted, when fewer than ``permits`` hold H; it then takes H,
    # draws its token and lets go of Q in the same statement. A head that finds the
    # semaphore full LISTENs on the semaphore's channel; every release NOTIFYs it.

    def _admit(self, queue: str) -> str:
        # $1 Q, $2 H, $3 H's high 32 bits, $4 its low 32 bits (pg_locks' classid, objid),
        # $5 permits, $6 owner, $7 lease (ms). Returns (holds Q, token or NULL, pid).
        counted = (f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
                   f"AND mode = 'ShareLock' AND classid = $3::oid AND objid = $4::oid AND database = {_DB}")
        hold = "pg_advisory_{xact_}lock_shared"
        return self._fill(
            f"WITH {queue}, c AS MATERIALIZED (SELECT ({counted}) AS held FROM q), "
            f"h AS MATERIALIZED (SELECT {hold}($2) FROM c WHERE held < $5::int), "
            f"t AS MATERIALIZED (SELECT nextval('{{fence}}') AS token FROM h), "
            f"u AS MATERIALIZED (SELECT pg_advisory_unlock($1), set_config('application_name', token || ':' || $6, "
            f"{{local}}), set_config('{{idle}}', $7, {{local}}) FROM t) "
            f"SELECT (SELECT count(*) FROM q) - (SELECT count(*) FROM u), (SELECT token FROM t), pg_backend_pid()")

    def sem_try(self) -> str:
        """Take Q if free (a try respects its queue), then admit. $1-$7 (see _admit)."""
        return self._admit("q AS MATERIALIZED (SELECT 1 WHERE pg_try_advisory_lock($1))")

    def sem_wait(self) -> str:
        """Queue for Q (FIFO), then admit. $1-$7, $8 lock_timeout (ms; 0: forever)."""
        return self._admit("s AS MATERIALIZED (SELECT set_config('lock_timeout', $8, true), "
                           "set_config('application_name', ':' || $6, {local})), "
                           "q AS MATERIALIZED (SELECT 1 FROM (SELECT pg_advisory_lock($1) FROM s) x)")

    def sem_admit(self) -> str:
        """The head (holding Q) looks again. $1-$7."""
        return self._admit("q AS (SELECT 1)")

    def sem_unqueue(self) -> str:
        """Leave the head of the queue without a permit. $1 Q, $2 the connection's own
        application name. Returns (true if Q was held)."""
        return "SELECT pg_advisory_unlock($1), set_config('application_name', $2, false)"

    def sem_release(self) -> str:
        """Session scope: give the permit back and wake the head. $1 H, $2 channel, $3 the
        connection's own application name. Returns (true if this session held it, ...)."""
        return ("SELECT pg_advisory_unlock_shared($1), pg_notify($2, ''), "
                "set_config('idle_session_timeout', '0', false), set_config('application_name', $3, false)")

    def sem_register(self) -> str:
        """Name a semaphore's keys, with its permits as last asked for. $1 H, $2 Q, $3 group,
        $4 name, $5 permits. (Not in the acquiring statement: an upsert locks its row until
        the statement ends, and that statement may wait for a long time.)"""
        return self._fill(
            "INSERT INTO {names} AS r (key, kind, grp, name, permits) VALUES ($1, 'semaphore', $3, $4, $5::int), "
            "($2, 'queue', $3, $4, NULL) ON CONFLICT (key, grp, name, kind) DO UPDATE SET permits = EXCLUDED.permits "
            "WHERE r.permits IS DISTINCT FROM EXCLUDED.permits")

    def register(self) -> str:
        """Name a lock's key (transaction scope: before BEGIN, committed at once). $1 key, $2
        group, $3 name."""
        return self._fill("INSERT INTO {names} (key, kind, grp, name) VALUES ($1, 'lock', $2, $3) "
                          "ON CONFLICT DO NOTHING")

    # -- inspection ------------------------------------------------------------------------

    def describe(self) -> str:
        """Every advisory lock of ylock's in this database, with who holds or waits for it.
        $1 group or NULL. Rows: kind, group, name, permits, mode, granted, application name,
        pid, the statement it ran last and when that started, in queue order (holders
        first, then by waitstart)."""
        return self._fill(
            "SELECT r.kind, r.grp, r.name, r.permits, l.mode, l.granted, a.application_name, l.pid, a.query, "
            "extract(epoch FROM a.query_start) "
            "FROM pg_locks l JOIN {names} r ON r.key = ((l.classid::bigint << 32) | l.objid::bigint) "
            "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            f"WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = {_DB} "
            "AND ($1::text IS NULL OR r.grp = $1) "
            "ORDER BY r.grp, r.name, r.kind, l.granted DESC, l.waitstart NULLS FIRST, l.pid")

    def terminate(self) -> str:
        """Force-release: end the sessions that hold the key (classid $1, objid $2),
        waiting up to $3 ms for each to exit, so the lock is free when this returns. Returns
        the pids terminated."""
        return ("SELECT l.pid, pg_terminate_backend(l.pid, $3::bigint) FROM pg_locks l "
                "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.classid = $1::oid "
                f"AND l.objid = $2::oid AND l.database = {_DB} AND l.pid <> pg_backend_pid()")

    def publish_stats(self) -> str:
        """$1 process, $2 seconds to keep, $3 data (hex)."""
        return self._fill("INSERT INTO {stats} (process, until, data) VALUES ($1, now() + $2::float8 * "
                          "interval '1 second', decode($3, 'hex')) ON CONFLICT (process) DO UPDATE SET "
                          "until = EXCLUDED.until, data = EXCLUDED.data")

    def read_stats(self) -> str:
        return self._fill("SELECT process, encode(data, 'hex') FROM {stats} WHERE until > now()")

    def prune_stats(self) -> str:
        return self._fill("DELETE FROM {stats} WHERE until < now() - interval '1 hour'")


#: Statements prepared on every session-scope connection (name -> Statements method); the
#: executor sends them by name, ``ylock_<name>``.
PREPARED: dict[str, Callable[[Statements], str]] = {
    "try_x": lambda s: s.lock_try(False), "try_s": lambda s: s.lock_try(True),
    "wait_x": lambda s: s.lock_wait(False), "wait_s": lambda s: s.lock_wait(True),
    "down": Statements.downgrade, "rel": Statements.release, "give": Statements.give_back,
    "sem_try": Statements.sem_try, "sem_wait": Statements.sem_wait, "sem_admit": Statements.sem_admit,
    "sem_unq": Statements.sem_unqueue, "sem_rel": Statements.sem_release, "ping": lambda s: "SELECT 1",
    "register": Statements.register, "sem_register": Statements.sem_register,
}
