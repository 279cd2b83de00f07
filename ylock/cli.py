"""``ylock``: the framework-free command line, and the one implementation of its verbs that
``manage.py ylock`` and ``flask ylock`` run too (they only turn their settings into
engines and named locks), so all three print the same for the same data::

    ylock --url URL list [--group G] [--limit N] [--json]   held locks, their owners and queued waiters
    ylock --url URL inspect GROUP NAME [--json]        one lock
    ylock --url URL release GROUP NAME [--yes]         force-release (asks first; logged with your name)
    ylock --url URL stats [--json]                     what is held now, and every process's activity
                                                       of the last 5 minutes (see ylock.metrics.shared)
    ylock --url URL run --lock GROUP/NAME [--wait | --timeout S] [--lease S] [--grace S] -- COMMAND ...
                                                       run COMMAND only while holding the write lock

    python manage.py ylock list|inspect|release|stats [--engine ALIAS] ...
    python manage.py ylock run NAME [--wait | --timeout S] [--lease S] [--grace S] -- COMMAND ...
    flask ylock ...                                    the same as manage.py ylock

``--url`` defaults to ``$YLOCK_URL``. ``release`` reads its confirmation from standard
input, a terminal or not (``yes | ylock release orders global``); no answer (end of input)
releases nothing.

Exit codes: ``0`` done; ``1`` an error (an engine that cannot be reached, a bad URL or
setting, a release that was not confirmed), said in one line on standard error; ``2`` a
usage error; ``run`` exits with its command's code, or ``75`` (the lock was busy), ``76``
(the hold was lost: the command was stopped), ``126``/``127`` (the command could not be
run / was not found): see :mod:`ylock.leader`.
"""
from __future__ import annotations

import argparse
import contextlib
import getpass
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO

from ylock import options as opt
from ylock import report
from ylock.engines import engine_from_url
from ylock.engines.base import SEMAPHORE, Engine, LockInfo, check_limit
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.leader import EXIT_BUSY, EXIT_CANNOT_RUN, EXIT_LOST, EXIT_NOT_FOUND, GRACE, run_command
from ylock.lock import Lock
from ylock.metrics import shared
from ylock.metrics.aggregator import WINDOW
from ylock.names import check_group, check_name
from ylock.owner import context
from ylock.registry import Registry

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

DEFAULT_ALIAS = "default"
VERBS = ("list", "inspect", "release", "stats", "run")

__all__ = ["main", "execute", "execute_in", "add_verbs", "Console", "CommandFailed", "Target", "list_locks",
           "inspect_lock", "release_lock", "collect_stats", "show_stats", "run_locked", "targets_of", "EXIT_OK",
           "EXIT_ERROR", "EXIT_USAGE", "EXIT_BUSY", "EXIT_LOST", "EXIT_CANNOT_RUN", "EXIT_NOT_FOUND"]

#: An engine and the alias it goes by in the output (``default`` for ``ylock --url``).
Target = tuple[str, Engine]


