"""What the MySQL engine says to the server: its statements, each opening with its contract,
and the names it gives things there (keys, ``GET_LOCK`` names, tables).

Values: numbers are formatted by this module; text that comes from users (groups, names,
owners, what a holder said) is sent as a hexadecimal literal converted to utf8mb4, so that
no quoting rule (``NO_BACKSLASH_ESCAPES``, character sets) can change its meaning; the
names this module makes (keys, lock names) are ASCII letters, digits, ``.`` and ``_``.

Every acquisition is one round trip of several statements. A statement that must not act
when an earlier one failed (a ``GET_LOCK`` that timed out) is made conditional on the user
variables ``@ylock_*`` that the earlier ones set; reads of the holds table are plain
``SELECT ... INTO`` (consistent reads: they take no row lock), and its writes touch rows by
primary key or insert one, so no statement of the engine waits on a row lock of another.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

#: GET_LOCK's timeout when the caller waits forever (a year: MySQL and MariaDB both take it).
FOREVER = 31_536_000


def lock_key(prefix: str, database: str, kind: str, group: str, name: str) -> str:
    """Return the 32-hex-digit key of a lock (``kind`` "lock") or a semaphore ("semaphore"):
    a keyed hash of the prefix and database (``GET_LOCK`` names are the whole server's, the
    tables one database's), the kind, group and name. ``GET_LOCK`` takes names of at most 64
    characters: a group and name of any length fit, as their hash."""
    digest = hashlib.blake2b(f"{kind}\0{group}\0{name}".encode(), digest_size=16,
                             key=f"{prefix}\0{database}".encode()[:64]).hexdigest()
    return digest


def text(value: str | None) -> str:
    """A SQL literal for text from users: hexadecimal, converted to utf8mb4 (NULL for None)."""
    if value is None:
        return "NULL"
    if not value:
        return "''"
    return f"CONVERT(X'{value.encode().hex()}' USING utf8mb4)"


def seconds(value: float | None) -> str:
    """GET_LOCK's timeout for a wait of ``value`` seconds (None: forever), in milliseconds' precision."""
    if value is None:
        return str(FOREVER)
    return f"{max(0.0, min(value, FOREVER)):.3f}"


def lease_seconds(lease: float) -> int:
    """``wait_timeout`` for a lease: whole seconds, rounded up, at least 1."""
    return max(1, min(31_536_000, math.ceil(lease - 1e-9)))


def comment(info: dict[str, object]) -> str:
    """The leading comment of a waiting statement: who waits, for what, and what they said
    (``describe`` reads it from the process list while the statement runs)."""
    body = json.dumps(info, separators=(",", ":"), ensure_ascii=True).replace("*/", "*\\/")
    return f"/*ylock {body}*/ "


#: Created on the engine's first connection (``IF NOT EXISTS``). ``{holds}``: one row per hold,
#: while it lasts (about 200 bytes); ``token`` is the fencing token: an AUTO_INCREMENT, which
#: InnoDB persists (redo-logged when it changes, MySQL 8 and MariaDB 10.2.4 on), so it never
#: goes back across a restart, and a replica that applied the inserts continues above them.
#: ``mark`` is the hold's own GET_LOCK name: held by the holder's session while the hold
#: lives, so a row whose mark is free is a dead holder's. ``{stats}``: each process's
#: statistics for the command lines.
SETUP = """
CREATE TABLE IF NOT EXISTS {holds} (
    token BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    lk CHAR(32) CHARACTER SET ascii NOT NULL,
    kind VARCHAR(10) CHARACTER SET ascii NOT NULL,
    mode VARCHAR(6) CHARACTER SET ascii NOT NULL,
    grp VARCHAR(64) NOT NULL,
    name VARCHAR(255) NOT NULL,
    owner VARCHAR(255) NOT NULL,
    mark VARCHAR(64) CHARACTER SET ascii NOT NULL,
    conn BIGINT NOT NULL,
    permits INT NULL,
    since DOUBLE NOT NULL,
    said TEXT NULL,
    KEY by_lock (lk, mode)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS {stats} (
    process VARCHAR(255) NOT NULL PRIMARY KEY,
    until DOUBLE NOT NULL,
    data LONGBLOB NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""


@dataclass(frozen=True)
class Row:
    """The columns of a hold's row that the acquiring statement writes."""

    lk: str
    kind: str
    mode: str
    group: str
    name: str
    owner: str
    mark: str
    permits: int | None = None
    said: str | None = None


@dataclass(frozen=True)
class Statements:
    """Every statement of one engine (its table prefix), as text."""

    prefix: str

    @property
    def holds(self) -> str:
        return f"`{self.prefix}_holds`"

    @property
    def stats(self) -> str:
        return f"`{self.prefix}_stats`"

    def setup(self) -> str:
        return SETUP.replace("{holds}", self.holds).replace("{stats}", self.stats).strip()

    def lock_name(self, letter: str, lk: str) -> str:
        """A GET_LOCK name: ``<prefix>.x.<key>`` (a lock's turnstile), ``.q.`` (a semaphore's
        queue), at most 64 characters."""
        return f"{self.prefix}.{letter}.{lk}"

    def _insert(self, row: Row, condition: str) -> str:
        return (f"INSERT INTO {self.holds} (lk, kind, mode, grp, name, owner, mark, conn, permits, since, said) "
                f"SELECT '{row.lk}', '{row.kind}', '{row.mode}', {text(row.group)}, {text(row.name)}, "
                f"{text(row.owner)}, '{row.mark}', CONNECTION_ID(), "
                f"{'NULL' if row.permits is None else int(row.permits)}, UNIX_TIMESTAMP(NOW(6)), {text(row.said)} "
                f"FROM DUAL WHERE {condition}")

    @staticmethod
    def _lease(lease: float) -> str:
        return (f"SET SESSION wait_timeout = IF(@ylock_t IS NULL, @@global.wait_timeout, "
                f"{lease_seconds(lease)})")

    # -- locks ------------------------------------------------------------------------------------
    #
    # A lock is a turnstile, its GET_LOCK name ``x``, taken in the server's FIFO queue by every
    # acquisition: a writer keeps it for its whole hold, a reader only while it enters. Each
    # hold also takes its own ``mark`` and writes its row. A writer that finds readers' rows
    # once it has the turnstile waits for their marks (nobody else can enter meanwhile), a
    # reader that has the turnstile enters at once: the server's queue is the lock's queue.

    def lock_attempt(self, row: Row, kx: str, wait: float | None, lease: float, said: str, head: str) -> str:
        """Take the turnstile ``kx``, then the hold's mark; a writer then waits for the readers
        inside to leave (each reader's mark: free once it released or its session ended),
        all within ``wait`` seconds (the server's clock), and deletes the rows of this lock
        left (every one a dead holder's: nobody can enter while it holds the turnstile); then
        write the hold's row. Returns (1 if the turnstile was taken, the token or NULL). A
        reader lets go of the turnstile in the same round trip; the lease (wait_timeout) is
        set once granted. Every statement carries the waiter's comment (``said``; ``head``
        once it holds the turnstile), so the process list shows it until it is granted."""
        read = row.mode == "read"
        # SYSDATE, not NOW: NOW() is the statement's start, and one statement waits for every reader.
        left = "GREATEST(0, @ylock_end - UNIX_TIMESTAMP(SYSDATE(6)))"
        granted = "@ylock_gm = 2 AND @ylock_r = 0"
        # @ylock_gm: 0 (no turnstile), 1 (turnstile only: cannot happen, marks are unique), 2 (both).
        steps = [f"{said}SELECT UNIX_TIMESTAMP(SYSDATE(6)) + {seconds(wait)}, CASE GET_LOCK('{kx}', {seconds(wait)}) "
                 f"WHEN 1 THEN 1 + GET_LOCK('{row.mark}', 0) ELSE 0 END INTO @ylock_end, @ylock_gm"]
        if read:
            steps.append("SET @ylock_r = 0")
        else:
            # The readers inside (waited for, each until it leaves or is found gone), and whether
            # any row of this lock is left (a dead holder's, deleted): usually none.
            steps += [f"{head}SELECT IF(@ylock_gm = 2, (SELECT COUNT(*) FROM {self.holds} WHERE lk = '{row.lk}' "
                      f"AND mode = 'read' AND NOT (GET_LOCK(mark, {left}) = 1 AND RELEASE_LOCK(mark) = 1)), 0), "
                      f"(SELECT COUNT(*) FROM {self.holds} WHERE lk = '{row.lk}') INTO @ylock_r, @ylock_all",
                      f"DELETE FROM {self.holds} WHERE lk = '{row.lk}' AND {granted} AND @ylock_all > 0"]
        steps += [f"SET SESSION wait_timeout = IF({granted}, {lease_seconds(lease)}, @@global.wait_timeout)",
                  f"{head}{self._insert(row, granted)}",
                  f"SELECT @ylock_gm >= 1, IF(ROW_COUNT() > 0, LAST_INSERT_ID(), NULL), "
                  f"IF(@ylock_gm >= 1 AND ({int(read)} OR ROW_COUNT() <= 0), RELEASE_LOCK('{kx}'), NULL)"]
        return ";\n".join(steps)

    def wait_for(self, holds: list[tuple[int, str]], wait: float | None, said: str) -> str:
        """The turnstile's (or queue's) holder waits, up to ``wait`` seconds in all (the
        server's clock), until each hold of ``holds`` (token, mark) ends: its mark is free
        (released, or its session gone: then its row is deleted here). Sets @ylock_ok to 1
        if all ended in time. Every statement carries ``said``: the process list shows the
        waiter all along."""
        parts = [f"{said}SET @ylock_end = UNIX_TIMESTAMP(SYSDATE(6)) + {seconds(wait)}, @ylock_ok = 1"]
        for token, mark in holds:
            parts += [f"{said}SELECT IF(@ylock_ok = 1, GET_LOCK('{mark}', GREATEST(0, @ylock_end - "
                      "UNIX_TIMESTAMP(SYSDATE(6)))), 0) INTO @ylock_w",
                      f"{said}DELETE FROM {self.holds} WHERE token = {int(token)} AND @ylock_w = 1",
                      f"{said}SELECT IF(@ylock_w = 1, RELEASE_LOCK('{mark}'), 0), IF(@ylock_w = 1, @ylock_ok, 0) "
                      "INTO @ylock_x, @ylock_ok"]
        return ";\n".join(parts) + ";\n"

    def release(self, token: int, mark: str, kx: str | None) -> str:
        """The last hold of a connection ends: its row, then its mark and a writer's turnstile
        (``kx``). In that order: the next writer, once it holds the turnstile and no reader is
        inside, deletes every row of the lock that is left (a dead holder's), and a holder
        deleting its own row at the same moment would be a deadlock between the two indexes.
        Returns (1 if the mark was still this session's, ...); the session's idle timeout goes
        back to the server's."""
        turnstile = f", RELEASE_LOCK('{kx}')" if kx else ""
        return (f"DELETE FROM {self.holds} WHERE token = {int(token)};\n"
                f"SELECT RELEASE_LOCK('{mark}'){turnstile};\n"
                "SET SESSION wait_timeout = @@global.wait_timeout")

    def downgraded(self, token: int, kx: str) -> str:
        """A writer that also reads lets go of the write lock: its row becomes a reader's,
        then the turnstile opens (queued readers enter; the next writer waits for this
        mark). Returns (1 if the turnstile was still this session's)."""
        return (f"UPDATE {self.holds} SET mode = 'read' WHERE token = {int(token)};\n"
                f"SELECT RELEASE_LOCK('{kx}')")

    @staticmethod
    def give_back() -> str:
        """After a failed, timed-out or abandoned acquisition: let go of every GET_LOCK the
        session holds (a connection carries one hold at most, so nothing else is lost) and
        reset its idle timeout. A row it wrote is a dead holder's from then on (its mark is
        free): whoever comes next deletes it."""
        return "DO RELEASE_ALL_LOCKS();\nSET SESSION wait_timeout = @@global.wait_timeout"

    # -- semaphores --------------------------------------------------------------------------------
    #
    # A semaphore is a queue, its GET_LOCK name ``q`` (FIFO): its head is admitted when fewer
    # than ``permits`` live holds have rows (a live hold's mark is taken), and lets go of the
    # queue; otherwise it keeps the queue and waits for a holder's mark.

    def permit_attempt(self, row: Row, kq: str, wait: float | None, lease: float, said: str,
                       head: bool = False) -> str:
        """Queue (waiting up to ``wait``; already the head with ``head``), then be admitted if
        fewer than ``row.permits`` live holds exist. Returns (1 if at the head, the token or
        NULL, 1 once the queue was let go, the holds to wait for as "token mark live,...")."""
        first = (f"{said}SET @ylock_g = @ylock_ok" if head
                 else f"{said}SELECT GET_LOCK('{kq}', {seconds(wait)}) INTO @ylock_g")
        return (f"{first};\n"
                f"SELECT COUNT(*) FROM {self.holds} WHERE lk = '{row.lk}' AND IS_USED_LOCK(mark) IS NOT NULL "
                "INTO @ylock_n;\n"
                f"SELECT IF(@ylock_g = 1 AND @ylock_n < {int(row.permits or 0)}, GET_LOCK('{row.mark}', 0), 0) "
                "INTO @ylock_m;\n"
                f"{self._insert(row, '@ylock_m = 1')};\n"
                "SELECT IF(ROW_COUNT() > 0, LAST_INSERT_ID(), NULL) INTO @ylock_t;\n"
                f"SELECT @ylock_g, @ylock_t, IF(@ylock_t IS NOT NULL, RELEASE_LOCK('{kq}'), NULL), "
                f"IF(@ylock_g = 1 AND @ylock_t IS NULL, (SELECT GROUP_CONCAT(token, ' ', mark, ' ', "
                f"IS_USED_LOCK(mark) IS NOT NULL ORDER BY token SEPARATOR ',') FROM {self.holds} "
                f"WHERE lk = '{row.lk}'), NULL);\n"
                f"{self._lease(lease)}")

    # -- inspection, administration ----------------------------------------------------------------

    def describe(self, group: str | None, mariadb: bool) -> str:
        """Live holds (their mark taken) of ``group`` (None: all), and the waiting statements
        of the process list in this database (their leading comment says who waits for what)
        with how long they have waited (ms), and the server's clock. A killed session's
        statement (a cancelled wait: ``KILL`` returns before the session has ended, and the
        process list shows it as ``Killed`` until then) waits no more."""
        elapsed = "TIME_MS" if mariadb else "TIME * 1000"
        where = "" if group is None else f"grp = {text(group)} AND "
        return (f"SELECT token, kind, mode, grp, name, owner, said, since, permits, conn FROM {self.holds} "
                f"WHERE {where}IS_USED_LOCK(mark) IS NOT NULL ORDER BY grp, name, kind, token;\n"
                f"SELECT ID, INFO, {elapsed}, UNIX_TIMESTAMP(NOW(6)) FROM information_schema.PROCESSLIST "
                "WHERE INFO LIKE '/*ylock {%' AND ID <> CONNECTION_ID() AND DB = DATABASE() AND COMMAND <> 'Killed'")

    def holders(self, lk: str) -> str:
        """The sessions that hold a live hold of key ``lk`` (force_release kills them)."""
        return (f"SELECT DISTINCT conn FROM {self.holds} WHERE lk = '{lk}' AND IS_USED_LOCK(mark) IS NOT NULL "
                "AND conn <> CONNECTION_ID()")

    def still_held(self, lk: str) -> str:
        return f"SELECT COUNT(*) FROM {self.holds} WHERE lk = '{lk}' AND IS_USED_LOCK(mark) IS NOT NULL"

    def adopt(self, token: int, owner: str) -> str:
        return f"UPDATE {self.holds} SET owner = {text(owner)} WHERE token = {int(token)};\nSELECT ROW_COUNT()"

    def publish_stats(self, process: str, ttl: float, data: bytes) -> str:
        return (f"INSERT INTO {self.stats} (process, until, data) VALUES ({text(process)}, "
                f"UNIX_TIMESTAMP(NOW(6)) + {float(ttl)!r}, X'{data.hex()}') ON DUPLICATE KEY UPDATE "
                "until = VALUES(until), data = VALUES(data)")

    def read_stats(self) -> str:
        return (f"DELETE FROM {self.stats} WHERE until < UNIX_TIMESTAMP() - 3600;\n"
                f"SELECT process, HEX(data) FROM {self.stats} WHERE until > UNIX_TIMESTAMP(NOW(6))")
