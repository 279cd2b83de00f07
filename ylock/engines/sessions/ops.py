"""The operations both session engines' steps yield besides their queries, one named type
each (see :func:`ylock.engines.base.run_steps`): the executor does each blocking or
awaited, so the same steps serve the blocking API and asyncio. Each engine adds its
``Query`` (what it sends differs: statements with parameters, or SQL text) and its own."""
from __future__ import annotations

from typing import NamedTuple

from ylock.engines.base import Mailbox
from ylock.engines.sessions.connection import SessionConn


class Open(NamedTuple):
    """Open a lock connection and set it up; return it. Give up at ``end``."""

    end: float


class Wait(NamedTuple):
    """Wait up to ``timeout`` seconds (None: forever) for what ``mailbox`` is handed (a
    pooled connection given back, or a slot to open one); return it, or None."""

    mailbox: Mailbox
    timeout: float | None


class Claim(NamedTuple):
    """Take ``conn.busy`` (the watchdog's heartbeat may be on it: one round trip at most);
    give up at ``end``."""

    conn: SessionConn
    end: float