class CommandFailed(Exception):
    """A verb could not do its work: ``str(exc)`` is the one line to show, ``code`` the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code


class Console:
    """Where a verb writes (``write(text)``: no newline added) and reads its confirmation."""

    def __init__(self, write: Callable[[str], object], stdin: TextIO | None = None) -> None:
        self.write = write
        self.stdin = stdin

    def print(self, text: str) -> None:
        """Write one line."""
        self.write(text + "\n")

    def ask(self, question: str) -> str | None:
        """Write ``question`` and return the line answered on standard input (a terminal or
        a pipe), or None when there is no answer (end of input, no readable input)."""
        self.write(question)
        stdin = self.stdin if self.stdin is not None else sys.stdin
        try:
            line = stdin.readline()
            interactive = stdin.isatty()
        except (OSError, ValueError, AttributeError):   # closed, or captured (pytest)
            line, interactive = "", False
        if not interactive:
            self.write(line.rstrip("\n") + "\n")        # the transcript shows the answer
        return line.strip() if line else None


@contextlib.contextmanager
def reaching(alias: str, engine: Engine) -> Iterator[None]:
    """Turn an engine that cannot be reached into a one-line :class:`CommandFailed`."""
    try:
        yield
    except EngineUnavailable as exc:
        raise CommandFailed(f"engine {alias!r} ({engine.url_for_display()}) is unreachable: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc


def targets_of(aliases: Sequence[str], build: Callable[[str], Engine], alias: str | None) -> list[Target]:
    """Return the (alias, engine) pairs a verb works on: ``alias``'s, or every one if None;
    raise :class:`CommandFailed` for an alias not defined or an engine that cannot be built."""
    if alias is not None and alias not in aliases:
        raise CommandFailed(f"no engine {alias!r} in ENGINES (defined: {', '.join(map(repr, aliases)) or 'none'})")
    try:
        return [(a, build(a)) for a in ([alias] if alias is not None else aliases)]
    except ConfigurationError as exc:
        raise CommandFailed(str(exc)) from exc


def _lock_name(group: str, name: str) -> None:
    try:
        check_group(group)
        check_name(name)
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc


# -- the verbs ---------------------------------------------------------------------------------------

def list_locks(console: Console, targets: Sequence[Target], *, group: str | None = None,
               as_json: bool = False, limit: int | None = None) -> int:
    """Print the held locks and their waiters (a table, or JSON): with ``limit``, the first
    ``limit`` of each engine (by group and name), and under the table how many there are."""
    try:
        if group is not None:
            check_group(group)
        check_limit(limit)
    except ValueError as exc:
        raise CommandFailed(str(exc).replace("describe() limit", "--limit"), EXIT_USAGE) from exc
    found: list[tuple[str, LockInfo]] = []
    more = []
    for alias, engine in targets:
        with reaching(alias, engine):
            listing = engine.describe(group, limit)
        found.extend((alias, i) for i in listing)
        total = getattr(listing, "total", len(listing))
        if total > len(listing):
            more.append(f"{alias}: the first {len(listing)} of about {total} shown (--limit {limit})")
    console.print(report.to_json(found) if as_json else report.table(found))
    if not as_json:
        for line in more:
            console.print(line)
    return EXIT_OK


def inspect_lock(console: Console, target: Target, group: str, name: str, *, as_json: bool = False) -> int:
    """Print one lock: mode, owners, lease left, token, waiters in order."""
    _lock_name(group, name)
    alias, engine = target
    with reaching(alias, engine):       # one lock, not the group listed: a lock, else a semaphore of that name
        info = engine.describe_lock(group, name) or engine.describe_lock(group, name, SEMAPHORE)
    console.print(report.to_json_one(alias, info) if as_json else report.detail(alias, info, group, name))
    return EXIT_OK


def release_lock(console: Console, target: Target, group: str, name: str, *, yes: bool = False) -> int:
    """Force-release one lock after asking (unless ``yes``): its holders learn it as a lost
    lock. Log it with the user's name. Return 1 if not confirmed."""
    _lock_name(group, name)
    alias, engine = target
    if not yes:
        answer = console.ask(f"Force-release {group}/{name} on {alias}? Its holders lose it. [y/N] ")
        if answer is None:
            console.print("not released: no answer (answer y, or pass --yes)")
            return EXIT_ERROR
        if answer.lower() not in ("y", "yes"):
            console.print("not released")
            return EXIT_ERROR
    with reaching(alias, engine):
        had = engine.force_release(group, name)
    if had:     # the audit trail: who took a lock from its holders
        logger.warning("ylock: %s force-released %s/%s on %s", _user(), group, name, alias)
    else:       # nothing was taken from anyone: standard output says so, the log need not
        logger.info("ylock: %s asked to force-release %s/%s on %s: it was not held", _user(), group, name, alias)
    console.print(f"released {group}/{name} on {alias}" if had
                  else f"nothing to release: {group}/{name} on {alias} was not held")
    return EXIT_OK


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown user"


