"""Code run in the fencing tests' child processes (spawned: fresh interpreters).

A *store* is one account table seen through one ORM (the Django ORM or SQLAlchemy Core) on
one database (a SQLite file or PostgreSQL): it reads a balance, writes one plainly (as
``save()`` does: whatever was read, plus the change) or fenced (refused with
:class:`ylock.FencedOut` once a newer holder has written the row).
"""
from __future__ import annotations

import os
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

    def write(self, pk: int, balance: int, lock: Any, fenced: bool) -> None:
        import django_ylock

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
        url = database if database.startswith("postgresql") else f"sqlite:///{database}"
        url = url.replace("postgresql://", "postgresql+psycopg://", 1)
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

    def write(self, pk: int, balance: int, lock: Any, fenced: bool) -> None:
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
    """Configure Django for this process on ``database`` (a SQLite path or a PostgreSQL URL)
    and bring the fencing app's tables up to date (its migrations add the fence column)."""
    import django
    from django.conf import settings

    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    if database.startswith("postgresql"):
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


def prepare(kind: str, database: str, pk: int, balance: int) -> None:
    """Create the table (if needed) and the account row, with no fence written yet."""
    store(kind, database).create(pk, balance)


def holder(kind: str, database: str, lock_url: str, group: str, pk: int, lease: float, fenced: bool,
           conn: Any) -> None:
    """Take the account's lock, read its balance, report ("read", token, balance) and wait
    for the order to write (the parent SIGSTOPs this process in between, past the lease);
    then write balance + 10 (fenced or plain) and report ("wrote", outcome, lost)."""
    accounts = store(kind, database)
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
        accounts.write(pk, accounts.read(pk) + 100, lock, fenced)
    conn.send(("done", token))
