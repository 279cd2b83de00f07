"""``ylock.sqlalchemy`` in one process: ORM statements through a Flask-SQLAlchemy session and
Core statements through a connection, on SQLite, with real Redis locks; what is written,
what is refused and what is rejected. (The paused-holder scenario with real processes and
PostgreSQL is test_paused_holder.py.)"""
from __future__ import annotations

import pytest
from flask import Flask, current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import BigInteger, insert, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import flask_ylock
import ylock
from flask_ylock import YLock
from ylock.sqlalchemy import fenced, fenced_update


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Account(db.Model):  # type: ignore[name-defined, misc]
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    balance: Mapped[int] = mapped_column(default=0)
    fence: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


@pytest.fixture
def app(tmp_path, redis_prefixed):
    app = Flask(__name__)
    app.config.update(SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'bank.db'}", YLOCK_URL=redis_prefixed)
    db.init_app(app)
    ext = YLock(app)
    with app.app_context():
        db.create_all()
        db.session.add(Account(id=1, balance=0))
        db.session.commit()
        yield ext
        db.session.remove()


def deposit(amount: int):
    return update(Account).where(Account.id == 1).values(balance=Account.balance + amount)


def row() -> tuple[int, int]:
    db.session.expire_all()
    account = db.session.get(Account, 1)
    return account.balance, account.fence


def test_flask_sqlalchemy_session_fenced_by_a_held_lock(app):
    lock = app.locks("accounts")["1"]
    with pytest.raises(ValueError, match="token_or_lock: .* is not held"):
        fenced_update(db.session, deposit(1), Account.fence, lock)
    with lock.write(timeout=5):
        assert fenced_update(db.session, deposit(10), Account.fence, lock) == 1
        assert fenced_update(db.session, deposit(10), Account.fence, lock) == 1        # same holder again
        old = lock.token
        db.session.commit()
    assert row() == (20, old)
    with lock.write(timeout=5):
        assert lock.token > old
        fenced_update(db.session, deposit(5), Account.fence, lock)
        db.session.commit()
    with pytest.raises(ylock.FencedOut) as caught:
        fenced_update(db.session, deposit(1000), Account.fence, old)
    db.session.rollback()
    assert caught.value.token == old and row()[0] == 25
    missing = update(Account).where(Account.id == 2).values(balance=1)
    assert fenced_update(db.session, missing, Account.fence, old) == 0               # no row: no error


def test_core_statements_on_a_connection(app):
    table = Account.__table__
    with db.engine.begin() as conn:
        conn.execute(insert(table).values(id=2, balance=7, fence=0))
        statement = table.update().where(table.c.id == 2).values(balance=8)
        assert fenced_update(conn, statement, table.c.fence, 3) == 1
        with pytest.raises(ylock.FencedOut):
            fenced_update(conn, statement.values(balance=9), table.c.fence, 2)
        assert conn.execute(select(table.c.balance, table.c.fence).where(table.c.id == 2)).one() == (8, 3)
        # fenced() alone: the statement to run yourself
        assert conn.execute(fenced(statement.values(balance=10), table.c.fence, 4)).rowcount == 1
        assert conn.execute(fenced(statement.values(balance=11), table.c.fence, 3)).rowcount == 0


@pytest.mark.parametrize("bad, error", [(None, TypeError), ("5", TypeError), (-1, ValueError), (False, TypeError)])
def test_bad_input_is_rejected_by_name(app, bad, error):
    with pytest.raises(error, match="token_or_lock"):
        fenced(deposit(1), Account.fence, bad)
    with pytest.raises(TypeError, match="statement must be an sqlalchemy update"):
        fenced(select(Account), Account.fence, 1)
    assert row() == (0, 0)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_locked_flask_view_writes_with_current_lock(app, kind):
    flask_app = current_app._get_current_object()

    def write(account_id: int) -> dict[str, int]:
        lock = flask_ylock.current_lock()
        changed = fenced_update(db.session, deposit(1), Account.fence, lock)
        db.session.commit()
        return {"changed": changed, "token": lock.token}

    if kind == "sync":
        @flask_app.post("/deposit/<int:account_id>")
        @app.locked("accounts", key="account_id", timeout=5)
        def view(account_id: int):
            return write(account_id)
    else:
        @flask_app.post("/deposit/<int:account_id>")
        @app.locked("accounts", key="account_id", timeout=5)
        async def view(account_id: int):
            return write(account_id)

    client = flask_app.test_client()
    first, second = client.post("/deposit/1").json, client.post("/deposit/1").json
    assert first["changed"] == second["changed"] == 1 and second["token"] > first["token"] > 0
    assert row() == (2, second["token"])
