"""``flask ylock``: list held locks and waiters, inspect one, force-release one, show stats.

    flask ylock list [--group G] [--engine ALIAS] [--json]
    flask ylock inspect GROUP NAME [--engine ALIAS] [--json]
    flask ylock release GROUP NAME [--engine ALIAS] [--yes]
    flask ylock stats [--engine ALIAS] [--json]

The output is :mod:`ylock.report`'s, the same as ``manage.py ylock``'s.
"""
from __future__ import annotations

import json

import click
from flask import current_app
from flask.cli import AppGroup

import ylock
import ylock.metrics
from ylock import report
from ylock.engines.base import LockInfo
from ylock.registry import Registry

ylock_cli = AppGroup("ylock", help="Inspect and manage ylock distributed locks.")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _registry() -> Registry:
    state = current_app.extensions.get("ylock")
    if state is None:
        raise click.ClickException(f"ylock is not initialised on app {current_app.name!r}: did you forget to call "
                                   "`ylock.init_app(app)` (or `YLock(app)`)?")
    return state.registry  # type: ignore[no-any-return]


def _engine(alias: str) -> ylock.Engine:
    try:
        return _registry().engine(alias)
    except ylock.ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc


def _aliases(alias: str | None) -> list[str]:
    return [alias] if alias else _registry().aliases()


def _describe(alias: str, group: str | None) -> list[tuple[str, LockInfo]]:
    engine = _engine(alias)
    try:
        return [(alias, i) for i in sorted(engine.describe(group), key=lambda i: (i.group, i.name))]
    except ylock.EngineUnavailable as exc:
        raise click.ClickException(f"engine {alias!r} ({engine.url_for_display()}) is unreachable: {exc}") from exc


@ylock_cli.command("list")
@click.option("--group", default=None, help="Only this lock group.")
@click.option("--engine", "alias", default=None, help="Only this engine alias (default: every engine).")
@json_option
def list_command(group: str | None, alias: str | None, as_json: bool) -> None:
    """List held locks and their waiters."""
    infos = [row for a in _aliases(alias) for row in _describe(a, group)]
    click.echo(report.to_json(infos) if as_json else report.table(infos))


@ylock_cli.command("inspect")
@click.argument("group")
@click.argument("name")
@click.option("--engine", "alias", default="default", show_default=True, help="Engine alias.")
@json_option
def inspect_command(group: str, name: str, alias: str, as_json: bool) -> None:
    """Show one lock: mode, owners, queued waiters in order, lease left, fencing token."""
    info = report.find((i for _, i in _describe(alias, group)), name)
    if as_json:
        click.echo(json.dumps(None if info is None else report.rows([(alias, info)])[0], indent=2))
    else:
        click.echo(report.detail(alias, info, group, name))


@ylock_cli.command("release")
@click.argument("group")
@click.argument("name")
@click.option("--engine", "alias", default="default", show_default=True, help="Engine alias.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def release_command(group: str, name: str, alias: str, yes: bool) -> None:
    """Force-release a lock: drop every holder and waiter (holders learn it as a lost lock)."""
    engine = _engine(alias)
    if not yes:
        click.confirm(f"Force-release {group}/{name} on {alias}? Its holders will lose it", abort=True)
    try:
        released = engine.force_release(group, name)
    except ylock.EngineUnavailable as exc:
        raise click.ClickException(f"engine {alias!r} ({engine.url_for_display()}) is unreachable: {exc}") from exc
    click.echo(f"released {group}/{name}" if released else f"nothing to release: {group}/{name} was not held")


@ylock_cli.command("stats")
@click.option("--engine", "alias", default=None, help="Only this engine alias (default: every engine).")
@json_option
def stats_command(alias: str | None, as_json: bool) -> None:
    """Show held locks, readers and waiters per group, and this process's exporter counts."""
    groups: dict[str, dict[str, int]] = {}
    for _, i in (row for a in _aliases(alias) for row in _describe(a, None)):
        g = groups.setdefault(i.group, {"held": 0, "readers": 0, "waiters": 0})
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
