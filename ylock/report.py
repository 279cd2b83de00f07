"""Render what engines say they hold (:class:`~ylock.LockInfo`) and the deployment's lock
statistics for people (tables) and scripts (JSON); the verbs of :mod:`ylock.cli`, which
every command line runs (``ylock``, ``manage.py ylock``, ``flask ylock``), print only
this, so all print the same. (What a refused request answers is :mod:`ylock.web`'s.)"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ylock.engines.base import LockInfo

COLUMNS = ("ENGINE", "GROUP", "NAME", "MODE", "OWNERS", "WAITERS", "TTL", "TOKEN")


def rows(infos: Iterable[tuple[str, LockInfo]]) -> list[dict[str, object]]:
    """Return JSON-ready dicts (the ``--json`` output), one per (engine alias, lock)."""
    return [{"engine": alias, **info.as_dict()} for alias, info in infos]


def to_json(infos: Iterable[tuple[str, LockInfo]]) -> str:
    """Return the JSON list printed by ``ylock list --json``."""
    return json.dumps(rows(infos), indent=2)


def to_json_one(alias: str, info: LockInfo | None) -> str:
    """Return the JSON object printed by ``ylock inspect --json`` (``null`` for a free lock)."""
    return json.dumps(None if info is None else rows([(alias, info)])[0], indent=2)


def table(infos: Sequence[tuple[str, LockInfo]]) -> str:
    """Return an aligned text table of held locks and their waiters; under each lock's row,
    one indented line per holder that said what it is doing (as ``inspect`` shows it)."""
    if not infos:
        return "no locks held or waited for"
    lines = [COLUMNS]
    for alias, i in infos:
        ttl = "-" if i.ttl is None else f"{i.ttl:.1f}s"
        name = i.name if i.kind != "semaphore" else f"{i.name} ({len(i.owners)}/{i.permits} permits)"
        lines.append((alias, i.group, name, i.mode or "-", ", ".join(_owner(i, o) for o in i.owners) or "-",
                      ", ".join(i.waiters) or "-", ttl, "-" if i.token is None else str(i.token)))
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(COLUMNS))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(lines[0], widths)).rstrip()]
    for (_, i), line in zip(infos, lines[1:]):
        out.append("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
        # Below the row, not in a column: a read lock's many holders each say something, and
        # the columns stay what scripts that split the table expect (--json is for scripts).
        out.extend(f"    {o}: {_doing(i.context[o])}" for o in i.owners if o in i.context)
    return "\n".join(out)


def detail(alias: str, info: LockInfo | None, group: str, name: str) -> str:
    """Return a multi-line description of one lock (``ylock inspect``)."""
    if info is None:
        return f"{group}/{name} on {alias}: free, nobody waiting"
    out = [f"{group}/{name} on {alias}" + (f" (a semaphore of {info.permits} permits)" if info.kind == "semaphore"
                                           else ""),
           f"  mode:    {info.mode or 'free'}",
           f"  owners:  {', '.join(_owner(info, o) for o in info.owners) or '-'}"]
    out.extend(f"    {o}: {_doing(info.context[o])}" for o in info.owners if o in info.context)
    out += [f"  ttl:     {'-' if info.ttl is None else f'{info.ttl:.1f}s'}",
            f"  token:   {'-' if info.token is None else info.token}",
            f"  waiters: {len(info.waiters)}"]
    out.extend(f"    {i + 1}. {w}" for i, w in enumerate(info.waiters))
    return "\n".join(out)


def _owner(info: LockInfo, owner: str) -> str:
    """An owner id, marked when its process is gone from this host (its lease frees it)."""
    return f"{owner} (stale)" if info.context.get(owner, {}).get("stale") else owner


def _doing(said: Mapping[str, Any]) -> str:
    """What a holder said it is doing, how long ago it took the hold, and whether it is stale."""
    fields = {k: v for k, v in said.items() if k not in ("what", "host", "pid", "since", "stale", "traceparent")}
    parts = [str(said["what"])] if said.get("what") else []
    parts += [f"{k}={v}" for k, v in fields.items()]
    if isinstance(said.get("since"), (int, float)):
        parts.append(f"for {max(0.0, time.time() - said['since']):.0f}s")
    if said.get("stale"):
        parts.append("STALE: its process is gone; its lease frees it")
    return ", ".join(parts) or "-"


def find(infos: Iterable[LockInfo], name: str) -> LockInfo | None:
    """Return the entry for ``name`` among one group's locks, or None."""
    return next((i for i in infos if i.name == name), None)


