"""``python -m bench.mysql [--quick] [--runs N] [--out DIR]``: ylock's MySQL engine on MariaDB
against the two MySQL lock libraries users pick -- django-mysql's ``Lock`` (``GET_LOCK`` on
Django's own connection) and PyMySQLLock (``GET_LOCK`` on a new connection per lock, pinged
by a thread) -- and, in the same run, ylock's PostgreSQL engine against django-pglock's
advisory lock; on servers it starts itself (``ylock.testing``: MariaDB with
``innodb_flush_log_at_trx_commit=2``, PostgreSQL with fsync off). Writes
``results/mysql.json`` and ``mysql.md``.

- **uncontended**: one client, acquire+release of a free lock in a loop. Each ratio (ylock
  ÷ peer) is the median of ``--runs`` rounds, each timed peer, ylock, ylock, peer back to
  back (:func:`bench.run.paired_ratio`), with min and max; beside it each side's pairs/s and
  the ``SELECT 1`` round trips/s of each server (the floor: a bare ``GET_LOCK`` +
  ``RELEASE_LOCK`` is two of them). ylock's pair does more: a row written (its token) and
  deleted, a lease, a queue that a reader can join.
- **contended**: 4 processes take one lock in turn and bump a counter row with a
  non-atomic SELECT then UPDATE inside it (the control, without a lock, must lose updates);
  acquisitions/s as the median of rounds of paired runs, and the columns of
  ``bench/run.py``'s contended table (gap, self, wait p99, fairness) per library.
"""
from __future__ import annotations

import multiprocessing
import statistics
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import ylock
from bench.common import bench_parser, machine, paired, paired_ratio, rate, run_bench, stats, with_steal
from bench.contended import analyse
from ylock.testing.mariadb import MariaDBServer
from ylock.testing.postgres import PostgresServer

spawn = multiprocessing.get_context("spawn")
Pair = tuple[Callable[[], Any], Callable[[], Any]]
PEERS = ("django-mysql Lock", "PyMySQLLock")


def _mysql_kwargs(url: str) -> dict[str, Any]:
    p = urlsplit(url)
    return {"host": p.hostname, "port": p.port, "user": p.username, "password": p.password,
            "database": p.path.lstrip("/"), "autocommit": True}


def setup_django(mysql_url: str, pg_url: str | None) -> None:
    """Django with DATABASES "default" on MariaDB (PyMySQL standing in for mysqlclient) and
    "pg" on PostgreSQL, for the peers that lock on Django's connections."""
    import django
    import pymysql
    from django.conf import settings

    if settings.configured:
        return
    pymysql.install_as_MySQLdb()
    m = _mysql_kwargs(mysql_url)
    databases: dict[str, Any] = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": m["database"],
                                             "USER": m["user"], "PASSWORD": m["password"], "HOST": m["host"],
                                             "PORT": str(m["port"])}}
    apps = ["django_mysql"]
    if pg_url is not None:
        p = urlsplit(pg_url)
        databases["pg"] = {"ENGINE": "django.db.backends.postgresql", "NAME": p.path.lstrip("/"),
                           "USER": p.username, "HOST": p.hostname, "PORT": str(p.port)}
        apps += ["pgactivity", "pglock"]
    settings.configure(DATABASES=databases, INSTALLED_APPS=apps, USE_TZ=True)
    django.setup()


def pair(lib: str, url: str, name: str, pg_url: str | None = None) -> Pair:
    """(acquire, release) of one library on one lock name."""
    if lib in ("ylock mysql", "ylock postgres"):
        lock = ylock.Lock(ylock.engine_from_url(url), "bench", name)
        return lock.lock, lock.unlock
    if lib == "django-mysql Lock":
        setup_django(url, pg_url)
        from django_mysql.locks import Lock

        dlock = Lock(name, acquire_timeout=60)
        return dlock.acquire, dlock.release
    if lib == "PyMySQLLock":
        from PyMySQLLock import Locker

        plock = Locker(**_mysql_kwargs(url)).lock(name)
        return (lambda: plock.acquire(timeout=60)), plock.release
    if lib == "django-pglock advisory":
        setup_django(url, pg_url)
        import pglock

        held: list[Any] = []

        def acquire() -> None:
            advisory = pglock.advisory(name, using="pg")
            advisory.__enter__()
            held.append(advisory)
        return acquire, lambda: held.pop().__exit__(None, None, None)
    if lib == "no lock (control)":
        return (lambda: None), (lambda: None)
    raise ValueError(lib)


