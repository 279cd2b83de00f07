"""``python -m bench.postgres [--quick] [--runs N] [--out DIR]``: ylock's PostgreSQL engine
against the floor (bare ``pg_advisory_lock``/``pg_advisory_unlock`` through psycopg) and
django-pglock (``pip install django-pglock``; skipped when missing), on one PostgreSQL
server it starts itself (``ylock.testing.postgres``: fsync off, as in the tests), in one
run. Each number is the median of ``--runs`` runs (5), with min and max; the uncontended
cases are interleaved run by run. Writes ``results/postgres.json`` and ``postgres.md``.

- **uncontended**: one client, acquire+release of a free lock in a loop. ``vs floor`` =
  2 × pairs/s ÷ ``SELECT 1`` round trips/s (1.0: two bare round trips). The raw pair is the
  floor of a PostgreSQL lock: two statements, no fencing token, no lease, no queue
  bookkeeping; ylock's statements also draw the token, name the holder and set its lease.
- **contended**: 4 processes take one lock in turn and bump a counter row with a
  non-atomic SELECT then UPDATE inside it (the control row, without a lock, must lose
  updates); the columns are those of ``bench/run.py``'s contended table (gap = from one
  holder's release call to the next holder's acquisition, also in ``SELECT 1`` round
  trips; self = the releaser took it straight back; max/min per process = fairness).
"""
from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg

import ylock
from bench.common import bench_parser, machine, median_rows, rate, run_bench, runs_of, spawn, stats
from bench.contended import analyse
from ylock.engines.postgres.ops import Open, Query
from ylock.testing.postgres import PostgresServer

Pair = tuple[Callable[[], Any], Callable[[], Any]]


def raw_pair(url: str, key: int) -> Pair:
    """The floor: ``pg_advisory_lock`` then ``pg_advisory_unlock`` on one psycopg connection."""
    conn = psycopg.connect(url, autocommit=True)
    return (lambda: conn.execute("SELECT pg_advisory_lock(%s)", [key]),
            lambda: conn.execute("SELECT pg_advisory_unlock(%s)", [key]))


def ylock_pair(url: str, name: str, mode: str = "write") -> Pair:
    lock = ylock.Lock(ylock.engine_from_url(url), "bench", name)
    return (lock.lock, lock.unlock) if mode == "write" else (lock.rlock, lock.runlock)


def pglock_pair(url: str, name: str) -> Pair:
    """django-pglock's ``advisory`` (a session lock on Django's own connection)."""
    import django
    from django.conf import settings
    from psycopg.conninfo import conninfo_to_dict

    if not settings.configured:
        c = conninfo_to_dict(url)
        settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": c["dbname"],
                                                  "USER": c["user"], "HOST": c["host"], "PORT": c["port"]}},
                           INSTALLED_APPS=["pgactivity", "pglock"], USE_TZ=True)
        django.setup()
    import pglock

    holder: list[Any] = []

    def acquire() -> None:
        lock = pglock.advisory(name)
        lock.__enter__()
        holder.append(lock)

    def release() -> None:
        holder.pop().__exit__(None, None, None)
    return acquire, release


def _pair(lib: str, url: str, name: str) -> Pair:
    if lib == "ylock postgres":
        return ylock_pair(url, name)
    if lib == "raw pg_advisory_lock (psycopg)":
        return raw_pair(url, int(name, 16) & 0x7FFFFFFF)
    if lib == "django-pglock":
        return pglock_pair(url, name)
    if lib == "no lock (control)":
        return (lambda: None), (lambda: None)
    raise ValueError(lib)


