"""What the PostgreSQL engine's locks look like from outside.

``describe`` reads ``pg_locks`` and ``pg_stat_activity``: a key is named through the
``<prefix>_names`` table (written on the first use of a name), a holder or waiter through
its connection's ``application_name`` (``token:owner``, a waiter's ``:owner``; up to 63
bytes: a longer owner id is cut), what it is doing through the leading comment of the
statement it ran last, and since when through that statement's start. (A ticket's
adoption, which hands the hold's connection to its new owner, is the steps'.)
"""
from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, LockInfo, holder_context
from ylock.engines.postgres.wire import Row


class Who(NamedTuple):
    """A holder or waiter as ``describe`` finds it: its token and owner (from its
    connection's application name ``token:owner``, a waiter's ``:owner``), what it said it
    is doing (the comment of the statement it ran last) and since when (that statement's
    start: when it queued, or took the lock without waiting)."""

    token: int | None
    owner: str
    said: str | None
    since: float | None


class Seen(NamedTuple):
    """One row of ``pg_locks`` for a key: the lock mode, whether it is granted, and who."""

    mode: str
    granted: bool
    who: Who


def who(app: bytes | None, pid: bytes | None, query: bytes | None, since: bytes | None) -> Who:
    """Return who a session is, from its application name, pid, last statement and its start."""
    text = (app or b"").decode("utf-8", "replace")
    token, sep, owner = text.partition(":")
    if not sep or not (token.isdigit() or token == ""):
        token, owner = "", f"pid:{(pid or b'?').decode()}"
    said = None
    statement = (query or b"").decode("utf-8", "replace")
    if statement.startswith("/* ylock:") and " */" in statement:
        said = statement[9:statement.index(" */")]
    return Who(int(token) if token else None, owner, said, float(since) if since else None)


def _contexts(people: Sequence[Who]) -> dict[str, dict[str, Any]]:
    return {w.owner: holder_context(w.owner, w.since, w.said) for w in people}


def lock_infos(rows: Sequence[Row]) -> list[LockInfo]:
    """Return the locks and semaphores that the rows of ``Statements.describe`` show."""
    locks: dict[tuple[str, str, str], dict[str, Any]] = {}
    queues: dict[tuple[str, str], list[Seen]] = collections.defaultdict(list)
    for kind_b, grp_b, name_b, permits, mode_b, granted, app, pid, query, since in rows:
        kind, grp, name = _text(kind_b), _text(grp_b), _text(name_b)
        seen = Seen(_text(mode_b), granted == b"t", who(app, pid, query, since))
        if kind == "queue":
            queues[(grp, name)].append(seen)
            continue
        entry = locks.setdefault((grp, name, kind), {"rows": [], "permits": permits})
        entry["rows"].append(seen)
    for grp, name in queues:
        locks.setdefault((grp, name, SEMAPHORE), {"rows": [], "permits": None})
    infos = []
    for (grp, name, kind), entry in sorted(locks.items()):
        holders = [s for s in entry["rows"] if s.granted]
        waiting = [s for s in entry["rows"] if not s.granted]
        owners: list[str] = []
        for s in holders:
            if s.who.owner not in owners:
                owners.append(s.who.owner)
        token = max((s.who.token for s in holders if s.who.token is not None), default=None)
        if kind == SEMAPHORE:
            q = queues.get((grp, name), [])
            line = [s.who for s in q if s.granted and s.who.owner not in owners] + [s.who for s in q if not s.granted]
            everyone = [s.who for s in holders] + line
            infos.append(LockInfo(grp, name, PERMIT if owners else None, tuple(owners),
                                  tuple(f"permit:{w.owner}" for w in line), None, token, SEMAPHORE,
                                  None if entry["permits"] is None else int(entry["permits"]),
                                  _contexts(everyone)))
            continue
        mode = WRITE if any(s.mode == "ExclusiveLock" for s in holders) else READ if holders else None
        infos.append(LockInfo(grp, name, mode, tuple(owners),
                              tuple(f"{WRITE if s.mode == 'ExclusiveLock' else READ}:{s.who.owner}" for s in waiting),
                              None, token, LOCK, None, _contexts([s.who for s in holders + waiting])))
    return infos


def _text(value: bytes | None) -> str:
    return (value or b"").decode()
