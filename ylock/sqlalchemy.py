"""Fenced writes with SQLAlchemy (Core and ORM, 1.4 and 2.x; Flask-SQLAlchemy's ``db.session``).

    from sqlalchemy import update
    from ylock.sqlalchemy import fenced_update

    with lock.write(timeout=5):
        stmt = update(Account).where(Account.id == account_id).values(balance=Account.balance + 10)
        fenced_update(db.session, stmt, Account.fence, lock)     # raises ylock.FencedOut if stale
        db.session.commit()

The fence column is a ``BigInteger`` with a server default of 0
(``fence = mapped_column(BigInteger, nullable=False, default=0, server_default="0")``).
:func:`fenced` only adds the condition and the assignment to an ``update()`` (to run it
yourself); :func:`fenced_update` runs it, returns the rows changed, and tells a stale
holder from rows that do not exist. What a token guarantees is in :mod:`ylock.fencing`.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import literal, select
from sqlalchemy.sql.dml import Update

from ylock.fencing import fenced_out, token_of

__all__ = ["fenced", "fenced_update"]


def fenced(statement: Update, column: Any, token_or_lock: Any) -> Update:
    """Return ``statement`` (an ``update()``) fenced by ``column``: it also sets the column to
    the token and matches only rows whose fence is not newer (``column <= token``).
    ``token_or_lock``: a fencing token, or a held lock (its ``token``)."""
    if not isinstance(statement, Update):
        raise TypeError(f"statement must be an sqlalchemy update(), got {statement!r}")
    token = token_of(token_or_lock, "token_or_lock")
    return statement.where(column <= token).values({column: token})


def fenced_update(connection: Any, statement: Update, column: Any, token_or_lock: Any) -> int:
    """Run ``statement`` fenced by ``column`` (see :func:`fenced`) on ``connection`` (a
    ``Connection`` or a ``Session``) as one conditional UPDATE; return the rows changed.

    Raise :class:`ylock.FencedOut` (nothing was written) when no row was changed because
    rows of the statement carry a newer token: a newer holder has written them. Rows that
    do not exist change nothing and raise nothing (0 is returned), as a plain update."""
    token = token_of(token_or_lock, "token_or_lock")
    changed = int(connection.execute(fenced(statement, column, token)).rowcount)
    if changed == 0:
        # Only rows carrying a newer fence count: a row deleted, or one that never matched,
        # is not a newer holder's work. Asked after the UPDATE, so a newer holder that wrote
        # in between is seen (and its write is what refused ours).
        probe = select(literal(1)).select_from(statement.table)
        if statement.whereclause is not None:
            probe = probe.where(statement.whereclause)
        if connection.execute(probe.where(column > token).limit(1)).first() is not None:
            raise fenced_out(token, f"the rows of {statement.table}", token_or_lock)
    return changed