def worker(lib: str, url: str, name: str, ready: Any, duration: float,
           max_ops: int) -> list[tuple[int, int, int]]:
    """Run in a spawned process; return (asked, got, released) ns timestamps per acquisition.
    Every process starts when all are ready (``ready``: a barrier)."""
    acquire, release = _pair(lib, url, name)
    counter = psycopg.connect(url, autocommit=True)
    log: list[tuple[int, int, int]] = []
    ready.wait(120)
    end = time.time() + duration
    while time.time() < end and len(log) < max_ops:
        asked = time.time_ns()
        acquire()
        got = time.time_ns()
        row = counter.execute("SELECT v FROM bench_counter WHERE name = %s", [name]).fetchone()
        counter.execute("UPDATE bench_counter SET v = %s WHERE name = %s", [row[0] + 1, name])  # type: ignore[index]
        released = time.time_ns()
        release()
        log.append((asked, got, released))
    return log


class PostgresBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None, duration: float | None,
                 libs: list[str] | None = None) -> None:
        self.quick = quick
        self.libs = libs
        self.runs = runs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.duration = duration or (1.5 if quick else 3.0)
        self.server = PostgresServer().start()
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs}
        with self.server.connect() as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        self.results["machine"]["postgresql"] = version
        self.results["machine"]["psycopg"] = psycopg.__version__

    def close(self) -> None:
        self.server.cleanup()

    def uncontended(self) -> None:
        n = uuid.uuid4().hex[:8]
        floor_conn = self.server.connect()
        factories: dict[str, Callable[[], Callable[[], Any]]] = {
            "floor: psycopg SELECT 1 round trip": lambda: lambda: floor_conn.execute("SELECT 1"),
            "raw pg_advisory_lock + pg_advisory_unlock (psycopg)": lambda: _op(raw_pair(self.server.url, 77)),
            "ylock postgres (write)": lambda: _op(ylock_pair(self.server.url, f"w{n}")),
            "ylock postgres (read)": lambda: _op(ylock_pair(self.server.url, f"r{n}", "read")),
            "ylock postgres (write, scope=transaction)":
                lambda: _op(ylock_pair(self.server.url + "?scope=transaction", f"x{n}")),
            "django-pglock advisory": lambda: _op(pglock_pair(self.server.url, f"p{n}")),
        }
        if self.libs is not None and "django-pglock" not in self.libs:
            del factories["django-pglock advisory"]
        cases: dict[str, Callable[[], Any]] = {}
        for name, factory in factories.items():
            try:
                cases[name] = factory()
            except ModuleNotFoundError as exc:
                print(f"bench: no row for {name!r}: {exc.name} is not installed", file=sys.stderr)
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(self.runs):
            for name, op in cases.items():
                samples[name].append(rate(op, self.seconds))
        rows = {name: stats(values) for name, values in samples.items()}
        floor = rows["floor: psycopg SELECT 1 round trip"]["median"]
        for name, row in rows.items():
            if not name.startswith("floor"):
                row["vs_floor"] = 2 * row["median"] / floor
        raw = rows["raw pg_advisory_lock + pg_advisory_unlock (psycopg)"]["median"]
        self.results["uncontended"] = rows
        self.results["ylock/raw"] = rows["ylock postgres (write)"]["median"] / raw
        if "django-pglock advisory" in rows:
            self.results["ylock/django-pglock"] = rows["ylock postgres (write)"]["median"] / \
                rows["django-pglock advisory"]["median"]
        # Statements per uncontended acquire+release, counted at the engine's executor.
        engine = ylock.engine_from_url(self.server.url)
        lock = ylock.Lock(engine, "bench", f"c{n}")
        lock.lock()
        lock.unlock()
        sent: list[Any] = []
        do = engine._do  # type: ignore[attr-defined]
        engine._do = lambda op: (sent.append(op) if isinstance(op, (Query, Open)) else None, do(op))[1]  # type: ignore[attr-defined]
        for _ in range(100):
            lock.lock()
            lock.unlock()
        self.results["round_trips_per_pair"] = len(sent) / 100
        engine.close()
        floor_conn.close()

    def contended(self) -> None:
        libs = ["ylock postgres", "raw pg_advisory_lock (psycopg)", "django-pglock", "no lock (control)"]
        libs = [lib for lib in libs if self.libs is None or lib in self.libs]
        try:
            import pglock  # noqa: F401
        except ModuleNotFoundError:
            libs = [lib for lib in libs if lib != "django-pglock"]
        procs = 4
        out: dict[str, Any] = {}
        probe = self.server.connect()
        with self.server.connect() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_counter (name text PRIMARY KEY, v bigint NOT NULL)")
        for lib in libs:
            runs = []
            for _ in range(self.runs):
                floor = rate(lambda: probe.execute("SELECT 1"), 0.3)
                name = uuid.uuid4().hex[:10]
                with self.server.connect() as conn:
                    conn.execute("INSERT INTO bench_counter VALUES (%s, 0)", [name])
                with spawn.Manager() as manager, ProcessPoolExecutor(procs, mp_context=spawn) as pool:
                    ready = manager.Barrier(procs)
                    futures = [pool.submit(worker, lib, self.server.url, name, ready, self.duration, 200_000)
                               for _ in range(procs)]
                    logs = [f.result(timeout=300) for f in futures]
                with self.server.connect() as conn:
                    counter = conn.execute("SELECT v FROM bench_counter WHERE name = %s", [name]).fetchone()[0]  # type: ignore[index]
                row = analyse(logs, counter)
                row["round_trip_ms"] = 1000 / floor
                row["gap_p50_round_trips"] = None if row["gap_p50_ms"] is None else row["gap_p50_ms"] * floor / 1000
                runs.append(row)
            out[f"{procs} processes: {lib}"] = median_rows(runs)
        probe.close()
        self.results["contended"] = out


