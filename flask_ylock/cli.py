"""``flask ylock``: list held locks and waiters, inspect or force-release one, show the
deployment's stats, run a command while holding a named lock.

    flask ylock list [--group G] [--limit N] [--engine ALIAS] [--json]
    flask ylock inspect GROUP NAME [--engine ALIAS] [--json]
    flask ylock release GROUP NAME [--engine ALIAS] [--yes]
    flask ylock stats [--engine ALIAS] [--json]
    flask ylock run NAME [--wait | --timeout S] [--lease S] [--grace S] -- COMMAND ...

Every verb is :mod:`ylock.cli`'s (the ``ylock`` script's): this module only turns the app's
``YLOCK_*`` config into engines and named locks, so it prints what ``ylock`` and
``manage.py ylock`` print, and exits with the same codes. The hold of ``run`` says what it
is doing (``ylock list``): ``"flask ylock run backup.sh"``, the command's name without its
arguments (they may hold secrets).
"""
from __future__ import annotations

import os
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup

import ylock
from ylock import cli
from ylock.registry import Registry

ylock_cli = AppGroup("ylock", help="Inspect and manage ylock distributed locks.")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _registry() -> Registry:
    state = current_app.extensions.get("ylock")
    if state is None:
        raise click.ClickException(f"ylock is not initialised on app {current_app.name!r}: did you forget to call "
                                   "`ylock.init_app(app)` (or `YLock(app)`)?")
    return state.registry  # type: ignore[no-any-return]


def _execute(action: str, **options: Any) -> None:
    registry = _registry()
    console = cli.Console(lambda text: click.echo(text, nl=False))
    command = options.get("command") or [""]
    try:
        with ylock.context(f"flask ylock {action} {os.path.basename(command[0])}".rstrip()):
            code = cli.execute_in(registry, action, options, console)
    except cli.CommandFailed as exc:
        error = click.ClickException(str(exc))
        error.exit_code = exc.code
        raise error from exc
    except ylock.LockError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from exc
    if code:
        click.get_current_context().exit(code)


engine_every = click.option("--engine", default=None, metavar="ALIAS",
                            help="Only this engine alias (default: every engine).")
engine_one = click.option("--engine", default=None, metavar="ALIAS", help="Engine alias (default: default).")


@ylock_cli.command("list")
@click.option("--group", default=None, help="Only this lock group.")
@click.option("--limit", type=int, default=None, metavar="N",
              help="At most N locks per engine, the first by group and name (and how many there are).")
@engine_every
@json_option
def list_command(**options: Any) -> None:
    """List held locks and their waiters."""
    _execute("list", **options)


@ylock_cli.command("inspect")
@click.argument("group")
@click.argument("name")
@engine_one
@json_option
def inspect_command(**options: Any) -> None:
    """Show one lock: mode, owners, queued waiters in order, lease left, fencing token."""
    _execute("inspect", **options)


@ylock_cli.command("release")
@click.argument("group")
@click.argument("name")
@engine_one
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def release_command(**options: Any) -> None:
    """Force-release a lock (asks first): its holders learn it as a lost lock."""
    _execute("release", **options)


@ylock_cli.command("stats")
@engine_every
@json_option
def stats_command(**options: Any) -> None:
    """Show what is held now, and every process's lock activity of the last minutes."""
    _execute("stats", **options)


@ylock_cli.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("lock", metavar="NAME")
@click.option("--wait", is_flag=True, help="Wait as long as it takes for the lock.")
@click.option("--timeout", type=float, default=None, metavar="S", help="Wait up to S seconds (default: try once).")
@click.option("--lease", type=float, default=None, metavar="S", help="The lease (default: the lock's).")
@click.option("--grace", type=float, default=None, metavar="S",
              help="Seconds between SIGTERM and SIGKILL when the hold is lost (default 10).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(**options: Any) -> None:
    """Run COMMAND only while holding the named lock's write side; stop it if the hold is lost.

    Exit codes: the command's own; 75 the lock was busy; 76 the hold was lost; 126/127 the
    command could not be run / was not found; 1 an error.
    """
    _execute("run", **options)
