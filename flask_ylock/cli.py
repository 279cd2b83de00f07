"""``flask ylock``: list held locks and waiters, inspect one, force-release one, show stats.

    flask ylock list [--group G] [--engine ALIAS] [--json]
    flask ylock inspect GROUP NAME [--engine ALIAS] [--json]
    flask ylock release GROUP NAME [--engine ALIAS] [--yes]
    flask ylock stats [--engine ALIAS] [--json]
"""
from __future__ import annotations

import json
from typing import Any

import click
from flask.cli import AppGroup

import ylock
import ylock.metrics
from ylock.engines.base import LockInfo

ylock_cli = AppGroup("ylock", help="Inspect and manage ylock distributed locks.")

engine_option = click.option("--engine", "alias", default="default", show_default=True,
                             help="Engine alias (YLOCK_ENGINES).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _engine(alias: str) -> ylock.Engine:
    from flask_ylock.extension import YLock

    try:
        return YLock.state().registry.engine(alias)  # type: ignore[no-any-return]
    except ylock.ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc


def _describe(engine: ylock.Engine, group: str | None) -> list[LockInfo]:
    try:
        return sorted(engine.describe(group), key=lambda i: (i.group, i.name))
    except ylock.EngineUnavailable as exc:
        raise click.ClickException(f"engine {engine.url_for_display()} is unreachable: {exc}") from exc


def _report() -> Any:
    try:
        import importlib
        # The table/JSON formatting shared with the Django command, once it is there.
        return importlib.import_module("ylock.report")
    except ImportError:
        return None


def format_table(infos: list[LockInfo]) -> str:
    """Return ``infos`` as a plain-text table (or a line saying nothing is held)."""
    report = _report()
    if report is not None and hasattr(report, "format_table"):
        return report.format_table(infos)  # type: ignore[no-any-return]
    if not infos:
        return "no locks held or waited for"
    rows = [("GROUP", "NAME", "MODE", "OWNERS", "WAITERS", "TTL", "TOKEN")]
    for i in infos:
        rows.append((i.group, i.name, i.mode or "-", ",".join(i.owners) or "-", str(len(i.waiters)),
                     "-" if i.ttl is None else f"{i.ttl:.1f}s", "-" if i.token is None else str(i.token)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def format_json(infos: list[LockInfo]) -> str:
    """Return ``infos`` as a JSON list of dicts (group, name, mode, owners, waiters, ttl, token)."""
    report = _report()
    if report is not None and hasattr(report, "format_json"):
        return report.format_json(infos)  # type: ignore[no-any-return]
    return json.dumps([i.as_dict() for i in infos], indent=2)


@ylock_cli.command("list")
@click.option("--group", default=None, help="Only this lock group.")
@engine_option
@json_option
def list_command(group: str | None, alias: str, as_json: bool) -> None:
    """List held locks and their waiters."""
    infos = _describe(_engine(alias), group)
    click.echo(format_json(infos) if as_json else format_table(infos))


@ylock_cli.command("inspect")
@click.argument("group")
@click.argument("name")
@engine_option
@json_option
def inspect_command(group: str, name: str, alias: str, as_json: bool) -> None:
    """Show one lock: mode, owners, queued waiters in order, lease left, fencing token."""
    found = [i for i in _describe(_engine(alias), group) if i.name == name]
    if not found:
        raise click.ClickException(f"lock {group}/{name} is neither held nor waited for")
    info = found[0]
    if as_json:
        click.echo(json.dumps(info.as_dict(), indent=2))
        return
    click.echo(f"lock:    {info.group}/{info.name}")
    click.echo(f"mode:    {info.mode or '-'}")
    click.echo(f"owners:  {', '.join(info.owners) or '-'}")
    click.echo(f"ttl:     {'-' if info.ttl is None else f'{info.ttl:.1f}s'}")
    click.echo(f"token:   {'-' if info.token is None else info.token}")
    click.echo(f"waiters: {len(info.waiters)}")
    for n, waiter in enumerate(info.waiters, 1):
        click.echo(f"  {n}. {waiter}")


@ylock_cli.command("release")
@click.argument("group")
@click.argument("name")
@engine_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def release_command(group: str, name: str, alias: str, yes: bool) -> None:
    """Force-release a lock: drop every holder and waiter (holders learn it as a lost lock)."""
    engine = _engine(alias)
    if not yes:
        click.confirm(f"Force-release {group}/{name} on {engine.url_for_display()}? Its holders will lose it",
                      abort=True)
    try:
        released = engine.force_release(group, name)
    except ylock.EngineUnavailable as exc:
        raise click.ClickException(f"engine {engine.url_for_display()} is unreachable: {exc}") from exc
    click.echo(f"released {group}/{name}" if released else f"nothing to release: {group}/{name} was not held")


@ylock_cli.command("stats")
@engine_option
@json_option
def stats_command(alias: str, as_json: bool) -> None:
    """Show held locks and waiters per group, and this process's lock metrics."""
    infos = _describe(_engine(alias), None)
    groups: dict[str, dict[str, int]] = {}
    for i in infos:
        g = groups.setdefault(i.group, {"held": 0, "waiters": 0, "readers": 0})
        g["held"] += 1 if i.mode else 0
        g["readers"] += len(i.owners) if i.mode == "read" else 0
        g["waiters"] += len(i.waiters)
    process = ylock.metrics.stats()
    if as_json:
        click.echo(json.dumps({"groups": groups, "process": process}, indent=2, default=str))
        return
    if not groups:
        click.echo("no locks held or waited for")
    else:
        width = max(len("GROUP"), *(len(g) for g in groups))
        click.echo(f"{'GROUP'.ljust(width)}  HELD  READERS  WAITERS")
        for name, g in sorted(groups.items()):
            click.echo(f"{name.ljust(width)}  {g['held']:>4}  {g['readers']:>7}  {g['waiters']:>7}")
    for kind, s in sorted(process["exporters"].items()):
        click.echo(f"exporter {kind}: shipped {s['shipped']}, dropped {s['dropped']}, failed {s['failed']}, "
                   f"queued {s['queued']}/{s['capacity']}")
