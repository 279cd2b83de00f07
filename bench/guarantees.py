"""``python -m bench.guarantees [--quick] [--only SECTIONS]``: issue 29's figures, each a
ratio measured the same way: interleaved rounds A, B, B, A in one process (ten or more, the
median with min and max), the client's CPU per pair (this thread's and the whole process's)
and the server's (Redis: INFO cpu, main thread; ZooKeeper: the JVM's /proc stat) for each
side; this process pinned to one CPU, every server it starts to the other (the placement is
in the results). Sections:

- ``ratios``: ylock's fair write pair against sherlock and redis-py ``Lock``; asyncio
  ``alock``/``aunlock`` against redis.asyncio ``Lock``; ZooKeeper write pair against kazoo
  ``WriteLock`` (all uncontended);
- ``floor``: 4 processes contending on ylock's fair lock and on a hand-written fair-handoff
  floor (a ticket lock, :func:`bench.peers.ticket_lock`), a GET+SET counter inside, in
  rounds of floor, ylock, ylock, floor (one contended run each); plus a control with no
  lock, which must lose updates;
- (``tokens``, which timed tokens as max(fence + 1, server TIME µs) against the previous
  INCRBY tokens on a fence key of their own, is gone: the fence lives in the lock's own x key
  since the index and Cluster migration work, so a rising token costs no command of its own:
  the fast path reads x anyway; the older scheme had no key to patch any more);
- ``wait_replicas``: ``wait_replicas=1`` against 0 on Sentinel and on Cluster, one replica each;
- ``zk_suspended``: ZooKeeper ``suspended=guard`` (the default) against ``suspended=wait``,
  the pair and a hold of some seconds (requests per second at the server, ``srvr``);
- ``acl``: the threaded handoff under a user with exactly ``acl_rules()``, the same without
  ``+blpop`` (the polling fallback), and the default user;
- ``tls``: the threaded handoff over ``rediss://`` with client certificates against
  plaintext on the same server.

Writes ``guarantees.json`` and ``guarantees.md`` in ``--out``.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import ylock
from bench import peers, restricted_acl
from bench.common import (
    QUIET_STEAL_PCT,
    bench_parser,
    machine,
    pair_op,
    paired,
    paired_ratio,
    percentile,
    run_bench,
    runs_of,
    server_cpu,
    with_steal,
)
from bench.contended import contended_run, zk_received
from ylock.testing.redis import RedisCluster, RedisSentinel, RedisServer, make_tls_files
from ylock.testing.zookeeper import ZooKeeperServer

SECTIONS = "ratios,floor,wait_replicas,zk_suspended,acl,tls"

#: Rounds of floor, ylock, ylock, floor in ``floor`` (a contended run takes a few seconds,
#: most of them starting its processes).
FLOOR_ROUNDS = 10

def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def proc_cpu(pid: int) -> Callable[[], float]:
    """A function that returns the CPU seconds process ``pid`` (all its threads) has used."""
    tick = os.sysconf("SC_CLK_TCK")

    def seconds() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick
    return seconds


class Placement:
    """This process (and the threads and processes it starts later) on ``client`` CPU, every
    server process it has started on ``server`` CPU; with fewer than 2 CPUs, nothing pinned."""

    def __init__(self, client: int = 1, server: int = 0) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.enabled = len(cpus) >= 2
        self.client, self.server = (client, server) if self.enabled else (-1, -1)
        self.saved = cpus
        if self.enabled:
            subprocess.run(["taskset", "-a", "-p", "-c", str(client), str(os.getpid())], check=True,
                           stdout=subprocess.DEVNULL)

    def pin_servers(self) -> None:
        """Pin every process this one has started that is not Python (the servers)."""
        if not self.enabled:
            return
        for pid in _descendants(os.getpid()):
            if not _comm(pid).startswith("python"):
                subprocess.run(["taskset", "-a", "-p", "-c", str(self.server), str(pid)], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def describe(self) -> str:
        if not self.enabled:
            return "not pinned (fewer than 2 CPUs)"
        return f"client process on CPU {self.client}, servers on CPU {self.server}"

    def restore(self) -> None:
        if self.enabled:
            subprocess.run(["taskset", "-a", "-p", "-c", ",".join(map(str, self.saved)), str(os.getpid())],
                           check=False, stdout=subprocess.DEVNULL)


def async_op(loop: asyncio.AbstractEventLoop, acquire: Callable[[], Any], release: Callable[[], Any],
             batch: int) -> Callable[[], None]:
    """``batch`` asyncio acquire+release pairs in one ``run_until_complete`` (a call of it is
    ``batch`` operations: pass ``per_call=batch`` to :func:`bench.run.measure`)."""
    async def many() -> None:
        for _ in range(batch):
            await acquire()
            await release()
    return lambda: loop.run_until_complete(many())


def _with(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


class Guarantees:
    def __init__(self, quick: bool, runs: int, seconds: float | None = None, duration: float | None = None,
                 hold: float | None = None) -> None:
        self.quick = quick
        self.rounds = 10 if quick else max(10, 3 * runs)
        self.seconds = seconds or (0.05 if quick else 0.2)
        self.duration = duration or (1.0 if quick else 2.0)
        self.hold = hold or (3.0 if quick else 8.0)
        self.placement = Placement()
        self.redis = RedisServer().start()
        self.zk = ZooKeeperServer().start()
        self.placement.pin_servers()
        self.client = redis.Redis.from_url(self.redis.url)
        self.zk_pid = self.zk.node.proc.pid if self.zk.node.proc is not None else 0
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "rounds": self.rounds,
                                        "seconds_per_side": self.seconds, "placement": self.placement.describe(),
                                        "load_before": os.getloadavg()}
        self.results["machine"]["redis_server"] = f"Redis server v={self.client.info('server')['redis_version']}"
        self.stops: list[Callable[[], Any]] = []

    def close(self) -> None:
        for stop in self.stops:
            stop()
        self.redis.stop()
        self.zk.stop()
        self.placement.restore()

    def _ratio(self, a: Callable[[], Any], b: Callable[[], Any], server: Any, per_call: int = 1,
               a_name: str = "", b_name: str = "") -> dict[str, Any]:
        out = paired_ratio(a, b, self.rounds, self.seconds, server, per_call)
        out["a"]["name"], out["b"]["name"] = a_name, b_name
        return out

    # -- 1. ratios --------------------------------------------------------------------------

    def ratios(self) -> None:
        from kazoo.client import KazooClient

        n = uuid.uuid4().hex[:8]
        engine = peers.ylock_engine(self.redis.url)
        ylock_op = pair_op(peers.ylock_pair(engine, f"w{n}"))
        out: dict[str, Any] = {}
        out["ylock fair write pair / sherlock"] = self._ratio(
            pair_op(peers.sherlock_lock(self.client, n)), ylock_op, self.client, 1, "sherlock", "ylock")
        out["ylock fair write pair / redis-py Lock"] = self._ratio(
            pair_op(peers.redis_py(self.client, n)), ylock_op, self.client, 1, "redis-py Lock", "ylock")
        # asyncio: one event loop for both sides, 20 pairs per run_until_complete
        import redis.asyncio as aredis

        loop = asyncio.new_event_loop()
        try:
            lock = ylock.Lock(engine, "bench", f"a{n}")
            aclient = aredis.Redis.from_url(self.redis.url)
            alock = aclient.lock(f"redisaio:{n}", timeout=30)
            batch = 20
            out["asyncio alock/aunlock / redis.asyncio Lock"] = self._ratio(
                async_op(loop, alock.acquire, alock.release, batch), async_op(loop, lock.alock, lock.aunlock, batch),
                self.client, batch, "redis.asyncio Lock", "ylock alock/aunlock")
            loop.run_until_complete(aclient.aclose())
        finally:
            loop.close()
        engine.close()
        zk = KazooClient(hosts=self.zk.hosts)
        zk.start()
        zk.ensure_path("/kazoo")
        zk_engine = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench")
        out["ylock ZooKeeper write pair / kazoo WriteLock"] = self._ratio(
            pair_op(peers.kazoo_pair(zk, "w" + n, "write")), pair_op(peers.ylock_pair(zk_engine, f"w{n}")),
            proc_cpu(self.zk_pid), 1, "kazoo WriteLock", "ylock zookeeper")
        zk_engine.close()
        zk.stop()
        self.results["ratios"] = out

    # -- 2. the fair-handoff floor ----------------------------------------------------------

    def floor(self) -> None:
        procs = 4
        libs = ("fair-handoff floor (ticket lock)", "ylock redis (notify)")
        rounds = 1 if self.quick else FLOOR_ROUNDS

        def run(lib: str) -> dict[str, Any]:
            return with_steal(lambda: contended_run(lib, self.redis.url, self.zk.hosts, procs, self.duration,
                                                    self.client))
        # floor, ylock, ylock, floor in each round, ylock's acquisitions/s over the floor's
        got = paired(lambda: run(libs[0]), lambda: run(libs[1]), rounds, "acq_per_s")
        samples = got.pop("samples")
        rows: dict[str, Any] = {}
        for lib, runs in zip(libs, (samples["a"], samples["b"])):
            rows[lib] = {key: statistics.median(r[key] for r in runs if r[key] is not None)
                         if key != "lost_updates" else max(r[key] for r in runs)
                         for key in ("acq_per_s", "lost_updates", "redis_cmds_per_acq", "self_reacquire",
                                     "gap_p50_ms", "fairness_max_min")}
        control = contended_run("no lock (control)", self.redis.url, self.zk.hosts, procs, self.duration, self.client)
        rows["no lock (control)"] = {"acq_per_s": control["acq_per_s"], "lost_updates": control["lost_updates"]}
        self.results["floor"] = {"processes": procs, "rounds": rounds, "rows": rows, "ylock / floor": got}

    # -- 3b. wait_replicas ------------------------------------------------------------------------

    def wait_replicas(self) -> None:
        n = uuid.uuid4().hex[:8]
        out: dict[str, Any] = {}
        sentinel = RedisSentinel(replicas=1).start()
        try:
            sentinel.wait_replica_known()
            self.placement.pin_servers()
            clients = [redis.Redis(port=s.port) for s in sentinel.servers]
            out["Sentinel, 1 replica: wait_replicas=1 / 0"] = self._deployment_ratio(sentinel.url, clients, n)
        finally:
            sentinel.stop()
        cluster = RedisCluster(masters=3, replicas=1).start()
        try:
            self.placement.pin_servers()
            clients = [redis.Redis(port=node.port) for node in cluster.nodes]
            out["Cluster, 3 masters + 1 replica each: wait_replicas=1 / 0"] = self._deployment_ratio(
                cluster.url, clients, n)
        finally:
            cluster.stop()
        self.results["wait_replicas"] = out

    def _deployment_ratio(self, url: str, clients: list[redis.Redis], n: str) -> dict[str, Any]:
        # Every master's replica is linked before the figures start (a replica still
        # syncing would fail the first WAITs); a longer WAIT and socket timeout than
        # the defaults on both sides, so that a loaded machine slows the figures, not fails them.
        deadline = time.monotonic() + 60
        for client in clients:
            # WAIT on a connection that wrote nothing counts the replicas linked now
            while client.info("replication")["role"] == "master" and int(client.execute_command("WAIT", 1, 200)) < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no replica of {client} linked within 60 s")
        options = "socket_timeout=5&wait_timeout=2"
        plain = peers.ylock_engine(_with(url, options))
        waiting = peers.ylock_engine(_with(url, options + "&wait_replicas=1"))
        try:
            # the servers' CPU: all of them (the replicas' share is what WAIT costs them)
            return self._ratio(pair_op(peers.ylock_pair(plain, f"p{n}")), pair_op(peers.ylock_pair(waiting, f"p{n}")),
                               lambda: sum(server_cpu(c) for c in clients), 1, "wait_replicas=0", "wait_replicas=1")
        finally:
            plain.close()
            waiting.close()

    # -- 3c. ZooKeeper suspended=guard ---------------------------------------------------------

    def zk_suspended(self) -> None:
        n = uuid.uuid4().hex[:8]
        guard = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench")
        wait = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench?suspended=wait")
        out: dict[str, Any] = {"pair: suspended=guard / wait": self._ratio(
            pair_op(peers.ylock_pair(wait, f"z{n}")), pair_op(peers.ylock_pair(guard, f"z{n}")),
            proc_cpu(self.zk_pid), 1, "suspended=wait", "suspended=guard (default)")}
        guard.close()
        wait.close()
        # A hold of ``self.hold`` seconds: requests per second the server received meanwhile,
        # guard, wait, wait, guard, each from an engine of its own and the only session open
        # (the server counts every session's requests; the wait is the measurement, not a
        # synchronisation).
        held: dict[str, list[float]] = {"suspended=guard (default)": [], "suspended=wait": []}
        query = {"suspended=guard (default)": "", "suspended=wait": "?suspended=wait"}
        for label in (*held, *reversed(held)):
            engine = peers.ylock_engine(f"zookeeper://{self.zk.hosts}/bench{query[label]}")
            lock = ylock.Lock(engine, "bench", f"h{n}")
            lock.lock()
            before, began = zk_received(self.zk.node.port), time.monotonic()
            time.sleep(self.hold)
            received, spent = zk_received(self.zk.node.port) - before, time.monotonic() - began
            lock.unlock()
            engine.close()
            held[label].append((received - 1) / spent)      # minus the srvr of its own reading
        out[f"hold of {self.hold:.0f} s: requests/s at the server"] = {k: statistics.median(v) for k, v in held.items()}
        self.results["zk_suspended"] = out

    # -- 3d. ACL fallbacks -------------------------------------------------------------------------

    def acl(self) -> None:
        from ylock.engines.redis.acl import acl_rules

        exact = acl_rules()
        cases = {"default user (+@all)": None, "exactly acl_rules()": exact,
                 "acl_rules() without +blpop (polling)": [r for r in exact if r != "+blpop"]}
        for i, rules in enumerate(cases.values()):
            if rules is not None:
                self.client.execute_command("ACL", "SETUSER", f"u{i}", "reset", "on", ">pw", *rules)
        urls = {label: (self.redis.url if rules is None else f"redis://u{i}:pw@127.0.0.1:{self.redis.port}/0")
                + "?max_connections=4" for i, (label, rules) in enumerate(cases.items())}
        self.results["acl"] = {"acl_rules() has +client": any(r.startswith("+client") for r in exact),
                               **self._handoffs(urls, {})}

    # -- 3e. TLS ------------------------------------------------------------------------------------

    def tls(self) -> None:
        with tempfile.TemporaryDirectory(prefix="ylock-bench-tls-") as where:
            files = make_tls_files(where)
            server = RedisServer(tls=files).start()
            try:
                self.placement.pin_servers()
                urls = {"plaintext": server.url, "rediss:// + client certificates": server.tls_url}
                options = {"rediss:// + client certificates": files.client_options()}
                out = self._handoffs(urls, options, redis.Redis(port=server.port))
            finally:
                server.stop()
        rows = out["rows"]
        out["p50 TLS / plaintext"] = (rows["rediss:// + client certificates"]["p50_ms"]
                                      / rows["plaintext"]["p50_ms"])
        self.results["tls"] = out

    def _handoffs(self, urls: dict[str, str], options: dict[str, dict[str, str]],
                  admin: redis.Redis | None = None) -> dict[str, Any]:
        """The threaded handoff (:func:`bench.restricted_acl.handoffs`) of each url, in
        rounds forwards then backwards; latencies pooled over the rounds."""
        labels = list(urls)
        pooled: dict[str, dict[str, Any]] = {k: {"latencies": [], "connections": 0, "evalsha": 0, "cpu_s": 0.0,
                                                 "holder_lost": 0} for k in labels}
        rounds = 3 if self.quick else 6
        for r in range(rounds):
            for label in labels if r % 2 == 0 else labels[::-1]:
                got = restricted_acl.handoffs(urls[label], admin or self.client, 3, 4 if self.quick else 10,
                                              options=options.get(label))
                p = pooled[label]
                p["latencies"] += got["latencies_ms"]
                p["connections"] += got["connections"]
                p["evalsha"] += got["evalsha"]
                p["cpu_s"] += got["cpu_s"]
                p["holder_lost"] += got["holder_lost"]
        rows = {label: {"handoffs": len(p["latencies"]), "p50_ms": percentile(p["latencies"], 0.5),
                        "p99_ms": percentile(p["latencies"], 0.99), "connections_per_run": p["connections"] / rounds,
                        "evalsha_per_handoff": p["evalsha"] / max(1, len(p["latencies"])),
                        "client_cpu_ms_per_handoff": p["cpu_s"] * 1000 / max(1, len(p["latencies"])),
                        "bystander_lock_lost": p["holder_lost"]}
                for label, p in pooled.items()}
        return {"rounds": rounds, "rows": rows}


def stolen(v: dict[str, Any]) -> str:
    """A paired ratio's CPU stolen by the hypervisor, as the tables give it."""
    steal = v.get("steal_pct")
    return f"{steal['median']:.0f} % ({steal['max']:.0f} %)" if steal else "-"


