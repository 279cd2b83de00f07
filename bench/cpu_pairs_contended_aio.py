"""``python -m bench.cpu_pairs_contended_aio [--tasks 8] [--turns 300]``: the tasks of one
event loop take turns on one fair Redis lock (each acquires, yields once, releases, again);
print acquisitions/s, the client CPU per acquisition (``time.process_time``) and the
commands the server ran per acquisition (``INFO commandstats``: the notify hub's ``BLPOP``
and wake-up ``LPUSH`` among them). Run it per source tree with ``PYTHONPATH`` = the tree and
the client pinned (``taskset -c 1``); a redis-server of its own is started.
"""
from __future__ import annotations

import argparse
import asyncio
import time

import redis

import ylock
from ylock.testing.redis import RedisServer


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_pairs_contended_aio",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args(argv)
    with RedisServer() as server:
        engine = ylock.engine_from_url(server.url)
        admin = redis.Redis.from_url(server.url)

        async def worker(lock: ylock.Lock) -> None:
            for _ in range(args.turns):
                await lock.alock(timeout=30)
                await asyncio.sleep(0)
                await lock.aunlock()

        async def run() -> tuple[float, float]:
            lock = ylock.Lock(engine, "bench", "contended", fair=True)
            await lock.alock()
            await lock.aunlock()
            admin.config_resetstat()
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(worker(lock) for _ in range(args.tasks)))
            return time.perf_counter() - wall, time.process_time() - cpu

        try:
            wall, cpu = asyncio.run(run())
            stats = admin.info("commandstats")
        finally:
            engine.close()
            admin.close()
    n = args.tasks * args.turns
    out = {"acquisitions/s": n / wall, "client CPU µs per acquisition": cpu / n * 1e6}
    for command in ("evalsha", "blpop", "lpush"):
        out[f"{command.upper()} per acquisition"] = stats.get(f"cmdstat_{command}", {}).get("calls", 0) / n
    print(", ".join(f"{name} {value:.2f}" for name, value in out.items()))
    return out


if __name__ == "__main__":
    main()
