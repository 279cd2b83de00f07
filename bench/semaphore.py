"""``python -m bench.semaphore [--quick] [--runs N] [--out DIR]``: ylock's semaphores
(issue 16) on a redis-server it starts itself on a free loopback port, and on the local
engine, beside ylock's write lock and the Redis round-trip floor measured in the same run.
Each number is the median of ``--runs`` runs (5), with min and max; the uncontended cases
are interleaved run by run. Writes ``results/semaphore.json`` and ``semaphore.md``.

- **uncontended**: one client, ``Semaphore(engine, group, name, permits=3)`` acquire +
  release of a free semaphore in a loop, beside ``Lock`` lock + unlock on the same engine
  (``sem/lock``: the target is 0.95 or more) and the peer py-redis-semaphore
  (``pip install -r bench/requirements.txt``; left out when missing). ``vs floor`` =
  2 × pairs/s ÷ ``EVALSHA`` of ``return 1`` per second (1.0: two bare round trips). Round
  trips per pair are the ``EVALSHA`` calls counted by the server, commands per pair every
  command it ran (those inside scripts included).
- **contended**: 8 processes (threads of one process on the local engine, whose
  semaphores exclude threads only) on 3 permits, started at a barrier, each taking and
  giving back a permit for a fixed time or count. Inside a permit each does ``INCR`` then
  ``DECR`` of a Redis counter of holders: ``max holders`` is the largest count any saw
  (never more than the permits, and more for the ``no semaphore (control)`` row: that
  proves the counter catches a broken semaphore). ``gap``: every release called while
  someone waited is matched with the next holder admitted after it (each admission
  answers one release); the time between is the handoff gap, also in round trips (the
  floor measured right before each run). ``self``: the share of those handoffs where the
  releaser itself got a permit back while others waited; ``barged``: where the next holder
  had asked after the release, overtaking the waiters; ``wait``: from asking to getting;
  ``max/min``: the busiest over the least busy process's acquisitions (1.0 = fair).
"""
from __future__ import annotations

import bisect
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import redis

import ylock
from bench.common import (
    bench_parser,
    machine,
    measure,
    median_rows,
    paired_ratio,
    rate,
    run_bench,
    runs_of,
    spawn,
    stats,
)
from ylock.testing.redis import RedisServer

Pair = tuple[Callable[[], Any], Callable[[], Any]]
#: (asked, got, released) in ns since the epoch, per acquisition; the holders counted inside.
Log = list[tuple[int, int, int]]

PERMITS = 3
LIBS = ["ylock redis", "py-redis-semaphore", "ylock local (threads)", "no semaphore (control)"]


def ylock_semaphore(engine: ylock.Engine, name: str, permits: int = PERMITS) -> Pair:
    sem = ylock.Semaphore(engine, "bench", name, permits=permits)
    return sem.acquire, sem.release


def ylock_lock(engine: ylock.Engine, name: str) -> Pair:
    lock = ylock.Lock(engine, "bench", name)
    return lock.lock, lock.unlock


def py_redis_semaphore(client: redis.Redis, name: str, permits: int = PERMITS) -> Pair:
    """py-redis-semaphore's ``Semaphore`` (leases renewed by a heartbeat thread, fencing
    tokens, BLPOP waits: the default ``AcquireMode.BLPOP``)."""
    from redis_semaphore import Semaphore, SemaphoreConfig

    sem = Semaphore(client, SemaphoreConfig(name=f"prs:{name}", limit=permits, lock_timeout=30.0))
    return sem.acquire, sem.release


def _op(pair: Pair) -> Callable[[], None]:
    acquire, release = pair

    def op() -> None:
        acquire()
        release()
    return op


def _pair(lib: str, redis_url: str, name: str, permits: int) -> Pair:
    if lib == "ylock redis":
        return ylock_semaphore(ylock.engine_from_url(redis_url), name, permits)
    if lib == "py-redis-semaphore":
        return py_redis_semaphore(redis.Redis.from_url(redis_url), name, permits)
    if lib == "no semaphore (control)":
        return (lambda: None), (lambda: None)
    raise ValueError(lib)


def hold_loop(acquire: Callable[[], Any], release: Callable[[], Any], counter: redis.Redis, key: str,
              duration: float, max_ops: int) -> tuple[Log, int]:
    """Take and give back a permit until ``duration`` or ``max_ops``; return the log and
    the most holders this worker saw inside (its own ``INCR``'s answer)."""
    log: Log = []
    most = 0
    end = time.monotonic() + duration
    while len(log) < max_ops and time.monotonic() < end:
        asked = time.time_ns()
        acquire()
        got = time.time_ns()
        most = max(most, int(counter.incr(key)))
        counter.decr(key)
        released = time.time_ns()
        release()
        log.append((asked, got, released))
    return log, most