def collect_stats(targets: Sequence[Target]) -> dict[str, Any]:
    """Return the deployment's statistics (what ``stats --json`` prints)::

        {"window": 300.0, "percentiles": "approximate: ...",
         "groups": {group: {"held", "readers", "waiters",          # now, from the engines
                            "processes", "counts": {kind: n},      # the last 5 minutes, all processes
                            "wait"|"hold"|"release": {"count", "sum", "mean", "max", "p50", "p90", "p99"}}},
         "processes": {process id: {"pid", "found_on", "published", "age", "since",
                                    "groups": {...as above, without "now"}, "exporters": {...}}}}
    """
    now: dict[str, dict[str, int]] = {}
    windows: dict[str, dict[str, Any]] = {}
    for alias, engine in targets:
        with reaching(alias, engine):
            for info in engine.describe(None):
                g = now.setdefault(info.group, {"held": 0, "readers": 0, "waiters": 0})
                g["held"] += 1 if info.mode else 0
                g["readers"] += len(info.owners) if info.mode == "read" else 0
                g["waiters"] += len(info.waiters)
            for process, window in shared.read([(alias, engine)]).items():
                seen = windows.get(process)
                if seen is None or window.get("at", 0) > seen.get("at", 0):
                    if seen is not None:
                        window["found_on"] = sorted({*window["found_on"], *seen["found_on"]})
                    windows[process] = window
                else:
                    seen["found_on"] = sorted({*window["found_on"], *seen["found_on"]})
    merged = shared.merge(windows.values())
    groups: dict[str, Any] = {}
    for group in sorted({*now, *merged}):
        groups[group] = {**now.get(group, {"held": 0, "readers": 0, "waiters": 0}),
                         **merged.get(group, {"processes": 0, "counts": {}})}
    clock = time.time()
    processes = {}
    for process in sorted(windows):
        w = windows[process]
        at = float(w["at"]) if isinstance(w.get("at"), (int, float)) else clock
        processes[process] = {"pid": w.get("pid"), "found_on": w["found_on"], "published": at,
                              "age": round(max(0.0, clock - at), 3), "since": w.get("since"),
                              "groups": shared.merge([w]), "exporters": w.get("exporters") or {}}
    return {"window": WINDOW, "percentiles": shared.PERCENTILES_NOTE, "groups": groups, "processes": processes}


def show_stats(console: Console, targets: Sequence[Target], *, as_json: bool = False) -> int:
    """Print :func:`collect_stats` (a table, or JSON)."""
    stats = collect_stats(targets)
    console.print(report.stats_json(stats) if as_json else report.stats_table(stats))
    return EXIT_OK


def run_locked(target: Target, lock: Lock, command: Sequence[str], *, wait: bool = False,
               timeout: float | None = None, lease: float | None = None, grace: float | None = None,
               stderr: TextIO | None = None) -> int:
    """Run ``command`` while holding ``lock`` (see :func:`ylock.leader.run_command`):
    ``wait`` as long as it takes, else ``timeout`` seconds, else try once; ``lease``
    replaces the lock's lease."""
    command = list(command)
    if not command:
        raise CommandFailed("no COMMAND to run: ... run LOCK -- COMMAND [ARG ...]", EXIT_USAGE)
    if wait and timeout is not None:
        raise CommandFailed("--wait and --timeout exclude each other", EXIT_USAGE)
    try:
        wait_for = None if wait else (0.0 if timeout is None else opt.timeout(timeout, "--timeout"))
        if lease is not None:
            lock = Lock(lock.engine, lock.group, lock.name, fair=lock.fair, polling=lock.polling,
                        lease=opt.lease(lease, "--lease"))
        grace = GRACE if grace is None else opt.seconds(grace, "--grace", minimum=0, maximum=3600, above=None)
    except ConfigurationError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
    alias, engine = target
    with reaching(alias, engine):
        return run_command(lock, command, timeout=wait_for, grace=grace, stderr=stderr)


