"""``python -m bench.cpu_pairs [--rounds N] [--seconds S] [--tree NAME=PATH[+hiredis] ...]``:
client CPU per uncontended acquire+release pair on Redis, for one or more source trees of
ylock in one run (issue 29: "the facade and engine add at most ~10 µs of client CPU per
pair over ylock's own bare script calls").

Each tree is measured in a worker process of its own (``PYTHONPATH`` = the tree, so two
checkouts compare in one run; ``+hiredis`` adds ``--hiredis DIR``, a ``pip install
--target`` of hiredis, so redis-py parses with it), pinned with ``taskset`` to
``--client-cpu`` (1); the redis-server it starts runs on ``--server-cpu`` (0). Rounds run
the trees forwards then backwards (A, B, B, A): the figures are medians over rounds of
client CPU µs per pair (``time.process_time``; on a shared, loaded machine the figure to
trust) and pairs/s. Cases, all on one free lock:

- ``sync lock/unlock``: ``Lock.lock(); Lock.unlock()``;
- ``sync engine``: ``engine.acquire(request); engine.release(...)`` (no facade);
- ``sync bare scripts``: the acquire and release scripts through the engine's direct calls;
- ``redis-py Lock``: redis-py's ``Lock.acquire(); release()``;
- ``async alock/aunlock``, ``async bare scripts``, ``redis.asyncio Lock``: the same in asyncio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CASES = ["sync lock/unlock", "sync engine", "sync bare scripts", "redis-py Lock",
         "async alock/aunlock", "async bare scripts", "redis.asyncio Lock"]


SLICES = 8


def _interleaved(ops: dict[str, Any], seconds: float) -> dict[str, tuple[float, float]]:
    """(client CPU µs per call, calls/s) of each of ``ops``, timed in ``SLICES`` slices each,
    the cases in order, then in reverse order, and so on (so that the machine's load drifts
    over all of them alike): about ``seconds`` per case in all."""
    totals = {name: [0.0, 0.0, 0] for name in ops}     # cpu, wall, calls
    names = list(ops)
    for op in ops.values():
        for _ in range(100):
            op()
    for n in range(SLICES):
        for name in names if n % 2 == 0 else names[::-1]:
            op, calls = ops[name], 0
            wall, cpu = time.perf_counter(), time.process_time()
            end = wall + seconds / SLICES
            while True:
                for _ in range(20):
                    op()
                calls += 20
                if time.perf_counter() >= end:
                    break
            t = totals[name]
            t[0] += time.process_time() - cpu
            t[1] += time.perf_counter() - wall
            t[2] += calls
    return {name: (cpu / calls * 1e6, calls / wall) for name, (cpu, wall, calls) in totals.items()}


async def _ainterleaved(ops: dict[str, Any], seconds: float) -> dict[str, tuple[float, float]]:
    """:func:`_interleaved` of coroutine functions."""
    totals = {name: [0.0, 0.0, 0] for name in ops}
    names = list(ops)
    for op in ops.values():
        for _ in range(100):
            await op()
    for n in range(SLICES):
        for name in names if n % 2 == 0 else names[::-1]:
            op, calls = ops[name], 0
            wall, cpu = time.perf_counter(), time.process_time()
            end = wall + seconds / SLICES
            while True:
                for _ in range(20):
                    await op()
                calls += 20
                if time.perf_counter() >= end:
                    break
            t = totals[name]
            t[0] += time.process_time() - cpu
            t[1] += time.perf_counter() - wall
            t[2] += calls
    return {name: (cpu / calls * 1e6, calls / wall) for name, (cpu, wall, calls) in totals.items()}


def worker(url: str, seconds: float) -> dict[str, Any]:
    """Measure every case once in this process (the tree on ``sys.path``)."""
    import asyncio

    import redis
    import redis.asyncio as aredis

    import ylock

    out: dict[str, Any] = {"hiredis": bool(redis.utils.HIREDIS_AVAILABLE)}
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, "bench", "cpu")
    try:
        from ylock.engines.base import WRITE, AcquireRequest
        from ylock.engines.redis.scripts import release_args
        from ylock.owner import current_owner
        from ylock.waiting import DEFAULT_POLLING
    except ImportError:
        # A tree from before the engine packages (e.g. e80191c, before issue 23): its public
        # verbs only, beside the peers (the before/after comparison of the lock path).
        return _public_only(out, url, lock, seconds)
    owner = current_owner()
    key, args = engine._request(AcquireRequest("bench", "cpu", owner, WRITE, True, 30.0, None, DEFAULT_POLLING))
    rargs = release_args(owner, WRITE)
    client = redis.Redis.from_url(url)
    rlock = client.lock("bench:redispy", timeout=30)

    def pair() -> None:
        lock.lock()
        lock.unlock()

    def engine_pair() -> None:
        engine.acquire(AcquireRequest("bench", "cpu", owner, WRITE, True, 30.0, None, DEFAULT_POLLING))
        engine.release("bench", "cpu", owner, WRITE)

    def bare() -> None:
        engine._run("acquire", key, args, time.monotonic() + 2.0)
        engine._run("release", key, rargs, time.monotonic() + 2.0)

    def redis_pair() -> None:
        rlock.acquire()
        rlock.release()
    out.update(_interleaved({"sync lock/unlock": pair, "sync engine": engine_pair, "sync bare scripts": bare,
                             "redis-py Lock": redis_pair}, seconds))

    async def amain() -> None:
        from ylock.engines.redis.aio import open_side
        side = await open_side(engine)
        aowner = current_owner()
        akey, aargs = engine._request(AcquireRequest("bench", "cpu", aowner, WRITE, True, 30.0, None,
                                                     DEFAULT_POLLING))
        arargs = release_args(aowner, WRITE)
        aclient = aredis.Redis.from_url(url)
        alock = aclient.lock("bench:redisaio", timeout=30)

        async def apair() -> None:
            await lock.alock()
            await lock.aunlock()

        async def abare() -> None:
            await engine._arun(side, "acquire", akey, aargs, time.monotonic() + 2.0)
            await engine._arun(side, "release", akey, arargs, time.monotonic() + 2.0)

        async def aredis_pair() -> None:
            await alock.acquire()
            await alock.release()
        out.update(await _ainterleaved({"async alock/aunlock": apair, "async bare scripts": abare,
                                        "redis.asyncio Lock": aredis_pair}, seconds))
        await aclient.aclose()
    asyncio.run(amain())
    engine.close()
    client.close()
    return out


def _public_only(out: dict[str, Any], url: str, lock: Any, seconds: float) -> dict[str, Any]:
    """:func:`worker` for a tree whose internals differ: the public verbs and the peers."""
    import asyncio

    import redis
    import redis.asyncio as aredis

    rlock = redis.Redis.from_url(url).lock("bench:redispy", timeout=30)

    def pair() -> None:
        lock.lock()
        lock.unlock()

    def redis_pair() -> None:
        rlock.acquire()
        rlock.release()
    out.update(_interleaved({"sync lock/unlock": pair, "redis-py Lock": redis_pair}, seconds))

    async def amain() -> None:
        alock = aredis.Redis.from_url(url).lock("bench:redisaio", timeout=30)

        async def apair() -> None:
            await lock.alock()
            await lock.aunlock()

        async def aredis_pair() -> None:
            await alock.acquire()
            await alock.release()
        out.update(await _ainterleaved({"async alock/aunlock": apair, "redis.asyncio Lock": aredis_pair}, seconds))
    asyncio.run(amain())
    lock.engine.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_pairs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="NAME=PATH of a ylock source tree, optionally +hiredis (default: this tree)")
    parser.add_argument("--hiredis", default="", help="a directory with hiredis installed (pip install --target)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=0.4, help="per case and worker (in slices)")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.seconds)))
        return {}
    from ylock.testing.redis import RedisServer

    trees = [t.split("=", 1) for t in args.tree] or [["this", os.getcwd()]]
    server = RedisServer().start()
    assert server.proc is not None
    subprocess.run(["taskset", "-a", "-p", "-c", args.server_cpu, str(server.proc.pid)], check=True,
                   stdout=subprocess.DEVNULL)
    results: dict[str, dict[str, list[tuple[float, float]]]] = {name: {c: [] for c in CASES} for name, _ in trees}
    hiredis_seen: dict[str, bool] = {}
    try:
        for n in range(args.rounds):
            order = trees if n % 2 == 0 else trees[::-1]
            for name, spec in order:
                path, _, extra = spec.partition("+")
                env = dict(os.environ, PYTHONPATH=path + (os.pathsep + args.hiredis if extra == "hiredis" else ""))
                proc = subprocess.run(["taskset", "-c", args.client_cpu, sys.executable, os.path.abspath(__file__),
                                       "--worker", server.url, "--seconds", str(args.seconds)],
                                      env=env, cwd=path, capture_output=True, text=True, check=True)
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                hiredis_seen[name] = got.pop("hiredis")
                for case, value in got.items():
                    results[name][case].append(tuple(value))
            print(f"round {n + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        server.stop()
    derived = {
        "sync: lock/unlock - bare scripts (µs)": lambda r: r["sync lock/unlock"][0] - r["sync bare scripts"][0],
        "sync: engine - bare scripts (µs)": lambda r: r["sync engine"][0] - r["sync bare scripts"][0],
        "async: alock/aunlock - bare scripts (µs)": lambda r: r["async alock/aunlock"][0] - r["async bare scripts"][0],
        "CPU ratio redis-py Lock / lock/unlock": lambda r: r["redis-py Lock"][0] / r["sync lock/unlock"][0],
        "CPU ratio redis.asyncio Lock / alock pair": lambda r: r["redis.asyncio Lock"][0] / r["async alock/aunlock"][0],
        "rate ratio lock/unlock / redis-py Lock": lambda r: r["sync lock/unlock"][1] / r["redis-py Lock"][1],
        "rate ratio alock pair / redis.asyncio": lambda r: r["async alock/aunlock"][1] / r["redis.asyncio Lock"][1],
    }
    summary: dict[str, Any] = {}
    print(f"client CPU µs per pair (median, min-max of {args.rounds} rounds; client on CPU {args.client_cpu}, "
          f"redis-server on CPU {args.server_cpu}); pairs/s median")
    header = "| case | " + " | ".join(f"{name}{' (hiredis)' if hiredis_seen[name] else ''}" for name, _ in trees) + " |"
    print(header)
    print("|---" * (len(trees) + 1) + "|")
    for case in CASES:
        cells = []
        for name, _ in trees:
            cpu = [v[0] for v in results[name][case]]
            rate = [v[1] for v in results[name][case]]
            if not cpu:              # a tree measured by its public verbs only
                cells.append("n/a")
                continue
            summary.setdefault(name, {})[case] = {"cpu_us": statistics.median(cpu), "cpu_min": min(cpu),
                                                  "cpu_max": max(cpu), "rate": statistics.median(rate)}
            cells.append(f"{statistics.median(cpu):.1f} µs ({min(cpu):.1f}-{max(cpu):.1f}), "
                         f"{statistics.median(rate):,.0f}/s")
        print(f"| {case} | " + " | ".join(cells) + " |")
    print()
    print("paired within each worker (median, min-max over rounds)")
    print(header.replace("| case |", "| figure |"))
    print("|---" * (len(trees) + 1) + "|")
    for figure, f in derived.items():
        cells = []
        for name, _ in trees:
            rounds = [{c: results[name][c][i] for c in CASES if results[name][c]} for i in range(args.rounds)]
            try:
                values = [f(r) for r in rounds]
            except KeyError:         # a case that tree was not measured in
                cells.append("n/a")
                continue
            summary.setdefault(name, {})[figure] = statistics.median(values)
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})")
        print(f"| {figure} | " + " | ".join(cells) + " |")
    return summary


if __name__ == "__main__":
    main()