def _op(pair: Pair) -> Callable[[], None]:
    acquire, release = pair

    def op() -> None:
        acquire()
        release()
    return op


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, PostgreSQL {m['postgresql']} "
             f"(fsync off), psycopg {m['psycopg']}; {m['when']}; medians of {r['runs']} runs"
             + (" (--quick)" if r["quick"] else "") + ".", ""]
    if "uncontended" in r:
        lines += ["**Uncontended acquire+release, one client** (pairs/s; `vs floor` = 2 × pairs/s ÷ `SELECT 1` "
                  "round trips/s)", "", "| library | median | min | max | vs floor |", "|---|---:|---:|---:|---:|"]
        for name, row in r["uncontended"].items():
            lines.append(f"| {name} | {f(row['median'])} | {f(row['min'])} | {f(row['max'])} | "
                         f"{f(row.get('vs_floor'), 2)} |")
        ratios = [f"ylock/raw = {r['ylock/raw']:.2f}"]
        if "ylock/django-pglock" in r:
            ratios.append(f"ylock/django-pglock = {r['ylock/django-pglock']:.2f}")
        lines += ["", f"Ratios (same run): {', '.join(ratios)}; ylock statements per uncontended acquire+release: "
                  f"{r['round_trips_per_pair']:.0f}.", ""]
    if "contended" in r:
        lines += ["**Contended handoff** (4 processes, one lock, a SELECT+UPDATE counter inside)", "",
                  "| processes: library | acq/s | lost updates | gap p50 ms | gap p50 RTs | gap p99 ms | self | "
                  "wait p99 ms | max/min |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["contended"].items():
            lines.append(f"| {name} | {f(row['acq_per_s'])} | {row['lost_updates']} | {f(row['gap_p50_ms'], 3)} | "
                         f"{f(row.get('gap_p50_round_trips'), 1)} | {f(row['gap_p99_ms'], 3)} | "
                         f"{row['self_reacquire']:.0%} | {f(row['cross_wait_p99_ms'], 1)} | "
                         f"{f(row['fairness_max_min'], 2)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.postgres", __doc__, "postgres")
    parser.add_argument("--libs", default=None, help="comma-separated libraries for the contended section "
                        "(without django-pglock, its uncontended row is left out too)")
    args = parser.parse_args(argv)
    bench = PostgresBench(args.quick, runs_of(args), args.seconds, args.duration,
                          args.libs.split(",") if args.libs else None)
    return run_bench(bench, args.only, args, "postgres", markdown)


if __name__ == "__main__":
    main()