def quiet(v: dict[str, Any]) -> str:
    """A paired ratio over its quiet rounds (see :func:`bench.run.paired_ratio`)."""
    q = v.get("quiet")
    if not q:
        return "-"
    return f"{q['median']:.2f} ({q['rounds']})" if q.get("rounds") else "none"


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    load = r["machine"].get("load_after") or r["load_before"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m['redis_server']}; {m['when']}; "
             f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; placement: {r['placement']}; ratios: "
             f"{r['rounds']} rounds of A, B, B, A ({r['seconds_per_side']} s a side), median (min-max)"
             + (" (--quick)" if r["quick"] else "") + ".", ""]

    def ratio_rows(title: str, rows: dict[str, Any]) -> None:
        lines.extend([f"**{title}** (B ÷ A in rates; CPU µs per pair, medians over the rounds; stolen = the "
                      "machine's CPU time the hypervisor took, the most of each round's four samples, median "
                      f"(max) over the rounds; quiet = B ÷ A over the rounds where at most {QUIET_STEAL_PCT:.0f} % "
                      "was stolen, and how many)", "",
                      "| ratio | B ÷ A | B /s | A /s | client CPU B / A | process CPU B / A | server CPU B / A "
                      "| stolen | quiet |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"])
        for key, v in rows.items():
            a, b = v["a"], v["b"]
            server = f"{b['server_us']:.0f} / {a['server_us']:.0f}" if "server_us" in a else "-"
            lines.append(f"| {key} | {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) | {b['rate']:,.0f} | "
                         f"{a['rate']:,.0f} | {b['cpu_us']:.0f} / {a['cpu_us']:.0f} | "
                         f"{b['process_cpu_us']:.0f} / {a['process_cpu_us']:.0f} | {server} | "
                         f"{stolen(v)} | {quiet(v)} |")
        lines.append("")
    if "ratios" in r:
        ratio_rows("Uncontended pairs", r["ratios"])
    if "floor" in r:
        f = r["floor"]
        v = f["ylock / floor"]
        lines += [f"**Contended fair handoff, {f['processes']} processes** (GET+SET counter inside; {f['rounds']} "
                  f"rounds of floor, ylock, ylock, floor): ylock ÷ floor = {v['median']:.2f} "
                  f"({v['min']:.2f}-{v['max']:.2f}; stolen {stolen(v)}; quiet {quiet(v)})", "",
                  "| lock | acq/s | lost updates | Redis cmds/acq | self | gap p50 ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for lib, row in f["rows"].items():
            cmds, self_, gap = row.get("redis_cmds_per_acq"), row.get("self_reacquire"), row.get("gap_p50_ms")
            lines.append(f"| {lib} | {row['acq_per_s']:,.0f} | {row['lost_updates']} | "
                         f"{'-' if cmds is None else f'{cmds:.1f}'} | {'-' if self_ is None else f'{self_:.0%}'} | "
                         f"{'-' if gap is None else f'{gap:.3f}'} |")
        lines.append("")
    for key, title in (("tokens", "Rising tokens"), ("wait_replicas", "wait_replicas")):
        if key in r:
            ratio_rows(title, r[key])
    if "zk_suspended" in r:
        z = dict(r["zk_suspended"])
        ratio_rows("ZooKeeper suspended=guard", {k: v for k, v in z.items() if k.startswith("pair")})
        for k, v in z.items():
            if k.startswith("hold"):
                lines += [f"ZooKeeper {k}: " + ", ".join(f"{label} {x:.2f}" for label, x in v.items()), ""]
    for key, title in (("acl", "Threaded handoff under ACL users"), ("tls", "Threaded handoff, TLS")):
        if key in r:
            lines += [f"**{title}** (3 threads on one fair lock, 10 ms holds, 2 bystanders waiting; {r[key]['rounds']} "
                      "rounds forwards then backwards)", "",
                      "| case | handoffs | p50 ms | p99 ms | connections/run | EVALSHA/handoff | "
                      "client CPU ms/handoff |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for label, row in r[key]["rows"].items():
                lines.append(f"| {label} | {row['handoffs']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                             f"{row['connections_per_run']:.1f} | {row['evalsha_per_handoff']:.1f} | "
                             f"{row['client_cpu_ms_per_handoff']:.2f} |")
            lost = {label: row["bystander_lock_lost"] for label, row in r[key]["rows"].items()
                    if row.get("bystander_lock_lost")}
            if lost:
                lines.append(f"\nThe bystanders' held lock was reported lost at its release (runs): {lost}")
            if key == "tls":
                lines.append(f"\np50 TLS ÷ plaintext = {r['tls']['p50 TLS / plaintext']:.2f} (target ≤ 2)")
            if key == "acl" and not r["acl"]["acl_rules() has +client"]:
                lines.append("\n`acl_rules()` grants no `CLIENT` subcommand: 'minus +client' is the exact user.")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.guarantees", __doc__, "guarantees", SECTIONS)
    parser.add_argument("--hold", type=float, default=None, help="seconds of the ZooKeeper hold (3 quick, 8)")
    args = parser.parse_args(argv)
    bench = Guarantees(args.quick, runs_of(args), args.seconds, args.duration, args.hold)
    return run_bench(bench, args.only, args, "guarantees", markdown)


if __name__ == "__main__":
    main()