def worker(lib: str, redis_url: str, name: str, permits: int, ready: Any, duration: float,
           max_ops: int) -> tuple[Log, int]:
    """Run in a spawned process once every process is ready (``ready``: a barrier)."""
    acquire, release = _pair(lib, redis_url, name, permits)
    counter = redis.Redis.from_url(redis_url)
    counter.ping()
    ready.wait(120)
    return hold_loop(acquire, release, counter, f"holders:{name}", duration, max_ops)


def analyse(logs: list[Log], permits: int) -> dict[str, Any]:
    """Turn the workers' logs into the table's numbers (see the module docstring)."""
    acqs = sorted((got, asked, rel, proc) for proc, log in enumerate(logs) for asked, got, rel in log)
    total = len(acqs)
    gots = [a[0] for a in acqs]
    matched = [False] * total
    gaps: list[float] = []
    self_handoffs = barged = 0
    for rel, proc in sorted((a[2], a[3]) for a in acqs):
        # Only releases while someone waited (asked before, admitted after) hand over.
        i = bisect.bisect_right(gots, rel)
        window = range(i, min(total, i + 1000))
        if not any(acqs[j][1] < rel for j in window):
            continue
        # The next holder admitted after this release (each admission answers one release).
        j = next((j for j in window if not matched[j]), None)
        if j is None:
            continue
        matched[j] = True
        gaps.append((acqs[j][0] - rel) / 1e6)
        self_handoffs += acqs[j][3] == proc
        barged += acqs[j][1] >= rel
    waits = [(a[0] - a[1]) / 1e6 for a in acqs]
    counts = [len(log) for log in logs]
    span = (max(a[2] for a in acqs) - acqs[0][0]) / 1e9 if total > 1 else 0.0
    return {
        "acquisitions": total,
        "acq_per_s": total / span if span > 0 else 0.0,
        "handoffs": len(gaps),
        "gap_p50_ms": _pct(gaps, 0.5),
        "gap_p99_ms": _pct(gaps, 0.99),
        "self_handoff": self_handoffs / len(gaps) if gaps else None,
        "barged": barged / len(gaps) if gaps else None,
        "wait_p50_ms": _pct(waits, 0.5),
        "wait_p99_ms": _pct(waits, 0.99),
        "fairness_max_min": (max(counts) / min(counts)) if counts and min(counts) > 0 else float("inf"),
    }


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class SemaphoreBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None = None, duration: float | None = None,
                 procs: int = 8, libs: list[str] | None = None, max_ops: int = 200_000,
                 permits: int = PERMITS) -> None:
        self.quick = quick
        self.runs = runs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.duration = duration or (1.5 if quick else 3.0)
        self.procs = procs
        self.libs = libs
        self.max_ops = max_ops
        self.permits = permits
        self.redis = RedisServer().start()
        self.client = redis.Redis.from_url(self.redis.url)
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs, "permits": permits,
                                        "load_before": os.getloadavg()}
        self.results["machine"]["peers"]["py-redis-semaphore"] = _version("py-redis-semaphore")
        # the server this run started (the first redis-server on PATH may be another build)
        self.results["machine"]["redis_server"] = f"Redis server v={self.client.info('server')['redis_version']}"

    def close(self) -> None:
        self.results["load_after"] = os.getloadavg()
        self.redis.stop()

    def uncontended(self) -> None:
        n = uuid.uuid4().hex[:8]
        engine = ylock.engine_from_url(self.redis.url)
        local = ylock.engine_from_url("local://")
        trivial = self.client.register_script("return 1")
        factories: dict[str, tuple[str, Callable[[], Callable[[], Any]]]] = {
            "floor: Redis EVALSHA round trip": ("redis", lambda: trivial),
            "ylock redis Lock (write)": ("redis", lambda: _op(ylock_lock(engine, f"l{n}"))),
            "ylock redis Semaphore (3 permits)": ("redis", lambda: _op(ylock_semaphore(engine, f"s{n}"))),
            "py-redis-semaphore Semaphore (limit 3)": ("redis", lambda: _op(py_redis_semaphore(self.client, n))),
            "ylock local Lock (write)": ("local", lambda: _op(ylock_lock(local, f"l{n}"))),
            "ylock local Semaphore (3 permits)": ("local", lambda: _op(ylock_semaphore(local, f"s{n}"))),
        }
        cases: dict[str, tuple[str, Callable[[], Any]]] = {}
        for name, (server, factory) in factories.items():
            try:
                cases[name] = (server, factory())
            except ModuleNotFoundError as exc:
                print(f"bench: no row for {name!r}: {exc.name} is not installed "
                      "(pip install -r bench/requirements.txt)", file=sys.stderr)
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in cases}
        for _ in range(self.runs):                   # interleaved: drift hits every case alike
            for name, (server, op) in cases.items():
                samples[name].append(measure(op, self.seconds, self.client if server == "redis" else None))
        rows = {name: {"server": server, **_row(samples[name])} for name, (server, _) in cases.items()}
        floor = rows["floor: Redis EVALSHA round trip"]["median"]
        for name, row in rows.items():
            if row["server"] == "redis" and not name.startswith("floor"):
                row["vs_floor"] = 2 * row["median"] / floor
        self.results["uncontended"] = rows
        ratios = {"redis sem/lock": ("ylock redis Semaphore (3 permits)", "ylock redis Lock (write)"),
                  "local sem/lock": ("ylock local Semaphore (3 permits)", "ylock local Lock (write)"),
                  "ylock sem/py-redis-semaphore": ("ylock redis Semaphore (3 permits)",
                                                   "py-redis-semaphore Semaphore (limit 3)")}
        self.results["ratios"] = {key: rows[a]["median"] / rows[b]["median"]
                                  for key, (a, b) in ratios.items() if a in rows and b in rows}
        # The ratio that matters, timed lock, sem, sem, lock back to back in short rounds:
        # steadier than the ratio of two medians when other work shares the machine.
        self.results["paired"] = {
            key: paired_ratio(cases[b][1], cases[a][1], 3 * self.runs, self.seconds / 4)
            for key, (a, b) in ratios.items() if key.endswith("sem/lock")}
        # Round trips and server commands per uncontended pair, counted by the server.
        counted: dict[str, Any] = {}
        for label, pair in (("lock", ylock_lock(engine, f"cl{n}")), ("semaphore", ylock_semaphore(engine, f"cs{n}"))):
            acquire, release = pair
            acquire()
            release()
            self.client.config_resetstat()
            for _ in range(100):
                acquire()
                release()
            cs = self.client.info("commandstats")
            counted[label] = {
                "round_trips": cs.get("cmdstat_evalsha", {}).get("calls", 0) / 100,
                "server_commands": sum(v["calls"] for k, v in cs.items()
                                       if not k.startswith(("cmdstat_config", "cmdstat_info"))) / 100}
        self.results["per_pair"] = counted

    def contended(self) -> None:
        libs = [lib for lib in LIBS if self.libs is None or lib in self.libs]
        try:
            import redis_semaphore  # noqa: F401
        except ModuleNotFoundError:
            libs = [lib for lib in libs if lib != "py-redis-semaphore"]
        trivial = self.client.register_script("return 1")
        out: dict[str, Any] = {}
        for lib in libs:
            runs = []
            for _ in range(self.runs):
                floor = rate(trivial, 0.3)
                name = uuid.uuid4().hex[:10]
                before = self.client.info("commandstats")
                if lib == "ylock local (threads)":
                    logs, most = self._threads(name)
                else:
                    with spawn.Manager() as manager, ProcessPoolExecutor(self.procs, mp_context=spawn) as pool:
                        ready = manager.Barrier(self.procs)
                        futures = [pool.submit(worker, lib, self.redis.url, name, self.permits, ready,
                                               self.duration, self.max_ops) for _ in range(self.procs)]
                        done = [f.result(timeout=300) for f in futures]
                    logs, most = [d[0] for d in done], max(d[1] for d in done)
                after = self.client.info("commandstats")
                row = analyse(logs, self.permits)
                row["max_holders"] = most
                row["over_permits"] = most > self.permits
                calls = sum(after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after
                            if not k.startswith(("cmdstat_info", "cmdstat_config")))
                # minus the counter's own INCR and DECR
                row["redis_cmds_per_acq"] = calls / max(1, row["acquisitions"]) - 2 \
                    if lib != "ylock local (threads)" else None
                row["round_trip_ms"] = 1000 / floor
                row["gap_p50_round_trips"] = None if row["gap_p50_ms"] is None else row["gap_p50_ms"] * floor / 1000
                runs.append(row)
            out[f"{self.procs} {'threads' if 'threads' in lib else 'processes'}, {self.permits} permits: {lib}"] = \
                median_rows(runs, {"max_holders": max, "over_permits": any})
        self.results["contended"] = out

    def _threads(self, name: str) -> tuple[list[Log], int]:
        engine = ylock.engine_from_url("local://")
        ready = threading.Barrier(self.procs)
        results: list[tuple[Log, int]] = [([], 0)] * self.procs

        def run(i: int) -> None:
            acquire, release = ylock_semaphore(engine, name, self.permits)
            counter = redis.Redis.from_url(self.redis.url)
            counter.ping()
            ready.wait(60)
            results[i] = hold_loop(acquire, release, counter, f"holders:{name}", self.duration, self.max_ops)
        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(self.procs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.duration + 120)
        return [r[0] for r in results], max(r[1] for r in results)


