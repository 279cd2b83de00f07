"""Kleppmann's scenario on a real database, with two real processes on one account row:

1. holder A creates the account row, takes its lock (Redis, lease 1 s) and reads the balance (0);
2. A is SIGSTOPped (its renewal thread too) and stays stopped until B has the lock, which
   B can only get once A's lease has run out;
3. B adds 100 with its own write and releases;
4. A is resumed and writes what it read plus 10.

Fenced (``django_ylock.fenced_save`` / ``ylock.sqlalchemy.fenced_update``), A's write raises
:class:`ylock.FencedOut` and changes nothing: the balance is B's 100. Plain (``save()`` /
a plain UPDATE: the control), A's write wins and B's update is lost: the balance is 10.
With the Django ORM and SQLAlchemy, on SQLite and PostgreSQL (locks on Redis), and on
MariaDB with MariaDB as the lock engine too (Django: ``django://default``, the MySQL engine on
the ``DATABASES`` entry; SQLAlchemy: ``mysql://``). Every step waits for the previous one's
message on a pipe, never for a time.
"""
from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
from typing import Any

import psycopg
import pymysql
import pytest

from tests.fencing import workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LEASE = 1.0
TABLES = {"django": "fencing_bank_account", "sqlalchemy": workers.TABLE}


def database_for(db: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    if db == "sqlite":
        return str(tmp_path / "bank.sqlite3")
    if db == "mariadb":
        return str(request.getfixturevalue("mariadb_server").url)
    return str(request.getfixturevalue("postgres_server").url)


def lock_url_for(db: str, kind: str, database: str, redis_url: str) -> str:
    """Redis, but MariaDB's own engine when MariaDB is the database (django://default on the
    Django side: the lock engine is the DATABASES entry itself)."""
    if db != "mariadb":
        return redis_url
    return "django://default" if kind == "django" else database


def row(database: str, table: str, pk: int) -> tuple[int, int]:
    """(balance, fence) of the account, read by the test itself (no ORM)."""
    query = f"SELECT balance, fence FROM {table} WHERE id = {int(pk)}"
    if database.startswith("postgresql"):
        with psycopg.connect(database, sslmode="disable") as conn:
            found = conn.execute(query).fetchone()
    elif database.startswith("mysql"):
        from urllib.parse import urlsplit

        parts = urlsplit(database)
        with pymysql.connect(host=parts.hostname, port=parts.port, user=parts.username, password=parts.password,
                             database=parts.path.lstrip("/")) as conn, conn.cursor() as cursor:
            cursor.execute(query)
            found = cursor.fetchone()
    else:
        with sqlite3.connect(database) as conn:
            found = conn.execute(query).fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def receive(conn: Any, process: Any, what: str, timeout: float = 90.0) -> Any:
    assert conn.poll(timeout), f"no {what} from the child within {timeout}s (exit code {process.exitcode})"
    return conn.recv()


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "plain"])
@pytest.mark.parametrize("db", ["sqlite", "postgres", "mariadb"])
@pytest.mark.parametrize("kind", ["django", "sqlalchemy"])
def test_paused_holder_is_fenced_out_and_plain_writes_lose_the_newer_update(kind, db, fenced, tmp_path, request,
                                                                             redis_server, group):
    database = database_for(db, tmp_path, request)
    lock_url = lock_url_for(db, kind, database, redis_server.url)
    pk = random.randrange(1, 2**31)
    ctx = multiprocessing.get_context("spawn")
    a_end, a_child = ctx.Pipe()
    a = ctx.Process(target=workers.holder, args=(kind, database, lock_url, group, pk, LEASE, fenced, a_child))
    a.start()
    b = None
    try:
        step, token_a, balance_a = receive(a_end, a, "read")
        assert (step, balance_a) == ("read", 0)
        os.kill(a.pid, signal.SIGSTOP)      # paused holding the lock: its lease runs out
        try:
            b_end, b_child = ctx.Pipe()
            b = ctx.Process(target=workers.newer_holder,
                            args=(kind, database, lock_url, group, pk, LEASE, fenced, b_child))
            b.start()
            step, token_b = receive(b_end, b, "newer holder's write")
            assert step == "done" and token_b > token_a
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert row(database, TABLES[kind], pk)[0] == 100
        a_end.send("write")
        step, outcome, lost = receive(a_end, a, "paused holder's write")
        assert step == "wrote"
        balance, fence = row(database, TABLES[kind], pk)
        if fenced:
            assert outcome.startswith("FencedOut"), outcome
            assert (balance, fence) == (100, token_b), "the stale holder's fenced write changed the row"
        else:
            assert outcome == "written"
            assert balance == 10, f"the control lost no update (balance {balance}): the scenario did not happen"
        assert lost, "the paused holder was not told that its lock was lost"
    finally:
        for process in (a, b):
            if process is not None:
                process.join(30)
                if process.exitcode is None:
                    process.kill()
                    process.join()
    assert a.exitcode == 0 and b is not None and b.exitcode == 0
