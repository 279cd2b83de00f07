"""``python -m bench [--quick] [--out DIR]``: ylock against the Python lock libraries and
the round-trip floor, on a redis-server and a ZooKeeper that it starts itself on free
loopback ports. Every ratio compares numbers measured in the same run; each number is
the median of ``--runs`` runs (5), with min and max. Writes ``results/latest.json``,
``results/latest.md`` and ``results/latest.png``. The last section, ``guarantees``, is
:mod:`bench.guarantees` (issue 29's A, B, B, A ratios with CPU per pair, pinned; the cost
of each guarantee beside the plain path) on servers of its own; then ``scale``,
:mod:`bench.scale` (production scale: Cluster slots moving under held locks, 20,000 holds
in one process, listing in a crowded Redis, a thousand waiters) on servers of its own.
"""
from __future__ import annotations

import logging
import math
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import ylock
from bench import peers
from bench.common import (
    QUIET_STEAL_PCT,
    TopicBench,
    add_round_trips,
    add_vs_floor,
    bench_parser,
    cases_of,
    fmt,
    handoff_table,
    machine_line,
    median_rows,
    pair_op,
    paired_ratio,
    rate,
    run_bench,
    runs_of,
    stats,
    uncontended_table,
)
from bench.contended import contended_run
from ylock.testing import free_port
from ylock.testing.zookeeper import ZooKeeperServer


