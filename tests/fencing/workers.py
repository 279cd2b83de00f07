"""Code run in the fencing tests' child processes (spawned: fresh interpreters).

A *store* is one account table seen through one ORM (the Django ORM or SQLAlchemy Core) on
one database (a SQLite file or PostgreSQL): it reads a balance, writes one plainly (as
``save()`` does: whatever was read, plus the change) or fenced (refused with
:class:`ylock.FencedOut` once a newer holder has written the row).
"""
from __future__ import annotations

import os
import time
from typing import Any

import ylock

#: The SQLAlchemy table (not the Django app's: both may share one PostgreSQL database).
TABLE = "fencing_sa_account"


class DjangoStore:
    def __init__(self, database: str) -> None:
        setup_django(database)
        from tests.fencing.bankapp.models import Account

        self.Account = Account

    def create(self, pk: int, balance: int) -> None:
        from django.core.management import call_command

        call_command("migrate", "fencing_bank", verbosity=0)
        self.Account.objects.update_or_create(pk=pk, defaults={"balance": balance, "fence": 0})

    def read(self, pk: int) -> int:
        return int(self.Account.objects.get(pk=pk).balance)

    def write(self, pk: int, balance: int, lock: Any, fenced: bool, atomic: bool = False) -> None:
        """Write the balance (``atomic``: inside ``transaction.atomic()``, else in autocommit)."""
        import contextlib

        from django.db import transaction

        import django_ylock

        with transaction.atomic() if atomic else contextlib.nullcontext():
            account = self.Account.objects.get(pk=pk)
            account.balance = balance
            if fenced:
                django_ylock.fenced_save(account, lock, update_fields=["balance"])
            else:
                account.save(update_fields=["balance"])

    def fence(self, pk: int) -> int:
        return int(self.Account.objects.get(pk=pk).fence)


class SQLAlchemyStore:
    def __init__(self, database: str) -> None:
        import sqlalchemy as sa

        self.sa = sa
        url = database if database.startswith(("postgresql", "mysql")) else f"sqlite:///{database}"
        url = url.replace("postgresql://", "postgresql+psycopg://", 1).replace("mysql://", "mysql+pymysql://", 1)
        self.engine = sa.create_engine(url)
        meta = sa.MetaData()
        self.table = sa.Table(TABLE, meta, sa.Column("id", sa.BigInteger, primary_key=True),
                              sa.Column("balance", sa.Integer, nullable=False, server_default="0"),
                              sa.Column("fence", sa.BigInteger, nullable=False, server_default="0"))

    def create(self, pk: int, balance: int) -> None:
        with self.engine.begin() as conn:
            self.table.create(conn, checkfirst=True)
            conn.execute(self.table.delete().where(self.table.c.id == pk))
            conn.execute(self.table.insert().values(id=pk, balance=balance, fence=0))

    def read(self, pk: int) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(self.sa.select(self.table.c.balance).where(self.table.c.id == pk)).scalar_one())

    def write(self, pk: int, balance: int, lock: Any, fenced: bool, atomic: bool = False) -> None:
        """Write the balance, in a transaction of its own (``atomic`` changes nothing here)."""
        from ylock.sqlalchemy import fenced_update

        statement = self.table.update().where(self.table.c.id == pk).values(balance=balance)
        with self.engine.begin() as conn:
            if fenced:
                fenced_update(conn, statement, self.table.c.fence, lock)
            else:
                conn.execute(statement)

    def fence(self, pk: int) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(self.sa.select(self.table.c.fence).where(self.table.c.id == pk)).scalar_one())


def setup_django(database: str) -> None:
    """Configure Django for this process on ``database`` (a SQLite path, a PostgreSQL or a
    MySQL URL: MariaDB through PyMySQL standing in for mysqlclient) and bring the fencing
    app's tables up to date (its migrations add the fence column)."""
    import django
    from django.conf import settings

    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    if database.startswith("mysql"):
        from urllib.parse import urlsplit

        import pymysql

        pymysql.install_as_MySQLdb()
        parts = urlsplit(database)
        db = {"ENGINE": "django.db.backends.mysql", "NAME": parts.path.lstrip("/"), "USER": parts.username,
              "PASSWORD": parts.password, "HOST": parts.hostname, "PORT": str(parts.port)}
    elif database.startswith("postgresql"):
        from urllib.parse import urlsplit

        parts = urlsplit(database)
        db = {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"), "USER": parts.username,
              "HOST": parts.hostname, "PORT": str(parts.port), "OPTIONS": {"sslmode": "disable"}}
    else:
        db = {"ENGINE": "django.db.backends.sqlite3", "NAME": database, "OPTIONS": {"timeout": 30}}
    settings.configure(INSTALLED_APPS=["django.contrib.contenttypes", "django_ylock", "tests.fencing.bankapp"],
                       DATABASES={"default": db}, USE_TZ=True, YLOCK={"ENGINES": {"default": {"URL": "local://"}}})
    django.setup()


