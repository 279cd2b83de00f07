"""What the MySQL engine's locks look like from outside.

``describe`` reads two things in one round trip: the live rows of the holds table (a row
whose mark is free is a dead holder's and is left out), and the process list's waiting
statements, whose leading comment (``/*ylock {...}*/``) says who waits for what and what
they said; how long each has waited orders them (MariaDB: to the millisecond, MySQL 8: to
the second), the head of a queue (a writer waiting for readers to leave, a semaphore's
head) first. The process list shows only the sessions of the engine's own user unless it
has the PROCESS privilege.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, LockInfo, holder_context
from ylock.engines.mysql.wire import Row


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


def waiting(rows: Sequence[Row], group: str | None) -> list[dict[str, Any]]:
    """The waiters the process list shows (their comments, parsed), in queue order."""
    found = []
    for _, info, elapsed, now in rows:
        statement = _text(info)
        end = statement.find("*/")
        try:
            said = json.loads(statement[8:end].replace("*\\/", "*/"))
        except ValueError:
            continue
        if not isinstance(said, dict) or (group is not None and said.get("g") != group):
            continue
        waited = float(elapsed or 0) / 1000
        queued = said.get("t")
        said["since"] = float(queued) if isinstance(queued, (int, float)) else float(now or time.time()) - waited
        said["waited"] = waited
        found.append(said)
    found.sort(key=lambda w: (not w.get("h"), -w["waited"]))
    return found


def lock_infos(holds: Sequence[Row], processes: Sequence[Row], group: str | None) -> list[LockInfo]:
    """Return the locks and semaphores that the rows of ``Statements.describe`` show."""
    entries: dict[tuple[str, str, str], dict[str, Any]] = {}
    for h_token, h_kind, h_mode, h_grp, h_name, h_owner, h_said, h_since, h_permits, _ in holds:
        key = (_text(h_grp), _text(h_name), _text(h_kind))
        entry = entries.setdefault(key, {"holds": [], "waiters": [], "permits": None})
        entry["holds"].append((int(h_token or 0), _text(h_mode), _text(h_owner), h_said, float(h_since or 0)))
        if h_permits is not None:
            entry["permits"] = int(h_permits)
    for w in waiting(processes, group):
        key = (str(w.get("g")), str(w.get("n")), str(w.get("c")))
        entry = entries.setdefault(key, {"holds": [], "waiters": [], "permits": None})
        if not any(x["o"] == w.get("o") for x in entry["waiters"]):
            entry["waiters"].append(w)
        if entry["permits"] is None and w.get("p") is not None:
            entry["permits"] = int(w["p"])
    infos = []
    for (grp, name, kind), entry in sorted(entries.items()):
        holds_of: list[tuple[int, str, str, Any, float]] = entry["holds"]
        owners: list[str] = []
        for _, _, owner, _, _ in holds_of:
            if owner not in owners:
                owners.append(owner)
        token = max((h[0] for h in holds_of), default=None)
        context: dict[str, Any] = {o: holder_context(o, since, said) for _, _, o, said, since in holds_of}
        for w in entry["waiters"]:
            context.setdefault(str(w.get("o")), holder_context(str(w.get("o")), w["since"], w.get("s")))
        if kind == SEMAPHORE:
            infos.append(LockInfo(grp, name, PERMIT if owners else None, tuple(owners),
                                  tuple(f"permit:{w.get('o')}" for w in entry["waiters"]), None, token, SEMAPHORE,
                                  entry["permits"], context))
            continue
        mode = WRITE if any(h[1] == WRITE for h in holds_of) else READ if holds_of else None
        infos.append(LockInfo(grp, name, mode, tuple(owners),
                              tuple(f"{w.get('m')}:{w.get('o')}" for w in entry["waiters"]), None, token, LOCK,
                              None, context))
    return [i for i in infos if i.kind in (LOCK, SEMAPHORE)]
