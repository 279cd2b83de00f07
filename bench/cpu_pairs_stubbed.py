"""``python -m bench.cpu_pairs_stubbed [--rounds N] [--tree NAME=PATH ...]``: client CPU
of ylock's own layers (facade + engine) per uncontended acquire+release pair on Redis, with
the wire stubbed out: the engine's direct calls answer at once (a token for the acquire,
1 for the release), so what is left is what the facade and the engine add (issue 29: "at
most ~10 µs of client CPU per pair over ylock's own bare script calls").

Each tree runs in a worker process of its own (``PYTHONPATH`` = the tree), pinned with
``taskset`` to ``--client-cpu``; rounds run the trees forwards then backwards (A, B, B, A);
each worker reports the best of 5 timings of 20,000 pairs (``time.process_time``), sync and
asyncio; the table gives the median and min-max over rounds. A redis-server is started only
to build the engine (the scripts' SHAs); no command reaches it while timing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

PAIRS = 20_000


def worker() -> dict[str, float]:
    """Time the stubbed pairs in this process (its ylock is the tree's)."""
    import ylock
    from ylock.engines.redis.aio import open_side
    from ylock.testing.redis import RedisServer

    out: dict[str, float] = {}
    with RedisServer() as server:
        engine = ylock.engine_from_url(server.url)
        lock = ylock.Lock(engine, "bench", "stubbed", fair=True)
        lock.lock()
        lock.unlock()                  # connects, registers the scripts
        real = engine._call

        def answer(*args: Any, timeout: float | None = None) -> int:
            return 1
        engine._call = answer
        try:
            best = float("inf")
            for _ in range(5):
                started = time.process_time()
                for _ in range(PAIRS):
                    lock.lock()
                    lock.unlock()
                best = min(best, time.process_time() - started)
            out["sync lock/unlock"] = best / PAIRS * 1e6

            async def amain() -> float:
                side = await open_side(engine)

                async def aanswer(*args: Any, timeout: float | None = None) -> int:
                    return 1
                side.calls = aanswer
                abest = float("inf")
                for _ in range(5):
                    started = time.process_time()
                    for _ in range(PAIRS):
                        await lock.alock()
                        await lock.aunlock()
                    abest = min(abest, time.process_time() - started)
                return abest / PAIRS * 1e6
            out["async alock/aunlock"] = asyncio.run(amain())
        finally:
            engine._call = real
            engine.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_pairs_stubbed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a ylock source tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker()))
        return {}
    trees = [t.split("=", 1) for t in args.tree] or [["this", os.getcwd()]]
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in trees}
    for n in range(args.rounds):
        for name, path in trees if n % 2 == 0 else trees[::-1]:
            proc = subprocess.run(["taskset", "-c", args.client_cpu, sys.executable, os.path.abspath(__file__),
                                   "--worker"], env=dict(os.environ, PYTHONPATH=path), cwd=path,
                                  capture_output=True, text=True, check=True)
            for case, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                results[name].setdefault(case, []).append(value)
        print(f"round {n + 1}/{args.rounds} done", file=sys.stderr)
    print(f"client CPU µs per pair, wire stubbed (median, min-max of {args.rounds} rounds; client on CPU "
          f"{args.client_cpu})")
    print("| case | " + " | ".join(name for name, _ in trees) + " |")
    print("|---" * (len(trees) + 1) + "|")
    for case in next(iter(results.values())):
        cells = [f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for v in
                 (results[name][case] for name, _ in trees)]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return results


if __name__ == "__main__":
    main()
