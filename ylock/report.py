"""Render what engines say they hold (:class:`~ylock.LockInfo`) for people and scripts;
shared by every command line (``manage.py ylock``, ``flask ylock``) so all print the same.
(What a refused request answers is :mod:`ylock.web`'s.)"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from ylock.engines.base import LockInfo

COLUMNS = ("ENGINE", "GROUP", "NAME", "MODE", "OWNERS", "WAITERS", "TTL", "TOKEN")


def rows(infos: Iterable[tuple[str, LockInfo]]) -> list[dict[str, object]]:
    """Return JSON-ready dicts (the ``--json`` output), one per (engine alias, lock)."""
    return [{"engine": alias, **info.as_dict()} for alias, info in infos]


def to_json(infos: Iterable[tuple[str, LockInfo]]) -> str:
    """Return the JSON list printed by ``ylock list --json``."""
    return json.dumps(rows(infos), indent=2)


def table(infos: Sequence[tuple[str, LockInfo]]) -> str:
    """Return an aligned text table of held locks and their waiters."""
    if not infos:
        return "no locks held or waited for"
    lines = [COLUMNS]
    for alias, i in infos:
        ttl = "-" if i.ttl is None else f"{i.ttl:.1f}s"
        lines.append((alias, i.group, i.name, i.mode or "-", ", ".join(i.owners) or "-",
                      ", ".join(i.waiters) or "-", ttl, "-" if i.token is None else str(i.token)))
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(COLUMNS))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)


def detail(alias: str, info: LockInfo | None, group: str, name: str) -> str:
    """Return a multi-line description of one lock (``ylock inspect``)."""
    if info is None:
        return f"{group}/{name} on {alias}: free, nobody waiting"
    out = [f"{group}/{name} on {alias}",
           f"  mode:    {info.mode or 'free'}",
           f"  owners:  {', '.join(info.owners) or '-'}",
           f"  ttl:     {'-' if info.ttl is None else f'{info.ttl:.1f}s'}",
           f"  token:   {'-' if info.token is None else info.token}",
           f"  waiters: {len(info.waiters)}"]
    out.extend(f"    {i + 1}. {w}" for i, w in enumerate(info.waiters))
    return "\n".join(out)


def find(infos: Iterable[LockInfo], name: str) -> LockInfo | None:
    """Return the entry for ``name`` among one group's locks, or None."""
    return next((i for i in infos if i.name == name), None)
