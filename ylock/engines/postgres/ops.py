"""The operations the PostgreSQL engine's steps yield, one named type each.

The engine's lock, semaphore and pool logic is written once, as generators (see
:func:`ylock.engines.base.run_steps`): they yield an operation and are sent its result.
The executor (:mod:`~ylock.engines.postgres.executor`) does each operation blocking or
awaited, so the same steps serve the blocking API and asyncio. ``Open``, ``Wait`` and
``Claim`` are the session engines' (:mod:`ylock.engines.sessions.ops`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ylock.engines.postgres.connection import Conn
from ylock.engines.sessions.ops import Claim, Open, Wait

__all__ = ["Cancel", "Claim", "Notified", "Op", "Open", "Query", "Sleep", "Stmt", "Wait"]


class Stmt(NamedTuple):
    """A statement to send: the name of a prepared one (:data:`~ylock.engines.postgres.sql.PREPARED`)
    or SQL text; its parameters (None: a simple statement, none at all); and what its owner
    says it is doing (``ylock.context``), which sends it unprepared with that in a leading
    comment."""

    sql: str
    params: Sequence[Any] | None = None
    said: str | None = None


class Query(NamedTuple):
    """Send ``stmts`` on ``conn`` (more than one in a pipeline: one round trip) and return
    the rows of each; give up at ``end`` (monotonic; None: never), closing the connection."""

    conn: Conn
    stmts: Sequence[Stmt]
    end: float | None


class Notified(NamedTuple):
    """Wait up to ``timeout`` seconds for a notification on ``conn`` (it LISTENs); return
    True if one came."""

    conn: Conn
    timeout: float


class Cancel(NamedTuple):
    """Cancel the exchange in flight on ``conn`` (``cancel`` False: only read its end) and
    return its outcome: its rows, or the error it ended with (never raised)."""

    conn: Conn
    end: float
    cancel: bool = True


class Sleep(NamedTuple):
    """Sleep ``seconds`` (a semaphore's head polling, in transaction scope)."""

    seconds: float


Op = Query | Open | Wait | Claim | Notified | Cancel | Sleep