def store(kind: str, database: str) -> DjangoStore | SQLAlchemyStore:
    return DjangoStore(database) if kind == "django" else SQLAlchemyStore(database)


def holder(kind: str, database: str, lock_url: str, group: str, pk: int, lease: float, fenced: bool,
           conn: Any) -> None:
    """Create the account (balance 0, no fence yet), take its lock, read its balance, report
    ("read", token, balance) and wait for the order to write (the parent SIGSTOPs this
    process in between, past the lease); then write balance + 10 (fenced or plain) and
    report ("wrote", outcome, lost)."""
    accounts = store(kind, database)
    accounts.create(pk, 0)
    lock = ylock.Lock(ylock.engine_from_url(lock_url), group, f"account-{pk}", lease=lease)
    lock.lock(timeout=30)
    balance = accounts.read(pk)
    conn.send(("read", lock.token, balance))
    assert conn.recv() == "write"
    try:
        accounts.write(pk, balance + 10, lock, fenced)
        outcome = "written"
    except ylock.FencedOut as exc:
        outcome = f"FencedOut: {exc}"
    lost = lock.lost
    try:
        lock.unlock()
    except ylock.LockLost:
        lost = True
    conn.send(("wrote", outcome, lost))


def newer_holder(kind: str, database: str, lock_url: str, group: str, pk: int, lease: float, fenced: bool,
                 conn: Any) -> None:
    """Take the account's lock (granted only once the paused holder's lease has run out),
    add 100 to the balance (fenced or plain), release, report ("done", token)."""
    accounts = store(kind, database)
    lock = ylock.Lock(ylock.engine_from_url(lock_url), group, f"account-{pk}", lease=lease)
    with lock.write(timeout=60):
        token = lock.token
        # In a transaction here, in autocommit in the paused holder: fenced writes work in both.
        accounts.write(pk, accounts.read(pk) + 100, lock, fenced, atomic=True)
    conn.send(("done", token))


# -- single-flight ------------------------------------------------------------------------------


class RedisCache:
    """A cache adapter of the core's single-flight (:class:`ylock.singleflight.Cache`) over a
    plain Redis: values pickled under ``prefix``."""

    def __init__(self, url: str, prefix: str, timeout: int = 300) -> None:
        import redis

        self.client = redis.Redis.from_url(url.partition("?")[0])
        self.prefix, self.timeout = prefix, timeout

    def get(self, key: str) -> Any:
        import pickle

        from ylock import singleflight

        raw = self.client.get(self.prefix + key)
        return singleflight.MISSING if raw is None else pickle.loads(raw)

    def set(self, key: str, value: Any) -> None:
        import pickle

        self.client.set(self.prefix + key, pickle.dumps(value), ex=self.timeout)


def count_call(path: str) -> int:
    """Append one line to ``path`` (O_APPEND: the lines of processes never mix); return this
    process's pid."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(f"{os.getpid()}\n")
    return os.getpid()


def calls(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().split()
    except FileNotFoundError:
        return []


def wait_for_waiters(engine: ylock.Engine, group: str, count: int, timeout: float = 60.0) -> None:
    """Return once ``count`` callers queue for a lock of ``group``; raise if they never do."""
    deadline = time.monotonic() + timeout
    while sum(len(i.waiters) for i in engine.describe(group)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} waiters never queued in {group}")
        time.sleep(0.01)


def cold_reader(lock_url: str, group: str, prefix: str, key: str, count_file: str, fail_first: bool,
                readers: int, start: Any) -> Any:
    """Read ``key`` through the single-flight cache once every reader is at the start line.
    The computation waits until every other reader queues for the key's lock (so all of them
    missed the cache at once), counts itself in ``count_file`` and, with ``fail_first``, the
    first one (deployment-wide) raises. Return the value, or the error's text."""
    from ylock import singleflight

    cache = RedisCache(lock_url, prefix)
    engine = ylock.engine_from_url(lock_url)
    lock = ylock.Lock(engine, group, singleflight.lock_name(key), lease=5)
    cache.client.ping()

    def compute() -> str:
        before = len(calls(count_file))
        first = before == 0
        wait_for_waiters(engine, group, readers - 1 - before)
        count_call(count_file)
        if fail_first and first:
            raise RuntimeError("the first computation fails")
        return f"value computed by {os.getpid()}"
    start.wait(60)
    try:
        return singleflight.get_or_set(cache, key, compute, lock=lock, lock_timeout=60)
    except RuntimeError as exc:
        return f"error: {exc}"


def dying_holder(lock_url: str, group: str, prefix: str, key: str, conn: Any) -> None:
    """Start computing ``key`` under its lock (lease 1 s), say so, and block until killed."""
    from ylock import singleflight

    cache = RedisCache(lock_url, prefix)
    lock = ylock.Lock(ylock.engine_from_url(lock_url), group, singleflight.lock_name(key), lease=1.0)

    def compute() -> str:
        conn.send("computing")
        conn.recv()                 # never answered: the test kills this process
        return "never"
    singleflight.get_or_set(cache, key, compute, lock=lock, lock_timeout=10)
