"""The operations the MySQL engine's steps yield, one named type each (see
:func:`ylock.engines.base.run_steps`): the executor (:mod:`~ylock.engines.mysql.executor`)
does each blocking or awaited, so the same steps serve the blocking API and asyncio.
``Open``, ``Wait`` and ``Claim`` are the session engines' (:mod:`ylock.engines.sessions.ops`)."""
from __future__ import annotations

from typing import NamedTuple

from ylock.engines.mysql.connection import Conn
from ylock.engines.sessions.ops import Claim, Open, Wait

__all__ = ["Claim", "Op", "Open", "Query", "Wait"]


class Query(NamedTuple):
    """Send ``sql`` (one or more statements: one round trip) on ``conn`` and return the rows
    of each statement; give up at ``end`` (monotonic; None: never), closing the connection."""

    conn: Conn
    sql: str
    end: float | None


Op = Query | Open | Wait | Claim