# -- statistics ---------------------------------------------------------------------------------

STATS_COLUMNS = ("GROUP", "HELD", "READERS", "WAITERS", "ACQUIRED", "TIMED OUT", "LOST",
                 "WAIT p50/p99/max", "HOLD p50/p99/max", "PROCESSES")
PROCESS_COLUMNS = ("PROCESS", "ENGINES", "PUBLISHED", "ACQUIRED", "TIMED OUT", "LOST", "EXPORTERS")


def stats_json(stats: Mapping[str, Any]) -> str:
    """Return the JSON printed by ``ylock stats --json`` (the dict that
    :func:`ylock.cli.collect_stats` builds)."""
    return json.dumps(stats, indent=2, default=str)


def stats_table(stats: Mapping[str, Any]) -> str:
    """Return the text printed by ``ylock stats``: per group, what is held now and the
    published activity of the last minutes; then one line per publishing process."""
    groups: Mapping[str, Any] = stats["groups"]
    processes: Mapping[str, Any] = stats["processes"]
    minutes = f"{stats['window'] / 60:g} min"
    if not groups:
        return (f"no locks held or waited for, and no lock activity published in the last {minutes} "
                "(processes publish theirs while their metrics are on: YLOCK['METRICS'], YLOCK_METRICS "
                "or ylock.metrics.configure())")
    lines: list[tuple[str, ...]] = [STATS_COLUMNS]
    for group, g in groups.items():
        counts = g.get("counts", {})
        lines.append((group, str(g["held"]), str(g["readers"]), str(g["waiters"]),
                      str(counts.get("acquired", 0)), str(counts.get("timed_out", 0)), str(counts.get("lost", 0)),
                      _spread(g.get("wait")), _spread(g.get("hold")), str(g.get("processes", 0))))
    out = [_align(lines, right=range(1, 7))]
    out.append(f"activity: the last {minutes}, published by {len(processes)} process"
               f"{'' if len(processes) == 1 else 'es'}; percentiles approximate (at most 9.1% high)")
    if processes:
        lines = [PROCESS_COLUMNS]
        for process, p in processes.items():
            totals: dict[str, int] = {}
            for g in p["groups"].values():
                for kind, n in g.get("counts", {}).items():
                    totals[kind] = totals.get(kind, 0) + n
            exporters = ", ".join(f"{kind}: shipped {e.get('shipped', 0)} dropped {e.get('dropped', 0)} "
                                  f"failed {e.get('failed', 0)}" for kind, e in sorted(p["exporters"].items()))
            lines.append((process, ",".join(p["found_on"]), f"{p['age']:.0f}s ago", str(totals.get("acquired", 0)),
                          str(totals.get("timed_out", 0)), str(totals.get("lost", 0)), exporters or "-"))
        out.append("")
        out.append(_align(lines, right=range(3, 6)))
    return "\n".join(out)


def duration(seconds: float | None) -> str:
    """Return ``seconds`` for people: ``"850us"``, ``"12.5ms"``, ``"3.20s"``, ``"-"`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds:.2f}s"


def _spread(summary: Mapping[str, Any] | None) -> str:
    if not summary or not summary.get("count"):
        return "-"
    return "/".join(duration(summary.get(k)) for k in ("p50", "p99", "max"))


def _align(lines: Sequence[tuple[str, ...]], right: Iterable[int] = ()) -> str:
    numeric = set(right)
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    return "\n".join("  ".join(v.rjust(w) if c in numeric and i else v.ljust(w)
                               for c, (v, w) in enumerate(zip(line, widths))).rstrip()
                     for i, line in enumerate(lines))