def execute(action: str, options: Mapping[str, Any], console: Console, *,
            targets: Callable[[str | None], list[Target]], named_lock: Callable[[str], tuple[Target, Lock]],
            stderr: TextIO | None = None) -> int:
    """Run verb ``action`` with the parsed ``options`` (the dests of :func:`add_verbs`):
    ``targets(alias)`` gives the engines (every one for None), ``named_lock(lock)`` the
    engine and lock of ``run``. What every command line calls."""
    alias = options.get("engine")
    if action == "list":
        return list_locks(console, targets(alias), group=options.get("group"), as_json=options.get("as_json", False),
                          limit=options.get("limit"))
    if action == "inspect":
        [target] = targets(alias or DEFAULT_ALIAS)
        return inspect_lock(console, target, options["group"], options["name"], as_json=options.get("as_json", False))
    if action == "release":
        [target] = targets(alias or DEFAULT_ALIAS)
        return release_lock(console, target, options["group"], options["name"], yes=options.get("yes", False))
    if action == "stats":
        return show_stats(console, targets(alias), as_json=options.get("as_json", False))
    if action == "run":
        target, lock = named_lock(options["lock"])
        return run_locked(target, lock, options.get("command") or [], wait=options.get("wait", False),
                          timeout=options.get("timeout"), lease=options.get("lease"), grace=options.get("grace"),
                          stderr=stderr)
    raise CommandFailed(f"unknown action {action!r} (known: {', '.join(VERBS)})", EXIT_USAGE)


def execute_in(registry: Registry, action: str, options: Mapping[str, Any], console: Console, *,
               stderr: TextIO | None = None) -> int:
    """:func:`execute` on the engines and named locks of a plugin's settings (``manage.py
    ylock``, ``flask ylock``): ``run NAME`` holds the lock ``NAME`` of its LOCKS."""
    def named_lock(name: str) -> tuple[Target, Lock]:
        try:
            alias = registry.lock_options(name).engine
            lock = registry.lock(name)
        except ConfigurationError as exc:
            raise CommandFailed(f"invalid {registry.setting()} setting: {exc}") from exc
        return (alias, lock.engine), lock

    return execute(action, options, console, named_lock=named_lock, stderr=stderr,
                   targets=lambda alias: targets_of(registry.aliases(), registry.engine, alias))


# -- argparse (the ylock script and manage.py ylock) ---------------------------------------------------

