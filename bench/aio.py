"""``python -m bench.aio [--quick] [--runs N] [--out DIR]``: ylock's asyncio verbs (issue
15) against redis-py's own ``redis.asyncio`` ``Lock`` and against ylock's blocking verbs,
on one redis-server that it starts itself on a free loopback port, in one run. Each
number is the median of ``--runs`` runs (5), with min and max; the uncontended cases are
interleaved run by run, the contended ones in 10 rounds of redis.asyncio's ``Lock``, ylock,
ylock, redis.asyncio's ``Lock`` (their ratio: the median over the rounds, with the CPU the
hypervisor stole). Writes ``results/aio.json`` and ``aio.md``.

- **uncontended**: one task (or one thread), acquire+release of a free lock in a loop:
  ``await lock.alock(); await lock.aunlock()``, ``lock.lock(); lock.unlock()``,
  ``redis.asyncio`` ``Lock`` ``await acquire(); await release()`` and redis-py's blocking
  ``Lock``; ylock's local engine both ways (no network: the cost of the asyncio path
  itself). ``vs floor`` = 2 × pairs/s ÷ round trips/s of ``EVALSHA`` of ``return 1``
  through the same kind of client (``redis.asyncio`` for the asyncio rows).
- **contended**: tasks take one lock in turn and bump a Redis counter with a non-atomic
  GET then SET (through ``redis.asyncio``) inside it: ``--tasks`` (8) tasks in one
  process, and 4 processes of ``--tasks-per-process`` (4) tasks each, started at a barrier
  (processes) and all created at once (tasks). ``lost updates`` must be 0 for every lock,
  and is not for ``no lock (control)``. The other columns are those of ``bench/run.py``'s
  contended table, per task: gap = from one holder's release call to the next holder's
  acquisition, also in round trips (``EVALSHA`` floor measured right before each run);
  self = the releasing task took the lock straight back; max/min = the busiest over the
  least busy task's acquisitions. ``redis.asyncio`` ``Lock`` waits by polling with
  ``await asyncio.sleep(0.1)`` (its default ``sleep``); ylock's tasks wait on one ``BLPOP``
  per event loop that a release pushes the lock to.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import redis
import redis.asyncio as aredis

import ylock
from bench.common import (
    bench_parser,
    machine,
    measure,
    median_rows,
    paired,
    rate,
    run_bench,
    runs_of,
    server_cpu,
    spawn,
    stats,
    with_steal,
)
from bench.contended import analyse
from ylock.testing.redis import RedisServer

#: Rounds of redis.asyncio's Lock, ylock, ylock, redis.asyncio's Lock per contended shape
#: (``--quick``: 2): their ratio, the median over the rounds, the drift of the machine's
#: speed moves far less than a ratio of two medians taken minutes apart.
CONTENDED_ROUNDS = 10
Log = list[tuple[int, int, int]]
LIBS = ["ylock redis (asyncio)", "redis.asyncio Lock", "no lock (control)"]


async def ameasure(func: Callable[[], Awaitable[Any]], seconds: float,
                   server: redis.Redis | None = None) -> dict[str, float]:
    """:func:`bench.run.measure` of an awaitable: awaits of ``func()`` per second, and CPU
    µs per await of this thread (the event loop's) and of the Redis server's main thread.
    The server's counters are read with the blocking client before and after."""
    await func()
    before = server_cpu(server) if server is not None else 0.0
    ops, began, cpu = 0, time.perf_counter(), time.thread_time()
    deadline = began + seconds
    while ops < 1_000_000:
        for _ in range(50):
            await func()
        ops += 50
        if time.perf_counter() >= deadline:
            break
    wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
    out = {"rate": ops / wall, "cpu_us": cpu / ops * 1e6}
    if server is not None:
        out["server_us"] = (server_cpu(server) - before) / ops * 1e6
    return out


async def _measure(op: Callable[[], Any], is_async: bool, seconds: float,
                   server: redis.Redis | None = None) -> dict[str, float]:
    return await ameasure(op, seconds, server) if is_async else measure(op, seconds, server)


async def apaired_ratio(a: tuple[Callable[[], Any], bool], b: tuple[Callable[[], Any], bool], rounds: int,
                        seconds: float) -> dict[str, float]:
    """:func:`bench.run.paired_ratio` of (op, is_async) cases: ``b``'s rate over ``a``'s,
    timed a, b, b, a back to back in each of ``rounds`` rounds; median, min and max."""
    ratios = []
    for _ in range(rounds):
        a1, b1, b2, a2 = [(await _measure(*case, seconds))["rate"] for case in (a, b, b, a)]
        ratios.append((b1 + b2) / (a1 + a2))
    return stats(ratios)


def _ylock_async(lock: ylock.Lock) -> Callable[[], Awaitable[None]]:
    async def op() -> None:
        await lock.alock()
        await lock.aunlock()
    return op


def _redis_async(lock: Any) -> Callable[[], Awaitable[None]]:
    async def op() -> None:
        await lock.acquire()
        await lock.release()
    return op


def _sync(acquire: Callable[[], Any], release: Callable[[], Any]) -> Callable[[], None]:
    def op() -> None:
        acquire()
        release()
    return op


# -- contended: one process's tasks ------------------------------------------------------------

async def _tasks(lib: str, redis_url: str, name: str, tasks: int, ready: Any, duration: float,
                 max_ops: int) -> list[Log]:
    client = aredis.Redis.from_url(redis_url)
    await client.ping()
    key = f"counter:{name}"
    if lib == "ylock redis (asyncio)":
        lock = ylock.Lock(ylock.engine_from_url(redis_url), "bench", name)
        pairs = [(lock.alock, lock.aunlock)] * tasks          # one lock object: the task is the owner
    elif lib == "redis.asyncio Lock":
        locks = [client.lock(f"aredis:{name}", timeout=30) for _ in range(tasks)]
        pairs = [(lk.acquire, lk.release) for lk in locks]
    elif lib == "no lock (control)":
        async def nothing() -> None:
            return None
        pairs = [(nothing, nothing)] * tasks
    else:
        raise ValueError(lib)

    async def run(acquire: Callable[[], Awaitable[Any]], release: Callable[[], Awaitable[Any]]) -> Log:
        log: Log = []
        end = time.monotonic() + duration
        while len(log) < max_ops and time.monotonic() < end:
            asked = time.time_ns()
            await acquire()
            got = time.time_ns()
            value = int(await client.get(key) or 0)
            await client.set(key, value + 1)
            released = time.time_ns()
            await release()
            log.append((asked, got, released))
        return log
    if ready is not None:
        ready.wait(120)            # every process is set up: start together
    logs = await asyncio.gather(*(run(a, r) for a, r in pairs))
    await client.aclose()
    return list(logs)


def worker(lib: str, redis_url: str, name: str, tasks: int, ready: Any, duration: float,
           max_ops: int) -> list[Log]:
    """Run in a spawned process: ``tasks`` tasks in one event loop; one log per task."""
    return asyncio.run(_tasks(lib, redis_url, name, tasks, ready, duration, max_ops))


class AsyncBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None = None, duration: float | None = None,
                 tasks: int = 8, procs: int = 4, tasks_per_process: int = 4, libs: list[str] | None = None,
                 max_ops: int = 200_000, rounds: int | None = None) -> None:
        self.quick = quick
        self.runs = runs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.duration = duration or (1.5 if quick else 2.0)
        self.tasks = tasks
        self.procs = procs
        self.tasks_per_process = tasks_per_process
        self.libs = libs
        self.max_ops = max_ops
        #: Rounds of the contended pairing (see :data:`CONTENDED_ROUNDS`).
        self.rounds = rounds or (2 if quick else CONTENDED_ROUNDS)
        self.redis = RedisServer().start()
        self.client = redis.Redis.from_url(self.redis.url)
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs,
                                        "load_before": os.getloadavg()}
        # the server this run started (the first redis-server on PATH may be another build)
        self.results["machine"]["redis_server"] = f"Redis server v={self.client.info('server')['redis_version']}"

    def close(self) -> None:
        self.results["load_after"] = os.getloadavg()
        self.redis.stop()

    def uncontended(self) -> None:
        asyncio.run(self._uncontended())

    async def _uncontended(self) -> None:
        n = uuid.uuid4().hex[:8]
        engine = ylock.engine_from_url(self.redis.url)
        local = ylock.engine_from_url("local://")
        aclient = aredis.Redis.from_url(self.redis.url)
        trivial = self.client.register_script("return 1")
        atrivial = aclient.register_script("return 1")
        lock = ylock.Lock(engine, "bench", f"w{n}")
        local_lock = ylock.Lock(local, "bench", f"w{n}")
        rlock = self.client.lock(f"redispy:{n}", timeout=30)
        arlock = aclient.lock(f"aredis:{n}", timeout=30)
        # (kind, sync op or async op)
        cases: dict[str, tuple[str, Callable[[], Any], bool]] = {
            "floor: EVALSHA round trip (redis-py)": ("sync", trivial, False),
            "floor: EVALSHA round trip (redis.asyncio)": ("async", atrivial, True),
            "ylock redis alock/aunlock (asyncio)": ("async", _ylock_async(lock), True),
            "ylock redis lock/unlock (blocking)": ("sync", _sync(lock.lock, lock.unlock), False),
            "redis.asyncio Lock acquire/release": ("async", _redis_async(arlock), True),
            "redis-py Lock acquire/release (blocking)": ("sync", _sync(rlock.acquire, rlock.release), False),
            "ylock local alock/aunlock (asyncio)": ("local", _ylock_async(local_lock), True),
            "ylock local lock/unlock (blocking)": ("local", _sync(local_lock.lock, local_lock.unlock), False),
        }
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in cases}
        for _ in range(self.runs):                   # interleaved: drift hits every case alike
            for name, (kind, op, is_async) in cases.items():
                samples[name].append(await _measure(op, is_async, self.seconds,
                                                    None if kind == "local" else self.client))
        rows: dict[str, Any] = {}
        for name, (kind, _, _) in cases.items():
            rows[name] = {"kind": kind, **stats([x["rate"] for x in samples[name]])}
            for key in ("cpu_us", "server_us"):
                if key in samples[name][0]:
                    rows[name][key] = statistics.median(x[key] for x in samples[name])
        floors = {"sync": rows["floor: EVALSHA round trip (redis-py)"]["median"],
                  "async": rows["floor: EVALSHA round trip (redis.asyncio)"]["median"]}
        for name, row in rows.items():
            if row["kind"] in floors and not name.startswith("floor"):
                row["vs_floor"] = 2 * row["median"] / floors[row["kind"]]
        self.results["uncontended"] = rows
        pairs = {"ylock asyncio/redis.asyncio Lock": ("ylock redis alock/aunlock (asyncio)",
                                                      "redis.asyncio Lock acquire/release"),
                 "ylock asyncio/ylock blocking": ("ylock redis alock/aunlock (asyncio)",
                                                  "ylock redis lock/unlock (blocking)"),
                 "redis.asyncio Lock/redis-py Lock": ("redis.asyncio Lock acquire/release",
                                                      "redis-py Lock acquire/release (blocking)"),
                 "floor asyncio/floor blocking": ("floor: EVALSHA round trip (redis.asyncio)",
                                                  "floor: EVALSHA round trip (redis-py)"),
                 "ylock local asyncio/blocking": ("ylock local alock/aunlock (asyncio)",
                                                  "ylock local lock/unlock (blocking)")}
        self.results["ratios"] = {key: rows[a]["median"] / rows[b]["median"] for key, (a, b) in pairs.items()}
        # The two ratios that matter, timed back to back in short rounds (steadier on a busy machine).
        self.results["paired"] = {
            key: await apaired_ratio(cases[b][1:], cases[a][1:], 3 * self.runs, self.seconds / 4)
            for key, (a, b) in pairs.items() if key.startswith("ylock asyncio")}
        # Script round trips per asyncio pair, counted by the server (uncontended, nothing else is sent).
        op = _ylock_async(lock)
        await op()
        self.client.config_resetstat()
        for _ in range(100):
            await op()
        cs = self.client.info("commandstats")
        self.results["round_trips_per_async_pair"] = sum(
            cs.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval")) / 100
        await aclient.aclose()

    def contended(self) -> None:
        libs = [lib for lib in LIBS if self.libs is None or lib in self.libs]
        trivial = self.client.register_script("return 1")
        shapes = [(1, self.tasks), (self.procs, self.tasks_per_process)]
        ours, peer, control = LIBS
        rounds = self.rounds
        out: dict[str, Any] = {}
        paired_out: dict[str, Any] = {}
        for procs, tasks in shapes:
            label = f"{tasks} tasks in 1 process" if procs == 1 else f"{procs} processes × {tasks} tasks"

            def run(lib: str, procs: int = procs, tasks: int = tasks) -> dict[str, Any]:
                return with_steal(lambda: self._contended_run(lib, procs, tasks, trivial))
            if ours in libs and peer in libs:
                # redis.asyncio's Lock, ylock, ylock, redis.asyncio's Lock in each round
                got = paired(lambda: run(peer), lambda: run(ours), rounds, "acq_per_s")
                samples = got.pop("samples")
                out[f"{label}: {ours}"] = median_rows(samples["b"])
                out[f"{label}: {peer}"] = median_rows(samples["a"])
                paired_out[label] = got
            else:
                for lib in (ours, peer):
                    if lib in libs:
                        out[f"{label}: {lib}"] = median_rows([run(lib) for _ in range(self.runs)])
            if control in libs:            # it must lose updates: a run or two show it
                out[f"{label}: {control}"] = median_rows([run(control) for _ in range(1 if self.quick else 2)])
        self.results["contended"] = out
        self.results["contended_paired"] = paired_out

    def _contended_run(self, lib: str, procs: int, tasks: int, trivial: Any) -> dict[str, Any]:
        """One contended run of ``lib``: ``procs`` processes of ``tasks`` tasks on a new lock."""
        floor = rate(trivial, 0.3)
        name = uuid.uuid4().hex[:10]
        before = self.client.info("commandstats")
        with spawn.Manager() as manager, ProcessPoolExecutor(procs, mp_context=spawn) as pool:
            ready = manager.Barrier(procs) if procs > 1 else None
            futures = [pool.submit(worker, lib, self.redis.url, name, tasks, ready, self.duration,
                                   self.max_ops) for _ in range(procs)]
            logs = [log for f in futures for log in f.result(timeout=300)]
        after = self.client.info("commandstats")
        counter = int(self.client.get(f"counter:{name}") or 0)
        row = analyse(logs, counter)
        calls = sum(after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after
                    if not k.startswith(("cmdstat_info", "cmdstat_config")))
        row["redis_cmds_per_acq"] = calls / max(1, row["acquisitions"]) - 2   # minus GET and SET
        row["round_trip_ms"] = 1000 / floor
        row["gap_p50_round_trips"] = None if row["gap_p50_ms"] is None else row["gap_p50_ms"] * floor / 1000
        return row


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m['redis_server'].split(' sha')[0]}, "
             f"redis-py {m['peers'].get('redis')}; {m['when']}; medians of {r['runs']} runs"
             + (" (--quick)" if r["quick"] else "") + f"; load average {r['load_before'][0]:.1f} before, "
             f"{r.get('load_after', ['?'])[0]:.1f} after (2 cores: other work was running).", ""]
    if "uncontended" in r:
        lines += ["**Uncontended acquire+release, one task or thread** (pairs/s; `vs floor` = 2 × pairs/s ÷ "
                  "EVALSHA round trips/s through the same kind of client; CPU µs per pair of the client's thread "
                  "and of the Redis server's main thread, medians)", "",
                  "| case | median | min | max | vs floor | client CPU µs | server CPU µs |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["uncontended"].items():
            lines.append(f"| {name} | {f(row['median'])} | {f(row['min'])} | {f(row['max'])} | "
                         f"{f(row.get('vs_floor'), 2)} | {f(row.get('cpu_us'), 1)} | {f(row.get('server_us'), 1)} |")
        paired = "; ".join(f"{k} = {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for k, v in r["paired"].items())
        lines += ["", "Ratios of the medians above: " + ", ".join(f"{k} = {v:.2f}" for k, v in r["ratios"].items())
                  + f". Timed back to back ({r['runs'] * 3} rounds of a, b, b, a; median (min-max)): {paired}. "
                  f"ylock script round trips per uncontended asyncio pair (counted by the server): "
                  f"{r['round_trips_per_async_pair']:.0f}.", ""]
    if "contended" in r:
        lines += ["**Contended, asyncio** (one lock, a GET+SET counter inside; gap = release → next acquire, "
                  "also in EVALSHA round trips measured right before each run; self = the releasing task took "
                  "it straight back; max/min over tasks)", "",
                  "| case | acq/s | lost updates | gap p50 ms | gap p50 RTs | gap p99 ms | self | wait p50 ms | "
                  "wait p99 ms | max/min | Redis cmds/acq |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["contended"].items():
            lines.append(f"| {name} | {f(row['acq_per_s'])} | {row['lost_updates']} | {f(row['gap_p50_ms'], 3)} | "
                         f"{f(row.get('gap_p50_round_trips'), 1)} | {f(row['gap_p99_ms'], 3)} | "
                         f"{row['self_reacquire']:.0%} | {f(row['cross_wait_p50_ms'], 1)} | "
                         f"{f(row['cross_wait_p99_ms'], 1)} | {f(row['fairness_max_min'], 2)} | "
                         f"{f(row['redis_cmds_per_acq'], 1)} |")
        lines.append("")
        for label, v in r.get("contended_paired", {}).items():
            steal, q = v["steal_pct"], v["quiet"]
            quiet = f"{q['median']:.2f} ({q['rounds']})" if q.get("rounds") else "none"
            lines.append(f"{label}, ylock ÷ redis.asyncio Lock in acquisitions/s, {v['rounds']} rounds of it, ylock, "
                         f"ylock, it: {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}); CPU stolen "
                         f"{steal['median']:.0f} % ({steal['max']:.0f} %); the rounds with at most "
                         f"{q['steal_pct_at_most']:.0f} % stolen: {quiet}.")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.aio", __doc__, "aio")
    parser.add_argument("--max-ops", type=int, default=200_000, help="acquisitions per contending task at most")
    parser.add_argument("--tasks", type=int, default=8, help="tasks of the one-process contended runs")
    parser.add_argument("--procs", type=int, default=4, help="processes of the multi-process contended runs")
    parser.add_argument("--tasks-per-process", type=int, default=4)
    parser.add_argument("--libs", default=None, help="comma-separated cases for the contended section")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"contended rounds of redis.asyncio Lock, ylock, ylock, it ({CONTENDED_ROUNDS}; quick 2)")
    args = parser.parse_args(argv)
    bench = AsyncBench(args.quick, runs_of(args), args.seconds, args.duration, args.tasks,
                       args.procs, args.tasks_per_process, args.libs.split(",") if args.libs else None, args.max_ops,
                       args.rounds)
    return run_bench(bench, args.only, args, "aio", markdown)


if __name__ == "__main__":
    main()
