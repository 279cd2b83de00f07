"""The operations the MySQL engine's steps yield, one named type each (see
:func:`ylock.engines.base.run_steps`): the executor (:mod:`~ylock.engines.mysql.executor`)
does each blocking or awaited, so the same steps serve the blocking API and asyncio."""
from __future__ import annotations

from typing import NamedTuple

from ylock.engines.base import Mailbox
from ylock.engines.mysql.connection import Conn


class Query(NamedTuple):
    """Send ``sql`` (one or more statements: one round trip) on ``conn`` and return the rows
    of each statement; give up at ``end`` (monotonic; None: never), closing the connection."""

    conn: Conn
    sql: str
    end: float | None


class Open(NamedTuple):
    """Open a lock connection and set it up; return it (a :class:`Conn`). Give up at ``end``."""

    end: float


class Wait(NamedTuple):
    """Wait up to ``timeout`` seconds (None: forever) for what ``mailbox`` is handed (a
    pooled connection given back, or a slot to open one); return it, or None."""

    mailbox: Mailbox
    timeout: float | None


class Claim(NamedTuple):
    """Take ``conn.busy`` (the watchdog's heartbeat may be on it: one round trip at most);
    give up at ``end``."""

    conn: Conn
    end: float


Op = Query | Open | Wait | Claim