def add_verbs(subparsers: Any, *, engines: bool, named: bool) -> None:
    """Add the verbs to an argparse ``add_subparsers()`` object: with ``--engine ALIAS`` options
    if ``engines`` (the plugins' several engines), ``run NAME`` (a named lock of the settings)
    if ``named``, else ``run --lock GROUP/NAME``."""
    def engine_option(parser: argparse.ArgumentParser, every: bool) -> None:
        if engines:
            parser.add_argument("--engine", default=None, metavar="ALIAS",
                                help="only this engine alias (default: every engine)" if every
                                else f"engine alias (default: {DEFAULT_ALIAS})")

    def json_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", dest="as_json", action="store_true", help="print JSON")

    listing = subparsers.add_parser("list", help="held locks, their owners and queued waiters")
    listing.add_argument("--group", help="only this lock group")
    listing.add_argument("--limit", type=int, metavar="N",
                         help="at most N locks per engine, the first by group and name (and how many there are)")
    engine_option(listing, True)
    json_option(listing)
    for verb, text in (("inspect", "one lock: mode, owners, lease left, fencing token, waiters"),
                       ("release", "force-release one lock (asks first; its holders learn it as a lost lock)")):
        parser = subparsers.add_parser(verb, help=text)
        parser.add_argument("group")
        parser.add_argument("name")
        engine_option(parser, False)
        if verb == "inspect":
            json_option(parser)
        else:
            parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    stats = subparsers.add_parser("stats", help="held now, and every process's lock activity of the last minutes")
    engine_option(stats, True)
    json_option(stats)
    run = subparsers.add_parser("run", help="run COMMAND only while holding the write lock",
                                usage=f"%(prog)s {'NAME' if named else '--lock GROUP/NAME'} [--wait | --timeout S] "
                                      "[--lease S] [--grace S] -- COMMAND [ARG ...]",
                                description="Run COMMAND only while holding the write lock; stop it (SIGTERM, "
                                            "then SIGKILL) if the hold is lost. Exit codes: the command's own; "
                                            "75 the lock was busy; 76 the hold was lost; 126/127 the command "
                                            "could not be run / was not found; 1 an error.")
    if named:
        run.add_argument("lock", metavar="NAME", help="a named lock of the settings (LOCKS)")
    else:
        run.add_argument("--lock", required=True, metavar="GROUP/NAME", help="the lock to hold")
    how = run.add_mutually_exclusive_group()
    how.add_argument("--wait", action="store_true", help="wait as long as it takes for the lock")
    how.add_argument("--timeout", type=float, metavar="S", help="wait up to S seconds (default: try once)")
    run.add_argument("--lease", type=float, metavar="S", help="the lease (default: the lock's, 30 s)")
    run.add_argument("--grace", type=float, metavar="S",
                     help=f"seconds between SIGTERM and SIGKILL when the hold is lost (default {GRACE:g})")
    # "+" rather than REMAINDER: REMAINDER would swallow the options given after NAME too;
    # after "--" everything is the command's, its options included.
    run.add_argument("command", nargs="+", metavar="COMMAND", help="after --: the command and its arguments")


def build_parser() -> argparse.ArgumentParser:
    """Return the ``ylock`` script's parser."""
    parser = argparse.ArgumentParser(prog="ylock", description="Inspect and manage ylock distributed locks.",
                                     epilog="Exit codes: 0 done, 1 error, 2 usage; run: see `ylock run --help`.")
    parser.add_argument("--url", default=None, help="the engine URL (default: $YLOCK_URL), e.g. "
                                                    "redis://127.0.0.1:6379/0 or zookeeper://z1:2181/app")
    sub = parser.add_subparsers(dest="action", required=True, metavar="{list,inspect,release,stats,run}")
    add_verbs(sub, engines=False, named=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ylock`` script; return its exit code."""
    args = build_parser().parse_args(argv)
    engine: Engine | None = None
    try:
        url = args.url or os.environ.get("YLOCK_URL")
        if not url:
            raise CommandFailed("no engine URL: pass --url URL or set $YLOCK_URL", EXIT_USAGE)
        try:
            engine = engine_from_url(url)
        except ConfigurationError as exc:
            raise CommandFailed(str(exc)) from exc
        target: Target = (DEFAULT_ALIAS, engine)

        def named_lock(spec: str) -> tuple[Target, Lock]:
            group, slash, name = spec.partition("/")
            if not slash:
                raise CommandFailed(f"--lock must be GROUP/NAME, got {spec!r}", EXIT_USAGE)
            _lock_name(group, name)
            return target, Lock(target[1], group, name)

        command = getattr(args, "command", None) or [""]
        with context(f"ylock {args.action} {os.path.basename(command[0])}".rstrip()):   # the name, not the arguments
            return execute(args.action, vars(args), Console(sys.stdout.write, sys.stdin),
                           targets=lambda alias: targets_of([DEFAULT_ALIAS], lambda _: target[1], alias),
                           named_lock=named_lock)
    except CommandFailed as exc:
        print(f"ylock: error: {exc}", file=sys.stderr)
        return exc.code
    except LockError as exc:
        print(f"ylock: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.close()


if __name__ == "__main__":
    sys.exit(main())
