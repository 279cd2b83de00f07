"""``manage.py ylock``: list held locks and waiters, inspect or force-release one, show the
deployment's stats, run a command while holding a named lock.

    python manage.py ylock list [--group G] [--limit N] [--engine ALIAS] [--json]
    python manage.py ylock inspect GROUP NAME [--engine ALIAS] [--json]
    python manage.py ylock release GROUP NAME [--engine ALIAS] [--yes]
    python manage.py ylock stats [--engine ALIAS] [--json]
    python manage.py ylock run NAME [--wait | --timeout S] [--lease S] [--grace S] -- COMMAND ...

Every verb is :mod:`ylock.cli`'s (the ``ylock`` script's): this command only turns the
``YLOCK`` setting into engines and named locks, so it prints what ``ylock`` and ``flask
ylock`` print, and exits with the same codes. The hold of ``run`` says what it is doing
(``ylock list``, the admin page): ``"manage.py ylock run backup.sh"``, the command's name
without its arguments (they may hold secrets).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import ylock
from django_ylock import registry as reg
from ylock import cli


class Command(BaseCommand):
    help = "Show and manage ylock distributed locks: list, inspect, release, stats, run."
    #: ``call_command("ylock", "release", ..., stdin=io.StringIO("y\n"))`` answers the question.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{list,inspect,release,stats,run}")
        cli.add_verbs(sub, engines=True, named=True)

    def handle(self, *args: Any, **options: Any) -> None:
        registry = reg.registry()
        console = cli.Console(lambda text: self.stdout.write(text, ending=""), options.get("stdin"))
        command = options.get("command") or [""]
        try:
            with ylock.context(f"manage.py ylock {options['action']} {os.path.basename(command[0])}".rstrip()):
                code = cli.execute_in(registry, options["action"], options, console)
        except cli.CommandFailed as exc:
            raise CommandError(str(exc), returncode=exc.code) from exc
        except ylock.LockError as exc:
            raise CommandError(" ".join(str(exc).split())) from exc
        if code:
            self.stdout.flush()
            sys.exit(code)