def _op(p: Pair) -> Callable[[], None]:
    acquire, release = p

    def op() -> None:
        acquire()
        release()
    return op


def worker(lib: str, url: str, name: str, ready: Any, duration: float) -> list[tuple[int, int, int]]:
    """In a spawned process: take the lock in a loop, bump the counter row inside (SELECT then
    UPDATE: loses updates unlocked); return (asked, got, released) ns per acquisition."""
    import time

    import pymysql

    acquire, release = pair(lib, url, name)
    counter = pymysql.connect(**_mysql_kwargs(url))
    cursor = counter.cursor()
    log: list[tuple[int, int, int]] = []
    ready.wait(120)
    end = time.time() + duration
    while time.time() < end:
        asked = time.time_ns()
        acquire()
        got = time.time_ns()
        cursor.execute("SELECT v FROM bench_counter WHERE name = %s", [name])
        value = cursor.fetchone()[0]  # type: ignore[index]
        cursor.execute("UPDATE bench_counter SET v = %s WHERE name = %s", [value + 1, name])
        released = time.time_ns()
        release()
        log.append((asked, got, released))
    return log


class MySQLBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None, duration: float | None,
                 libs: list[str] | None = None) -> None:
        self.quick, self.runs, self.libs = quick, runs, libs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.duration = duration or (1.0 if quick else 2.0)
        self.mariadb = MariaDBServer().start()
        self.postgres = PostgresServer().start()
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs}
        self.results["machine"]["mariadb"] = self.mariadb.query("SELECT VERSION()")[0][0]
        self.mariadb.query("CREATE TABLE IF NOT EXISTS bench_counter (name VARCHAR(64) PRIMARY KEY, v BIGINT)")

    def close(self) -> None:
        self.mariadb.cleanup()
        self.postgres.cleanup()

    def _wanted(self, lib: str) -> bool:
        return self.libs is None or lib in self.libs

    def uncontended(self) -> None:
        import pymysql

        n = uuid.uuid4().hex[:8]
        floor_conn = pymysql.connect(**_mysql_kwargs(self.mariadb.url))
        cursor = floor_conn.cursor()
        pg_conn = self.postgres.connect()
        out: dict[str, Any] = {
            "floor: MariaDB SELECT 1 round trips/s": stats([rate(lambda: cursor.execute("SELECT 1"), self.seconds)
                                                            for _ in range(self.runs)]),
            "floor: PostgreSQL SELECT 1 round trips/s": stats([rate(lambda: pg_conn.execute("SELECT 1"),
                                                                    self.seconds) for _ in range(self.runs)])}
        setup_django(self.mariadb.url, self.postgres.url)
        cases = [("ylock mysql", lib, self.mariadb.url) for lib in PEERS]
        cases.append(("ylock postgres", "django-pglock advisory", self.postgres.url))
        for ours, peer, url in cases:
            if not self._wanted(peer):
                continue
            try:
                theirs = _op(pair(peer, self.mariadb.url, f"p{n}{len(out)}", self.postgres.url))
            except ModuleNotFoundError as exc:
                print(f"bench: no row for {peer!r}: {exc.name} is not installed", file=sys.stderr)
                continue
            mine = _op(pair(ours, url, f"y{n}{len(out)}"))
            row = paired_ratio(theirs, mine, self.runs, self.seconds)
            out[f"{ours} ÷ {peer}"] = {"ratio": {k: row[k] for k in ("median", "min", "max")},
                                       "ylock_pairs_per_s": row["b"]["rate"], "peer_pairs_per_s": row["a"]["rate"],
                                       "steal_pct": row["steal_pct"]["max"], "rounds": row["rounds"]}
        floor_conn.close()
        pg_conn.close()
        self.results["uncontended"] = out

    def _contended(self, lib: str) -> dict[str, Any]:
        name = uuid.uuid4().hex[:10]
        self.mariadb.query("INSERT INTO bench_counter VALUES (%s, 0)", [name])
        with spawn.Manager() as manager, ProcessPoolExecutor(4, mp_context=spawn) as pool:
            ready = manager.Barrier(4)
            futures = [pool.submit(worker, lib, self.mariadb.url, name, ready, self.duration) for _ in range(4)]
            logs = [f.result(timeout=300) for f in futures]
        counter = int(self.mariadb.query("SELECT v FROM bench_counter WHERE name = %s", [name])[0][0])
        return analyse(logs, counter)

    def contended(self) -> None:
        out: dict[str, Any] = {}
        for peer in PEERS:
            if not self._wanted(peer):
                continue
            row = paired(lambda peer=peer: with_steal(lambda: self._contended(peer)),  # type: ignore[misc]
                         lambda: with_steal(lambda: self._contended("ylock mysql")), self.runs, "acq_per_s")
            samples = row.pop("samples")
            out[f"ylock mysql ÷ {peer}"] = {"ratio": {k: row[k] for k in ("median", "min", "max")},
                                            "rounds": row["rounds"], "steal_pct": row["steal_pct"]["max"],
                                            "ylock": _median(samples["b"]), "peer": _median(samples["a"])}
        if self._wanted("no lock (control)"):
            out["no lock (control)"] = self._contended("no lock (control)")
        self.results["contended"] = out


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        out[key] = max(values) if key == "lost_updates" else statistics.median(values) if values else None
    return out


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m.get('mariadb')}; {m['when']}; "
             f"ratios: medians of {r['runs']} paired rounds" + (" (--quick)" if r["quick"] else "") + ".", ""]
    if "uncontended" in r:
        lines += ["**Uncontended acquire+release, one client**", "",
                  "| pair | ylock pairs/s | peer pairs/s | ylock ÷ peer (median, min–max) | stolen |",
                  "|---|---:|---:|---:|---:|"]
        for name, row in r["uncontended"].items():
            if name.startswith("floor"):
                continue
            ratio = row["ratio"]
            lines.append(f"| {name} | {f(row['ylock_pairs_per_s'])} | {f(row['peer_pairs_per_s'])} | "
                         f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f}) | "
                         f"{f(row['steal_pct'])} % |")
        floors = [f"{name[7:]} {f(row['median'])}" for name, row in r["uncontended"].items()
                  if name.startswith("floor")]
        lines += ["", f"Floors: {'; '.join(floors)}.", ""]
    if "contended" in r:
        lines += ["**Contended handoff** (4 processes, one lock, a SELECT+UPDATE counter row inside)", "",
                  "| library | acq/s | lost updates | gap p50 ms | self | wait p99 ms | max/min |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["contended"].items():
            rows = [(name.split(" ÷ ")[1], row["peer"]), ("ylock mysql", row["ylock"])] if "ratio" in row \
                else [(name, row)]
            for lib, x in rows:
                lines.append(f"| {lib} | {f(x['acq_per_s'])} | {x['lost_updates']} | {f(x['gap_p50_ms'], 3)} | "
                             f"{f(x['self_reacquire'] * 100 if x.get('self_reacquire') is not None else None)} % | "
                             f"{f(x['cross_wait_p99_ms'], 1)} | {f(x['fairness_max_min'], 2)} |")
        ratios = [f"{name}: {row['ratio']['median']:.2f}× ({row['ratio']['min']:.2f}–{row['ratio']['max']:.2f})"
                  for name, row in r["contended"].items() if "ratio" in row]
        lines += ["", f"Acquisitions/s, ylock ÷ peer, medians of paired rounds: {'; '.join(ratios)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.mysql", __doc__, "mysql")
    parser.add_argument("--libs", default=None, help="comma-separated peers (and 'no lock (control)') to run")
    args = parser.parse_args(argv)
    bench = MySQLBench(args.quick, int(args.runs or (2 if args.quick else 5)), args.seconds, args.duration,
                       args.libs.split(",") if args.libs else None)
    return run_bench(bench, args.only, args, "mysql", markdown)


if __name__ == "__main__":
    main()
