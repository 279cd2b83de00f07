"""``python -m bench.zookeeper [--quick] [--runs N] [--out DIR]``: ylock's ZooKeeper engine
against kazoo's recipes and the request floors, on one standalone ZooKeeper it starts itself
(``ylock.testing.zookeeper``: free loopback ports, transaction log synced to disk before
each answer, ZooKeeper's default). Every ratio compares numbers measured in the same run;
each number is the median of ``--runs`` runs (5), with min and max; the cases of a section
are interleaved (uncontended: each run takes turns in 5 slices per case), so the machine's
drift hits every case alike, and each ratio is also given per run, whose spread is its
noise. Writes ``results/zookeeper.json`` and ``zookeeper.md``.

- **uncontended**: one client, acquire+release of a free lock in a loop: ylock write and
  read; kazoo's ``WriteLock``, ``ReadLock`` and ``Lock``; and the floors, on a plain kazoo
  client: an ephemeral sequential create then its delete (the two writes every lock
  recipe makes), ``get_children`` and ``exists`` (one read each). Two more rows run on a
  kazoo client given the handler ylock's engine gives its own (kazoo's ``handler=``
  option): they tell the recipe's share of the difference from the client's. ``requests``
  are the packets ZooKeeper received per pair (``srvr``), ``CPU µs`` the client process's
  CPU time (every thread: kazoo's connection and callback threads too) per pair.
- **contended**: 4 processes, started at a barrier, take one lock in turn and bump a
  counter in a file (read it, then write it plus one) inside it; the control row, without
  a lock, must lose updates. ``gap`` is from one holder's release call to the next
  holder's acquisition; ``self`` the share of acquisitions where the releaser took the lock
  straight back; ``max/min`` the busiest process's acquisitions over the least busy one's
  (1.0 = fair); ``reqs/acq`` the packets ZooKeeper received per acquisition, ``CPU ms/acq``
  a worker's CPU time per acquisition (median over the processes).
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

import ylock
from bench.common import bench_parser, machine, median_rows, rate, run_bench, runs_of, spawn, stats
from bench.contended import analyse
from ylock.testing.zookeeper import ZooKeeperServer, four_letter

Pair = tuple[Callable[[], Any], Callable[[], Any]]

WRITE_FLOOR = "floor: kazoo create+delete"
READ_FLOOR = "floor: kazoo get_children"
RTT_FLOOR = "floor: kazoo exists"
HANDLER_FLOOR = "create+delete, kazoo client with ylock's handler"
HANDLER_WRITELOCK = "kazoo WriteLock, kazoo client with ylock's handler"
CONTENDED = ["ylock zookeeper", "kazoo Lock", "no lock (control)"]
SLICES = 5                    # turns per case within one uncontended run


def received(port: int) -> int:
    """The packets the server received so far (``srvr``)."""
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Received:"):
            return int(line.split(":")[1])
    raise RuntimeError(f"no srvr answer from ZooKeeper on port {port}")


def ylock_pair(engine: ylock.Engine, name: str, mode: str = "write") -> Pair:
    lock = ylock.Lock(engine, "bench", name)
    return (lock.lock, lock.unlock) if mode == "write" else (lock.rlock, lock.runlock)


def kazoo_pair(client: KazooClient, name: str, kind: str) -> Pair:
    recipe = {"lock": client.Lock, "write": client.WriteLock, "read": client.ReadLock}[kind](f"/kazoo/{name}")
    return recipe.acquire, recipe.release


def _timed(op: Callable[[], Any], seconds: float) -> tuple[int, float, float]:
    """Call ``op`` for about ``seconds``; return the calls, the seconds and the process's
    CPU seconds (every thread: kazoo's too) they took."""
    ops = 0
    cpu, began = time.process_time(), time.perf_counter()
    deadline = began + seconds
    while True:
        for _ in range(5):
            op()
        ops += 5
        now = time.perf_counter()
        if now >= deadline:
            return ops, now - began, time.process_time() - cpu


def _op(pair: Pair) -> Callable[[], None]:
    acquire, release = pair

    def op() -> None:
        acquire()
        release()
    return op


def _pair(lib: str, hosts: str, name: str) -> tuple[Pair, Any]:
    if lib == "ylock zookeeper":
        engine = ylock.engine_from_url(f"zookeeper://{hosts}/bench")
        return ylock_pair(engine, name), engine
    if lib == "kazoo Lock":
        client = KazooClient(hosts=f"{hosts}/bench")
        client.start()
        return kazoo_pair(client, name, "lock"), client
    if lib == "no lock (control)":
        return ((lambda: None), (lambda: None)), None
    raise ValueError(lib)


def worker(lib: str, hosts: str, name: str, counter: str, barrier: Any, duration: float,
           max_ops: int) -> tuple[list[tuple[int, int, int]], float]:
    """Run in a spawned process: take the lock in turn with the others and bump the file
    counter inside it; return (asked, got, released) ns timestamps per acquisition and the
    CPU seconds of the loop. ``barrier`` (all workers and the parent) is passed three
    times: connected, go, done (the parent reads the server's counters in between)."""
    (acquire, release), keep = _pair(lib, hosts, name)
    acquire()                      # connected, the lock's parents made: not part of the run
    release()
    fd = os.open(counter, os.O_RDWR)
    log: list[tuple[int, int, int]] = []
    barrier.wait(120)
    barrier.wait(120)
    cpu = time.process_time()
    end = time.time() + duration
    while time.time() < end and len(log) < max_ops:
        asked = time.time_ns()
        acquire()
        got = time.time_ns()
        value = int(os.pread(fd, 20, 0) or b"0")
        os.pwrite(fd, b"%-20d" % (value + 1), 0)
        released = time.time_ns()
        release()
        log.append((asked, got, released))
    cpu = time.process_time() - cpu
    barrier.wait(120)
    os.close(fd)
    if isinstance(keep, KazooClient):
        keep.stop()
        keep.close()
    elif keep is not None:
        keep.close()
    return log, cpu


class ZooKeeperBench:
    def __init__(self, quick: bool, runs: int, seconds: float | None, duration: float | None,
                 procs: int = 4) -> None:
        self.quick = quick
        self.runs = runs
        self.procs = procs
        self.seconds = seconds or (0.3 if quick else 1.0)
        self.duration = duration or (1.5 if quick else 3.0)
        self.server = ZooKeeperServer().start()
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "runs": runs}
        self.results["machine"]["zookeeper"] = four_letter(self.server.port, "srvr").splitlines()[0] \
            .split(":", 1)[1].split(",")[0].split("-")[0].strip()
        self.results["machine"]["load_before"] = os.getloadavg()

    def close(self) -> None:
        self.server.stop()

    # -- uncontended ------------------------------------------------------------------------

    def uncontended(self) -> None:
        zk = KazooClient(hosts=self.server.hosts)
        zk.start()
        zk.ensure_path("/kazoo")
        zk.ensure_path("/floor")
        engine = ylock.engine_from_url(f"zookeeper://{self.server.hosts}/bench")
        engine.ping()
        # A kazoo client with the handler ylock's engine gives its own client (kazoo's public
        # handler= option): kazoo's recipe on the same client machinery as ylock's.
        zk_h = KazooClient(hosts=self.server.hosts, handler=type(engine.client.handler)())  # type: ignore[attr-defined]
        zk_h.start()
        n = uuid.uuid4().hex[:8]

        def create_delete(client: KazooClient) -> Callable[[], None]:
            return lambda: client.delete(client.create("/floor/n-", ephemeral=True, sequence=True))
        cases: dict[str, Callable[[], Any]] = {
            WRITE_FLOOR: create_delete(zk),
            READ_FLOOR: lambda: zk.get_children("/floor"),
            RTT_FLOOR: lambda: zk.exists("/floor"),
            "ylock zookeeper (write)": _op(ylock_pair(engine, f"w{n}")),
            "ylock zookeeper (read)": _op(ylock_pair(engine, f"r{n}", "read")),
            "kazoo WriteLock": _op(kazoo_pair(zk, f"w{n}", "write")),
            "kazoo ReadLock": _op(kazoo_pair(zk, f"r{n}", "read")),
            "kazoo Lock": _op(kazoo_pair(zk, f"l{n}", "lock")),
            HANDLER_FLOOR: create_delete(zk_h),
            HANDLER_WRITELOCK: _op(kazoo_pair(zk_h, f"h{n}", "write")),
        }
        samples: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for op in cases.values():
            op()                                     # the lock's parents made, connections warm
        for _ in range(self.runs):
            # Each run takes turns in SLICES slices per case: the machine's drift (other
            # processes come and go within seconds here) hits every case of a run alike.
            done = {name: [0, 0.0, 0.0] for name in cases}      # ops, seconds, CPU seconds
            for _ in range(SLICES):
                for name, op in cases.items():
                    ops, wall, used = _timed(op, self.seconds / SLICES)
                    done[name][0] += ops
                    done[name][1] += wall
                    done[name][2] += used
            for name, (ops, wall, used) in done.items():
                samples[name].append(ops / wall)
                cpu[name].append(used / ops * 1e6)
        rows: dict[str, dict[str, Any]] = {}
        for name, op in cases.items():
            rows[name] = {**stats(samples[name]), "cpu_us": statistics.median(cpu[name]),
                          "requests": self._requests(op)}
        # The floor of a recipe that sends its create and its children read together, then
        # its delete: a create+delete pair plus a read, were nothing overlapped.
        floor = 1 / (1 / rows[WRITE_FLOOR]["median"] + 1 / rows[READ_FLOOR]["median"])
        self.results["uncontended"] = rows
        self.results["three_request_floor"] = floor
        ratios = {"ylock write / kazoo WriteLock": ("ylock zookeeper (write)", "kazoo WriteLock"),
                  "ylock read / kazoo ReadLock": ("ylock zookeeper (read)", "kazoo ReadLock"),
                  "ylock write / kazoo Lock": ("ylock zookeeper (write)", "kazoo Lock"),
                  "ylock write / create+delete floor": ("ylock zookeeper (write)", WRITE_FLOOR),
                  "ylock write / kazoo WriteLock on ylock's handler": ("ylock zookeeper (write)", HANDLER_WRITELOCK)}
        # Each ratio twice: of the medians, and per run (the cases of one run ran seconds
        # apart, so the spread of the per-run ratios is the noise of the ratio itself).
        self.results["ratios"] = {key: _ratio(samples[ours], samples[peer]) for key, (ours, peer) in ratios.items()}
        ours_w = rows["ylock zookeeper (write)"]["median"]
        self.results["ratios"]["ylock write / 3-request floor"] = {"of_medians": ours_w / floor}
        engine.close()
        for client in (zk, zk_h):
            client.stop()
            client.close()

    def _requests(self, op: Callable[[], Any]) -> float:
        """Packets the server received per call of ``op`` (the least of two counts: an idle
        client's ping may land in one)."""
        count = 50 if self.quick else 200
        counts = []
        for _ in range(2):
            op()
            before = received(self.server.port)
            for _ in range(count):
                op()
            counts.append((received(self.server.port) - before) / count)
        return min(counts)

    # -- contended --------------------------------------------------------------------------

    def contended(self) -> None:
        procs = self.procs
        probe = KazooClient(hosts=self.server.hosts)
        probe.start()
        probe.ensure_path("/bench")
        runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in CONTENDED}
        for _ in range(self.runs):
            for lib in CONTENDED:                    # interleaved, as above
                floor = rate(lambda: probe.exists("/"), 0.3)
                name = uuid.uuid4().hex[:10]
                with tempfile.NamedTemporaryFile("w", prefix="ylock-bench-counter-", delete=False) as f:
                    f.write("0")
                try:
                    with spawn.Manager() as manager, ProcessPoolExecutor(procs, mp_context=spawn) as pool:
                        barrier = manager.Barrier(procs + 1)
                        futures = [pool.submit(worker, lib, self.server.hosts, name, f.name, barrier, self.duration,
                                               200_000) for _ in range(procs)]
                        barrier.wait(180)            # every worker connected
                        before = received(self.server.port)
                        barrier.wait(60)             # go
                        barrier.wait(self.duration + 120)   # done
                        requests = received(self.server.port) - before
                        results = [fut.result(timeout=120) for fut in futures]
                    counter = int(Path(f.name).read_text().strip() or 0)
                finally:
                    os.unlink(f.name)
                logs = [log for log, _ in results]
                row = analyse(logs, counter)
                row["zk_requests_per_acq"] = requests / max(1, row["acquisitions"])
                row["cpu_ms_per_acq"] = statistics.median(cpu / max(1, len(log)) * 1000 for log, cpu in results)
                row["round_trip_ms"] = 1000 / floor
                row["gap_p50_round_trips"] = None if row["gap_p50_ms"] is None else row["gap_p50_ms"] * floor / 1000
                row["per_process"] = [len(log) for log in logs]
                runs[lib].append(row)
        probe.stop()
        probe.close()
        out = {f"{procs} processes: {lib}": median_rows(rows, skip=("per_process",), spread=("acq_per_s", "gap_p50_ms"))
               for lib, rows in runs.items()}
        self.results["contended"] = out
        ours, peer = runs["ylock zookeeper"], runs["kazoo Lock"]
        self.results["contended_ratios"] = {
            "acq/s ylock / kazoo Lock": _ratio([r["acq_per_s"] for r in ours], [r["acq_per_s"] for r in peer]),
            "gap p50 ylock / kazoo Lock": _ratio([r["gap_p50_ms"] for r in ours], [r["gap_p50_ms"] for r in peer]),
            "CPU per acquisition ylock / kazoo Lock": _ratio([r["cpu_ms_per_acq"] for r in ours],
                                                             [r["cpu_ms_per_acq"] for r in peer]),
        }
        self.results["contended_runs"] = runs