class Bench(TopicBench):
    def __init__(self, quick: bool, runs: int, libs: list[str] | None = None, seconds: float | None = None,
                 duration: float | None = None) -> None:
        super().__init__(quick, runs, seconds, duration)
        self.libs = libs
        self.start_redis()
        self.zk = ZooKeeperServer().start()
        self.on_close(self.zk.stop)

    # -- floor and uncontended ------------------------------------------------------------

    def uncontended(self) -> None:
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zk.hosts)
        zk.start()
        zk.ensure_path("/kazoo")
        trivial = self.client.register_script("return 1")
        engine = peers.ylock_engine(self.redis.url)
        zk_engine = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench")
        local = peers.ylock_engine("local://")
        n = uuid.uuid4().hex[:8]
        # (ylock's engines closed too: a ZooKeeper client left open reconnects forever to the
        # server the bench stops at its end.)
        stops: list[Callable[[], Any]] = [zk.stop, engine.close, zk_engine.close, local.close]

        def tooz(url: str, name: str) -> Callable[[], None]:
            coordinator = peers.tooz_coordinator(url)
            stops.append(coordinator.stop)
            return pair_op(peers.tooz_pair(coordinator, name))

        factories: dict[str, tuple[str, Callable[[], Callable[[], Any]]]] = {
            "floor: Redis EVALSHA round trip": ("redis", lambda: trivial),
            "floor: ZooKeeper exists round trip": ("zookeeper", lambda: lambda: zk.exists("/kazoo")),
            "ylock redis (write)": ("redis", lambda: pair_op(peers.ylock_pair(engine, f"w{n}"))),
            "ylock redis (read)": ("redis", lambda: pair_op(peers.ylock_pair(engine, f"r{n}", "read"))),
            "hand-written SET NX PX + EVALSHA delete": ("redis", lambda: pair_op(peers.hand_written(self.client, n))),
            "redis-py Lock": ("redis", lambda: pair_op(peers.redis_py(self.client, n))),
            "python-redis-lock": ("redis", lambda: pair_op(peers.python_redis_lock(self.client, n))),
            "python-redis-lock (auto-renewal)": ("redis", lambda: pair_op(peers.python_redis_lock(self.client, "a" + n,
                                                                                                  True))),
            "pottery Redlock (1 master)": ("redis", lambda: pair_op(peers.pottery_redlock(self.client, n))),
            "sherlock": ("redis", lambda: pair_op(peers.sherlock_lock(self.client, n))),
            "tooz redis": ("redis", lambda: tooz(self.redis.url, "t" + n)),
            "ylock zookeeper (write)": ("zookeeper", lambda: pair_op(peers.ylock_pair(zk_engine, f"w{n}"))),
            "ylock zookeeper (read)": ("zookeeper", lambda: pair_op(peers.ylock_pair(zk_engine, f"r{n}", "read"))),
            "kazoo Lock": ("zookeeper", lambda: pair_op(peers.kazoo_pair(zk, "l" + n, "lock"))),
            "kazoo WriteLock": ("zookeeper", lambda: pair_op(peers.kazoo_pair(zk, "w" + n, "write"))),
            "kazoo ReadLock": ("zookeeper", lambda: pair_op(peers.kazoo_pair(zk, "r" + n, "read"))),
            "tooz zookeeper": ("zookeeper", lambda: tooz(f"kazoo://{self.zk.hosts}", "z" + n)),
            "ylock local (write)": ("local", lambda: pair_op(peers.ylock_pair(local, f"w{n}"))),
        }
        cases = cases_of({name: (lambda server=server, factory=factory: (server, factory()))
                          for name, (server, factory) in factories.items()}, " (pip install -r bench/requirements.txt)")
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(self.runs):                   # interleaved: drift hits every case alike
            for name, (_, op) in cases.items():
                samples[name].append(rate(op, self.seconds))
        rows = {name: {"server": server, **stats(samples[name])} for name, (server, _) in cases.items()}
        floors = {"redis": rows["floor: Redis EVALSHA round trip"]["median"],
                  "zookeeper": rows["floor: ZooKeeper exists round trip"]["median"]}
        add_vs_floor(rows, lambda row: floors.get(row["server"]))
        self.results["uncontended"] = rows
        pairs = {"ylock/hand-written": ("ylock redis (write)", "hand-written SET NX PX + EVALSHA delete"),
                 "ylock/sherlock": ("ylock redis (write)", "sherlock"),
                 "ylock/redis-py": ("ylock redis (write)", "redis-py Lock"),
                 "ylock/python-redis-lock": ("ylock redis (write)", "python-redis-lock"),
                 "ylock zk/kazoo WriteLock": ("ylock zookeeper (write)", "kazoo WriteLock")}
        self.results["ratios"] = {key: rows[ours]["median"] / rows[peer]["median"]
                                  for key, (ours, peer) in pairs.items() if peer in rows}
        # The same ratios timed back to back (peer, ylock, ylock, peer in short rounds): the
        # machine's drift within a round cancels out, far steadier than two medians.
        rounds, seconds = (3, 0.1) if self.quick else (15, 0.2)
        self.results["back_to_back"] = {key: paired_ratio(cases[peer][1], cases[ours][1], rounds, seconds)
                                        for key, (ours, peer) in pairs.items() if peer in cases and ours in cases}
        # Round trips per uncontended acquire+release, counted by the server.
        self.client.config_resetstat()
        acquire, release = peers.ylock_pair(engine, f"c{n}")
        for _ in range(100):
            acquire()
            release()
        calls = sum(v["calls"] for k, v in self.client.info("commandstats").items() if k != "cmdstat_config|resetstat"
                    and not k.startswith("cmdstat_info"))
        evalsha = self.client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        self.results["round_trips_per_pair"] = evalsha / 100
        self.results["server_commands_per_pair"] = calls / 100
        # Reentry: no network at all.
        lock = ylock.Lock(engine, "bench", f"re{n}")
        lock.lock()
        reps = 20000 if self.quick else 200000
        began = time.perf_counter()
        for _ in range(reps):
            lock.lock()
            lock.unlock()
        self.results["reentry_us"] = (time.perf_counter() - began) / reps * 1e6
        lock.unlock()
        for stop in stops:
            stop()

    # -- contended ------------------------------------------------------------------------

    def contended(self) -> None:
        libs = ["ylock redis (notify)", "ylock redis (polling only)", "hand-written SET NX", "redis-py Lock",
                "python-redis-lock", "sherlock", "pottery Redlock", "tooz redis", "ylock zookeeper", "kazoo Lock",
                "no lock (control)"]
        libs = [lib for lib in libs if self.libs is None or lib in self.libs]
        procs_list = [4] if self.quick else [4, 16]
        duration = self.duration
        out: dict[str, Any] = {}
        # The gap in round trips: against the floors measured right before each run (the
        # machine's speed drifts over the minutes a full run takes).
        trivial = self.client.register_script("return 1")
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zk.hosts)
        zk.start()
        for procs in procs_list:
            for lib in libs:
                runs = []
                for _ in range(1 if self.quick else 3):
                    zk_floor = rate(lambda: zk.exists("/"), 0.3)
                    redis_floor = rate(trivial, 0.3)
                    row = contended_run(lib, self.redis.url, self.zk.hosts, procs, duration, self.client,
                                        self.zk.node.port)
                    add_round_trips(row, zk_floor if "zookeeper" in lib or "kazoo" in lib else redis_floor)
                    runs.append(row)
                out[f"{procs} processes: {lib}"] = median_rows(runs)
        zk.stop()
        self.results["contended"] = out

    # -- the cost of the guarantees, and issue 29's ratios --------------------------------------

    def guarantees(self) -> None:
        """Every section of :mod:`bench.guarantees` (its own servers, pinned; see there)."""
        from bench import guarantees

        bench = guarantees.Guarantees(self.quick, self.runs)
        try:
            for section in guarantees.SECTIONS.split(","):
                began = time.perf_counter()
                getattr(bench, section)()
                print(f"bench: guarantees.{section} done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        finally:
            bench.close()
        self.results["guarantees"] = bench.results

    # -- production scale (issue 41) -----------------------------------------------------------------

    def scale(self) -> None:
        """Every section of :mod:`bench.scale` (its own servers; see there)."""
        from bench import scale

        bench = scale.Scale(self.quick)
        for section in scale.SECTIONS.split(","):
            began = time.perf_counter()
            getattr(bench, section)()
            print(f"bench: scale.{section} done in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        self.results["scale"] = bench.results

    # -- readers behind a writer ---------------------------------------------------------------------

    def readers(self) -> None:
        from kazoo.client import KazooClient

        engine = peers.ylock_engine(self.redis.url)
        zk_engine = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench")
        zk = KazooClient(hosts=self.zk.hosts)
        zk.start()
        rows: dict[str, Any] = {}
        for n_readers in (1, 8, 32):
            for lib in ("ylock redis", "ylock zookeeper", "kazoo"):
                samples = [_readers_behind_writer(lib, engine, zk_engine, zk, n_readers) for _ in range(self.runs)]
                rows[f"{lib}, {n_readers} readers"] = {
                    "release": stats([x["release"] for x in samples]),
                    "all_in": stats([x["all_in"] for x in samples])}
        zk.stop()
        engine.close()
        zk_engine.close()
        self.results["readers_behind_writer_ms"] = rows

    # -- many holds ----------------------------------------------------------------------------------

    def many_holds(self) -> None:
        count = 2000 if self.quick else 10_000
        lease = 3.0
        engine = peers.ylock_engine(self.redis.url)
        locks = ylock.Locks(engine, "many", lease=lease)
        names = [f"h{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
        for name in names:
            locks.lock(name)
        batches: list[int] = []
        ylock.WATCHDOG.on_batch = lambda eng, n, secs: batches.append(n) if eng is engine else None
        cpu, wall = time.process_time(), time.perf_counter()
        periods = 1 if self.quick else 3
        time.sleep(lease * periods)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        ylock.WATCHDOG.on_batch = None
        renew_periods = wall / (lease / 3)
        pipelines = sum(math.ceil(n / engine.renew_chunk) for n in batches)  # type: ignore[attr-defined]
        lost = sum(locks[name].lost for name in names)
        for name in names:
            locks.unlock(name)
        engine.close()
        self.results["many_holds"] = {
            "ylock": {"holds": count, "seconds": wall, "renewals": sum(batches), "batches": len(batches),
                      "round_trips_per_renewal_period": pipelines / renew_periods, "cpu_seconds": cpu,
                      "threads": 1, "lost": lost},
        }
        # python-redis-lock renews each lock from its own thread: cap the thread count.
        import redis_lock

        capped = 200 if self.quick else 1000
        client = redis.Redis.from_url(self.redis.url, max_connections=capped + 50)   # a connection per thread
        held = [redis_lock.Lock(client, f"prl-many:{i}:{uuid.uuid4().hex[:6]}", expire=int(lease),
                                auto_renewal=True) for i in range(capped)]
        for lk in held:
            lk.acquire()
        self.client.config_resetstat()
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(lease * periods)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        stats_ = self.client.info("commandstats")
        renew_calls = sum(v["calls"] for k, v in stats_.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
        lost = 0
        for lk in held:
            try:
                lk.release()
            except redis_lock.NotAcquired:
                lost += 1
        self.results["many_holds"]["python-redis-lock"] = {"lost": lost,
            "holds": capped, "seconds": wall, "round_trips_per_renewal_period": renew_calls / (wall / (lease * 2 / 3)),
            "cpu_seconds": cpu, "threads": capped,
            "note": f"capped at {capped} locks: one renewal thread per lock"}

    # -- metrics overhead --------------------------------------------------------------------------------

    def metrics_overhead(self) -> None:
        import ylock.metrics

        engine = peers.ylock_engine(self.redis.url)
        op = pair_op(peers.ylock_pair(engine, f"m{uuid.uuid4().hex[:6]}"))
        metrics = ylock.metrics.configure({"STATS": True, "PROMETHEUS": True}, setting="bench")
        # InfluxDB too, at a port where nothing listens: the buffer fills and drops (the
        # lock path must not care whether the server is there).
        down = f"http://127.0.0.1:{free_port()}"
        influx = ylock.metrics.configure({"STATS": False, "INFLUXDB": {"URL": down, "TOKEN": "t", "ORG": "o",
                                                                       "BUCKET": "b", "RETRIES": 0}},
                                         setting="bench").influxdb
        logging.getLogger("influxdb_client").setLevel(logging.CRITICAL)
        subscribers = metrics.subscribers
        every = [*subscribers, influx]
        on, off, all_on = [], [], []
        for _ in range(self.runs):
            for s in every:
                ylock.events.unsubscribe(s)
            off.append(rate(op, self.seconds))
            for s in subscribers:
                ylock.events.subscribe(s)
            on.append(rate(op, self.seconds))
            ylock.events.subscribe(influx)
            all_on.append(rate(op, self.seconds))
        for s in every:
            ylock.events.unsubscribe(s)
        self.results["metrics_overhead"] = {
            "off": stats(off), "on": stats(on), "on/off": statistics.median(on) / statistics.median(off),
            "on + influxdb (down)": stats(all_on),
            "on + influxdb (down)/off": statistics.median(all_on) / statistics.median(off)}


def _readers_behind_writer(lib: str, engine: Any, zk_engine: Any, zk: Any, n: int) -> dict[str, float]:
    """Queue ``n`` reader threads behind a writer, release it and return ms from the
    release until it returned (``release``; for ylock, every reader holds the read lock on
    the server by then, or this raises) and until all ``n`` readers are running (``all_in``).
    Readers hold until all are in, so no reader's release slows the others' entry."""
    name = uuid.uuid4().hex[:10]
    got: list[float] = []
    queued = threading.Semaphore(0)
    all_running = threading.Barrier(n + 1)
    done = threading.Event()
    reader: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]]   # a new read lock's (acquire, release)
    if lib == "kazoo":
        writer = zk.WriteLock(f"/kazoo-rw/{name}")
        writer.acquire()

        def reader() -> tuple[Callable[[], Any], Callable[[], Any]]:
            lock = zk.ReadLock(f"/kazoo-rw/{name}")
            return (lambda: lock.acquire(timeout=30)), lock.release
        release = writer.release
        count_waiters = lambda: len(zk.get_children(f"/kazoo-rw/{name}")) - 1  # noqa: E731
        readers_on_server = None
    else:
        eng = engine if lib == "ylock redis" else zk_engine
        writer_lock = ylock.Lock(eng, "bench", name)
        writer_lock.lock()
        # a poll interval longer than the test: every entry comes from the writer's release
        polling = ylock.Polling.constant(1.5)

        def reader() -> tuple[Callable[[], Any], Callable[[], Any]]:
            lock = ylock.Lock(eng, "bench", name, polling=polling)
            return (lambda: lock.rlock(timeout=30)), lock.runlock
        release = writer_lock.unlock
        count_waiters = lambda: sum(len(i.waiters) for i in eng.describe("bench") if i.name == name)  # noqa: E731
        readers_on_server = lambda: sum(len(i.owners) for i in eng.describe("bench")  # noqa: E731
                                        if i.name == name and i.mode == "read")

    def read() -> None:
        acquire, release_read = reader()
        queued.release()
        acquire()
        got.append(time.perf_counter())
        all_running.wait(30)
        done.wait(30)
        release_read()
    threads = [threading.Thread(target=read, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        queued.acquire()
    deadline = time.monotonic() + 30
    while count_waiters() < n and time.monotonic() < deadline:
        time.sleep(0.005)
    released = time.perf_counter()
    release()
    returned = time.perf_counter()
    if lib == "ylock redis" and readers_on_server is not None:
        admitted = readers_on_server()
        if admitted != n:
            raise AssertionError(f"{admitted} of {n} readers held the lock when the writer's release returned")
    all_running.wait(30)
    all_in = (max(got) - released) * 1000
    done.set()
    for t in threads:
        t.join(30)
    return {"release": (returned - released) * 1000, "all_in": all_in}


#: The contended table's max/min with ∞ where a process never got the lock.
_HANDOFF_INF = {"max/min": lambda row: _fmt(row.get("fairness_max_min"), 2)}


def _fmt(v: Any, digits: int = 0) -> str:
    """:func:`bench.common.fmt`, with an infinite ratio as ∞ (a process that never got the lock)."""
    return "∞" if isinstance(v, float) and math.isinf(v) else fmt(v, digits)


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [machine_line(r, f"{m['redis_server'].split(' sha')[0]}, ZooKeeper {m['zookeeper']}"), ""]
    if "uncontended" in r:
        lines += _uncontended_md(r)
    lines += _rest_md(r)
    if "guarantees" in r:
        from bench import guarantees

        lines += ["### Ratios the issue-29 way, and the cost of the guarantees (`python -m bench.guarantees`)", "",
                  guarantees.markdown(r["guarantees"])]
    if "scale" in r:
        from bench import scale

        lines += ["### Production scale (`python -m bench.scale`)", "", scale.markdown(r["scale"])]
    return "\n".join(lines)


def _uncontended_md(r: dict[str, Any]) -> list[str]:
    lines = ["**Uncontended acquire+release, one client** (ops/s; `vs floor` = 2 × ops/s ÷ round trips/s, "
             "1.0 means two bare round trips)", "",
             *uncontended_table("library", r["uncontended"], "median, min, max, vs floor")]
    lines += ["", "Ratios (same run): " + ", ".join(f"{k} = {v:.2f}" for k, v in r["ratios"].items())
              + f"; ylock round trips per uncontended acquire+release: {r['round_trips_per_pair']:.0f}; "
              f"re-entry {r['reentry_us']:.2f} µs.", ""]
    if r.get("back_to_back"):
        lines += ["Timed back to back (peer, ylock, ylock, peer in short rounds; median (min-max); CPU stolen "
                  "by the hypervisor, median (max) over the rounds; the ratio over the rounds where at most "
                  f"{QUIET_STEAL_PCT:.0f} % was stolen, and how many): "
                  + ", ".join(f"{k} = {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}; stolen "
                              f"{v.get('steal_pct', {}).get('median', 0):.0f} % "
                              f"({v.get('steal_pct', {}).get('max', 0):.0f} %); quiet "
                              + (f"{v['quiet']['median']:.2f} ({v['quiet']['rounds']})"
                                 if v.get("quiet", {}).get("rounds") else "none") + ")"
                              for k, v in r["back_to_back"].items()) + ".", ""]
    return lines


def _rest_md(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "contended" in r:
        lines += ["**Contended handoff** (one lock, a GET+SET counter inside; gap = release → next acquire, also "
                  "in round trips of its server (Redis `EVALSHA`, ZooKeeper `exists`) measured right before each "
                  "run; self = the releaser took it straight back; wait = of processes that took it from another)",
                  "", *handoff_table("processes: library", r["contended"], "acq/s, lost updates, gap p50 ms, "
                                     "gap p50 RTs, gap p99 ms, self, wait p50 ms, wait p99 ms, wait max ms, max/min, "
                                     "Redis cmds/acq, ZK reqs/acq", _HANDOFF_INF), ""]
    if "readers_behind_writer_ms" in r:
        lines += ["**N readers queued behind a writer** (threads of one process): ms from the writer's release "
                  "until its release call returned (ylock redis: all N readers hold the lock on the server by "
                  "then, checked) and until all N reader threads run; medians (min-max)", "",
                  "| case | release returned | all readers running |", "|---|---:|---:|"]
        for name, row in r["readers_behind_writer_ms"].items():
            rel, allin = row["release"], row["all_in"]
            lines.append(f"| {name} | {rel['median']:.2f} ({rel['min']:.2f}-{rel['max']:.2f}) | "
                         f"{allin['median']:.2f} ({allin['min']:.2f}-{allin['max']:.2f}) |")
        lines.append("")
    if "many_holds" in r:
        lines += ["**Many holds kept alive**", "", "| library | holds | renewal round trips per period | CPU s | "
                  "threads |", "|---|---:|---:|---:|---:|"]
        for name, row in r["many_holds"].items():
            lines.append(f"| {name} | {row['holds']:,} | {row['round_trips_per_renewal_period']:.1f} | "
                         f"{row['cpu_seconds']:.2f} | {row['threads']} |")
        lines.append("")
    if "metrics_overhead" in r:
        mo = r["metrics_overhead"]
        lines += [f"**Metrics overhead**: uncontended ylock redis with metrics on (aggregator + Prometheus) vs off: "
                  f"{mo['on']['median']:,.0f} vs {mo['off']['median']:,.0f} ops/s = {mo['on/off']:.3f}×; "
                  f"with the InfluxDB exporter too (server down: buffer full, events dropped and counted) "
                  f"{mo['on + influxdb (down)']['median']:,.0f} ops/s = {mo['on + influxdb (down)/off']:.3f}×", ""]
    return lines


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5))
    # The local engine (no network) would stretch the axis tenfold: it is in the table.
    rows = {k: v for k, v in r["uncontended"].items() if not k.startswith("floor") and "local" not in k}
    names = list(rows)
    axes[0].barh(names, [rows[n]["median"] for n in names],
                 xerr=[[rows[n]["median"] - rows[n]["min"] for n in names],
                       [rows[n]["max"] - rows[n]["median"] for n in names]],
                 color=["tab:orange" if n.startswith("ylock") else "tab:gray" for n in names])
    for floor, style in (("floor: Redis EVALSHA round trip", "--"), ("floor: ZooKeeper exists round trip", ":")):
        axes[0].axvline(r["uncontended"][floor]["median"] / 2, linestyle=style, color="k", label=floor + " / 2")
    axes[0].set_xlabel("acquire+release per second (one client; higher is better)")
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=8)
    if "contended" in r:
        crow = {k: v for k, v in r["contended"].items() if "control" not in k and k.startswith("4 processes")}
        cn = list(crow)
        y = list(range(len(cn)))
        axes[1].barh([i - 0.2 for i in y], [crow[n]["gap_p50_ms"] or 0 for n in cn], height=0.4,
                     label="release → next acquire, p50", color="tab:blue")
        axes[1].barh([i + 0.2 for i in y], [crow[n]["cross_wait_p99_ms"] or 0 for n in cn], height=0.4,
                     label="wait p99 of the processes that took it from another", color="tab:red", alpha=0.6)
        axes[1].set_yticks(y, [n.split(": ", 1)[1] for n in cn])
        axes[1].set_xscale("log")
        axes[1].set_xlim(left=0.05)
        axes[1].set_xlabel("milliseconds (log; lower is better), 4 processes on one lock")
        axes[1].invert_yaxis()
        axes[1].legend(fontsize=8)
    fig.suptitle("ylock vs Python lock libraries (same run, same servers)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)



def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench", __doc__, "latest",
                          "uncontended,contended,readers,many_holds,metrics_overhead,guarantees,scale")
    parser.add_argument("--libs", default=None, help="comma-separated libraries for the contended section")
    args = parser.parse_args(argv)
    bench = Bench(args.quick, runs_of(args), args.libs.split(",") if args.libs else None,
                  args.seconds, args.duration)

    def plot_if_measured(results: dict[str, Any], out: Path) -> None:
        if "uncontended" in results:
            plot(results, out / "latest.png")

    return run_bench(bench, args.only, args, "latest", markdown, plot_if_measured)


if __name__ == "__main__":
    main()
