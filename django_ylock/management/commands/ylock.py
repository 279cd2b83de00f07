"""``manage.py ylock``: list held locks and waiters, inspect or force-release one, stats."""
from __future__ import annotations

import getpass
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import ylock
from django_ylock import registry as reg
from ylock import report

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Show and manage ylock distributed locks: list, inspect, release, stats."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{list,inspect,release,stats}")
        listing = sub.add_parser("list", help="held locks and waiters on every engine")
        listing.add_argument("--json", action="store_true", help="print a JSON list")
        listing.add_argument("--group", help="only this lock group")
        listing.add_argument("--engine", help="only this engine alias")
        inspect = sub.add_parser("inspect", help="one lock: mode, owners, ttl, token, waiters")
        inspect.add_argument("group")
        inspect.add_argument("name")
        inspect.add_argument("--engine", default="default")
        inspect.add_argument("--json", action="store_true")
        release = sub.add_parser("release", help="force-release one lock (its holders are reported lost)")
        release.add_argument("group")
        release.add_argument("name")
        release.add_argument("--engine", default="default")
        release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        stats = sub.add_parser("stats", help="this process's lock metrics (needs YLOCK['METRICS'])")
        stats.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"do_{options['action']}")(**options)
        except ylock.EngineUnavailable as exc:
            raise CommandError(f"engine unreachable: {exc}") from exc
        except ylock.ConfigurationError as exc:
            raise CommandError(f"invalid YLOCK setting: {exc}") from exc

    def _engines(self, alias: str | None) -> list[tuple[str, ylock.Engine]]:
        registry = reg.registry()
        aliases = registry.aliases()
        if alias is not None and alias not in aliases:
            raise CommandError(f"no engine {alias!r} in YLOCK['ENGINES'] (defined: {aliases})")
        return [(a, registry.engine(a)) for a in ([alias] if alias else aliases)]

    def do_list(self, *, json: bool = False, group: str | None = None, engine: str | None = None,
                **_: Any) -> None:
        found = [(alias, info) for alias, eng in self._engines(engine) for info in eng.describe(group)]
        self.stdout.write(report.to_json(found) if json else report.table(found))

    def do_inspect(self, *, group: str, name: str, engine: str, json: bool = False, **_: Any) -> None:
        (alias, eng), = self._engines(engine)
        info = report.find(eng.describe(group), name)
        if json:
            self.stdout.write(report.to_json([(alias, info)] if info else []))
        else:
            self.stdout.write(report.detail(alias, info, group, name))

    def do_release(self, *, group: str, name: str, engine: str, yes: bool = False, **_: Any) -> None:
        (alias, eng), = self._engines(engine)
        if not yes:
            if not sys.stdin.isatty():
                raise CommandError("refusing to force-release without confirmation: add --yes")
            answer = input(f"Force-release {group}/{name} on {alias}? Its holders lose it. [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                self.stdout.write("not released")
                return
        had = eng.force_release(group, name)
        logger.warning("ylock: %s force-released %s/%s on %s (%s)", getpass.getuser(), group, name, alias,
                       "it was held" if had else "it was free")
        self.stdout.write(f"released {group}/{name} on {alias}" if had else f"{group}/{name} on {alias} was not held")

    def do_stats(self, *, json: bool = False, **_: Any) -> None:
        try:
            import ylock.metrics
        except ImportError as exc:
            raise CommandError(f"metrics need the 'influxdb' or 'prometheus' extra: {exc}") from exc
        data = ylock.metrics.stats()
        if json:
            self.stdout.write(globals()["json"].dumps(data, indent=2, default=str))
            return
        groups = data.get("groups") or {}
        if not groups:
            self.stdout.write("no lock activity recorded in this process (enable YLOCK['METRICS'])")
        for group, values in sorted(groups.items()):
            self.stdout.write(f"{group}: {values}")
        for kind, values in (data.get("exporters") or {}).items():
            self.stdout.write(f"exporter {kind}: {values}")