def _ratio(ours: list[float], peers: list[float]) -> dict[str, float]:
    """ours ÷ peers: of the medians, and the median, least and greatest of the per-run ratios."""
    per_run = [a / b for a, b in zip(ours, peers)]
    return {"of_medians": statistics.median(ours) / statistics.median(peers), "per_run_median":
            statistics.median(per_run), "per_run_min": min(per_run), "per_run_max": max(per_run)}


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, ZooKeeper {m['zookeeper']} "
             f"(standalone, fsync on), kazoo {m['peers'].get('kazoo')}; {m['when']}; load average before "
             f"{m['load_before'][0]:.1f}; medians of {r['runs']} runs" + (" (--quick)" if r["quick"] else "") + ".",
             ""]
    if "uncontended" in r:
        lines += ["**Uncontended acquire+release, one client** (pairs/s; requests = packets ZooKeeper received per "
                  "pair; CPU = the client process's CPU time per pair, all threads)", "",
                  "| case | median | min | max | requests | CPU µs |", "|---|---:|---:|---:|---:|---:|"]
        for name, row in r["uncontended"].items():
            lines.append(f"| {name} | {f(row['median'])} | {f(row['min'])} | {f(row['max'])} | "
                         f"{row['requests']:.2f} | {f(row['cpu_us'])} |")
        lines += ["", "Ratios (same run; of the medians, then the per-run ratios' median and min-max): "
                  + "; ".join(_ratio_md(k, v) for k, v in r["ratios"].items())
                  + f" (3-request floor: 1 / (1/create+delete + 1/get_children) = {r['three_request_floor']:,.0f} "
                  "pairs/s).", ""]
    if "contended" in r:
        lines += [f"**Contended handoff** ({r['contended_procs'] if 'contended_procs' in r else 4} processes started "
                  "at a barrier, one lock, a read-then-write file counter inside; gap = release call → next "
                  "acquisition, also in `exists` round trips measured before each run)", "",
                  "| processes: library | acq/s (min-max) | lost updates | gap p50 ms (min-max) | gap p50 RTs | "
                  "gap p99 ms | self | wait p99 ms | max/min | reqs/acq | CPU ms/acq |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in r["contended"].items():
            lines.append(
                f"| {name} | {f(row['acq_per_s'])} ({f(row['acq_per_s_min'])}-{f(row['acq_per_s_max'])}) | "
                f"{row['lost_updates']} | {f(row.get('gap_p50_ms'), 3)} ({f(row.get('gap_p50_ms_min'), 2)}-"
                f"{f(row.get('gap_p50_ms_max'), 2)}) | {f(row.get('gap_p50_round_trips'), 1)} | "
                f"{f(row.get('gap_p99_ms'), 3)} | {row['self_reacquire']:.0%} | {f(row.get('cross_wait_p99_ms'), 1)} | "
                f"{f(row['fairness_max_min'], 2)} | {f(row['zk_requests_per_acq'], 2)} | "
                f"{f(row['cpu_ms_per_acq'], 2)} |")
        lines += ["", "Ratios (same run; of the medians, then the per-run ratios' median and min-max): "
                  + "; ".join(_ratio_md(k, v) for k, v in r["contended_ratios"].items()) + ".", ""]
    return "\n".join(lines)


def _ratio_md(key: str, ratio: dict[str, float]) -> str:
    if "per_run_median" not in ratio:
        return f"{key} = {ratio['of_medians']:.2f}"
    return (f"{key} = **{ratio['of_medians']:.2f}** ({ratio['per_run_median']:.2f}, "
            f"{ratio['per_run_min']:.2f}-{ratio['per_run_max']:.2f})")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.zookeeper", __doc__, "zookeeper")
    parser.add_argument("--procs", type=int, default=4, help="processes in the contended section")
    args = parser.parse_args(argv)
    bench = ZooKeeperBench(args.quick, runs_of(args), args.seconds, args.duration, args.procs)
    bench.results["contended_procs"] = args.procs
    return run_bench(bench, args.only, args, "zookeeper", markdown)


if __name__ == "__main__":
    main()
