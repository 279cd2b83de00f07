"""celery_ylock in a runnable demo: three tasks, three ways a lock guards them.

Run it against any Redis (one server serves as broker, result backend and lock engine):

    export YLOCK_URL=redis://127.0.0.1:6379/0 CELERY_BROKER_URL=redis://127.0.0.1:6379/1
    celery -A example_project.celery_app worker -l INFO -c 4      # one terminal (or several workers)
    python -m example_project.celery_app                           # another: sends the tasks, prints the outcome

- ``rebuild_report(user_id)`` holds a lock per user while it runs; a second request for
  the same user while one runs is skipped (``on_busy="skip"``): its result says so.
- ``import_feed(source)`` takes its lock when it is *sent* (``scope="enqueue"``): a second
  ``delay()`` for a feed already queued or running raises ``TaskLocked`` in the caller.
- ``deposit(account_id, amount)`` holds a lock per account and writes the balance with a
  read-modify-write, as careless code does; concurrent deposits would lose updates without
  the lock. It hands its fencing token to the database, which refuses a write from a
  holder older than the last one (a worker that paused past its lease), and it checks
  ``self.request.ylock`` between steps, stopping if the lock was lost. Busy: it waits.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from celery import Celery

from celery_ylock import LockedTask, TaskLocked, skipped

BROKER = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1")
app = Celery("example", broker=BROKER, backend=os.environ.get("CELERY_RESULT_BACKEND", BROKER))
# The default engine is $YLOCK_URL (or set app.conf.ylock_url); LOCKS as in Django's YLOCK setting.
app.conf.ylock = {"LOCKS": {"reports": {"LEASE": 30}, "feeds": {"LEASE": 60}, "accounts": {"LEASE": 10}}}
app.conf.worker_prefetch_multiplier = 1

DATABASE = os.environ.get("EXAMPLE_DATABASE", os.path.join(tempfile.gettempdir(), "ylock-celery-example.sqlite3"))


@contextlib.contextmanager
def db() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(DATABASE, timeout=30, isolation_level=None)
    try:
        connection.execute("CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER, "
                           "token INTEGER)")
        yield connection
    finally:
        connection.close()


@app.task(bind=True, base=LockedTask, lock={"name": "reports", "key": "{user_id}", "on_busy": "skip"})
def rebuild_report(self: LockedTask, user_id: int) -> dict[str, Any]:
    time.sleep(1.0)                                   # the expensive part
    return {"user": user_id, "token": self.request.ylock.token}


@app.task(bind=True, base=LockedTask, lock={"name": "feeds", "key": "{source}", "scope": "enqueue"})
def import_feed(self: LockedTask, source: str) -> str:
    time.sleep(1.0)
    return f"imported {source} (token {self.request.ylock.token}, lock taken when it was sent)"


@app.task(bind=True, base=LockedTask,
          lock={"name": "accounts", "key": "{account_id}", "on_busy": "wait", "timeout": 30})
def deposit(self: LockedTask, account_id: int, amount: int) -> int:
    hold = self.request.ylock                         # this run's hold: token, lost, check()
    with db() as connection:
        row = connection.execute("SELECT balance FROM accounts WHERE id = ?", (account_id,)).fetchone()
        balance = (row[0] if row else 0) + amount
        time.sleep(0.02)                              # the work between reading and writing
        hold.check()                                  # lost the lock meanwhile? stop here (ylock.LockLost)
        # Fenced: the row keeps the highest token that wrote it; an older holder's write changes nothing.
        connection.execute("INSERT INTO accounts (id, balance, token) VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE "
                           "SET balance = excluded.balance, token = excluded.token WHERE accounts.token <= ?",
                           (account_id, balance, hold.token, hold.token))
    return balance


def demo() -> dict[str, Any]:
    """Send the tasks and return what happened (printed by ``python -m example_project.celery_app``)."""
    account = int(time.time() * 1000) % 1_000_000
    reports = [rebuild_report.delay(42) for _ in range(3)]
    outcomes = [r.get(timeout=60) for r in reports]
    first = import_feed.delay(f"feed-{account}")
    try:
        import_feed.delay(f"feed-{account}")
        duplicate = "sent (unexpected)"
    except TaskLocked as exc:
        duplicate = f"refused: {exc}"
    deposits = [deposit.delay(account, 10) for _ in range(20)]
    for r in deposits:
        r.get(timeout=120)
    with db() as connection:
        balance = connection.execute("SELECT balance FROM accounts WHERE id = ?", (account,)).fetchone()[0]
    return {"reports_run": sum(not skipped(o) for o in outcomes), "reports_skipped": sum(map(skipped, outcomes)),
            "feed": first.get(timeout=60), "duplicate_feed": duplicate, "balance": balance, "expected_balance": 200}


if __name__ == "__main__":
    for key, value in demo().items():
        print(f"{key:>16}: {value}")