def _row(samples: list[dict[str, float]]) -> dict[str, Any]:
    """Pairs/s (median, min, max) and the medians of the CPU µs per pair."""
    row: dict[str, Any] = stats([x["rate"] for x in samples])
    for key in ("cpu_us", "server_us"):
        if key in samples[0]:
            row[key] = statistics.median(x[key] for x in samples)
    return row


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m['redis_server'].split(' sha')[0]}, "
             f"py-redis-semaphore {m['peers'].get('py-redis-semaphore')}; {m['when']}; medians of {r['runs']} runs"
             + (" (--quick)" if r["quick"] else "") + f"; load average {r['load_before'][0]:.1f} before, "
             f"{r.get('load_after', ['?'])[0]:.1f} after (2 cores: other work was running).", ""]
    if "uncontended" in r:
        lines += ["**Uncontended acquire+release, one client** (pairs/s; `vs floor` = 2 × pairs/s ÷ Redis "
                  "round trips/s, 1.0 means two bare round trips; CPU µs per pair of the client's thread and of "
                  "the Redis server's main thread, medians: on a busy machine they move less than pairs/s)",
                  "", "| case | median | min | max | vs floor | client CPU µs | server CPU µs |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["uncontended"].items():
            lines.append(f"| {name} | {f(row['median'])} | {f(row['min'])} | {f(row['max'])} | "
                         f"{f(row.get('vs_floor'), 2)} | {f(row.get('cpu_us'), 1)} | {f(row.get('server_us'), 1)} |")
        pp = r["per_pair"]
        paired = "; ".join(f"{k} = {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for k, v in r["paired"].items())
        lines += ["", "Ratios of the medians above: " + ", ".join(f"{k} = {v:.2f}" for k, v in r["ratios"].items())
                  + f". Timed lock, semaphore, semaphore, lock back to back ({r['runs'] * 3} rounds, median "
                  f"(min-max)): {paired}. Target: sem/lock ≥ 0.95. Per uncontended pair, counted by the server: "
                  f"semaphore {pp['semaphore']['round_trips']:.0f} round trips, "
                  f"{pp['semaphore']['server_commands']:.0f} commands (inside its scripts); lock "
                  f"{pp['lock']['round_trips']:.0f} round trips, {pp['lock']['server_commands']:.0f} commands.", ""]
    if "contended" in r:
        lines += [f"**Contended: {r['permits']} permits** (INCR+DECR of a holders counter inside; gap = a release "
                  "called while others waited → the next holder admitted, also in Redis round trips measured "
                  "right before each run; self = the releaser got it back while others waited; barged = the next "
                  "holder asked after the release)", "",
                  "| case | acq/s | max holders | gap p50 ms | gap p50 RTs | gap p99 ms | self | barged | "
                  "wait p50 ms | wait p99 ms | max/min | Redis cmds/acq |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["contended"].items():
            self_, barged = ("-" if row[k] is None else f"{row[k]:.0%}" for k in ("self_handoff", "barged"))
            lines.append(f"| {name} | {f(row['acq_per_s'])} | {row['max_holders']} | {f(row['gap_p50_ms'], 3)} | "
                         f"{f(row.get('gap_p50_round_trips'), 1)} | {f(row['gap_p99_ms'], 3)} | {self_} | {barged} | "
                         f"{f(row['wait_p50_ms'], 2)} | {f(row['wait_p99_ms'], 1)} | "
                         f"{f(row['fairness_max_min'], 2)} | {f(row['redis_cmds_per_acq'], 1)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.semaphore", __doc__, "semaphore")
    parser.add_argument("--max-ops", type=int, default=200_000, help="acquisitions per contended worker at most")
    parser.add_argument("--procs", type=int, default=8, help="contending processes (threads on local)")
    parser.add_argument("--permits", type=int, default=PERMITS, help="permits of the contended section")
    parser.add_argument("--libs", default=None, help="comma-separated cases for the contended section")
    args = parser.parse_args(argv)
    bench = SemaphoreBench(args.quick, runs_of(args), args.seconds, args.duration,
                           args.procs, args.libs.split(",") if args.libs else None, args.max_ops, args.permits)
    return run_bench(bench, args.only, args, "semaphore", markdown)


if __name__ == "__main__":
    main()
