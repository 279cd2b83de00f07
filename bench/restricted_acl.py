"""Handoffs under restricted Redis ACL users: what each costs the server and the client.

Three threads take turns on a fair lock while two bystanders wait on another lock (so that
the process's shared notify hub is blocked when the workers join it), through a pool of 4
connections. Prints, per ACL: the connections the server accepted, the EVALSHA it ran,
the client's CPU time and the handoff latency (release to the next acquisition).

    python -m bench.restricted_acl [no-client|no-unblock|full ...]
"""
from __future__ import annotations

import resource
import sys
import threading
import time
import uuid
from typing import Any

import redis

import ylock
from ylock.testing.redis import RedisServer

ACLS = {"no-client": ["~*", "&*", "+@all", "-client"],
        "no-unblock": ["~*", "&*", "+@all", "-client|unblock"],
        "full": ["~*", "&*", "+@all"]}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def handoffs(url: str, admin: redis.Redis, workers: int = 3, rounds: int = 4, hold: float = 0.01,
             options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Let ``workers`` threads take a fair lock in turn ``rounds`` times each (holding it
    ``hold`` s) through an engine on ``url`` (``options``: the engine's keyword options),
    while two bystanders wait on another lock; return the handoff latencies (release to the
    next acquisition, ms), the connections and EVALSHA the server (``admin``: a client of
    its own) saw meanwhile, and the client's CPU seconds."""
    def counters() -> tuple[int, int]:
        stats, commands = admin.info("stats"), admin.info("commandstats")
        return int(stats["total_connections_received"]), int(commands.get("cmdstat_evalsha", {}).get("calls", 0))

    engine = ylock.engine_from_url(url, **(options or {}))
    name = uuid.uuid4().hex[:8]
    other = ylock.Lock(engine, "bench", "other" + name)
    other.lock()

    def stand_by() -> None:
        lock = ylock.Lock(engine, "bench", "other" + name)
        lock.lock(timeout=60)
        lock.unlock()
    bystanders = [threading.Thread(target=stand_by) for _ in range(2)]
    for thread in bystanders:
        thread.start()
    try:
        deadline = time.monotonic() + 2.0        # a hub that cannot block never gets there
        while int(admin.info("clients")["blocked_clients"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        connections, evalsha, cpu = *counters(), _cpu()
        latencies: list[float] = []
        released: list[float] = []

        def work() -> None:
            lock = ylock.Lock(engine, "bench", "n" + name, fair=True)
            for _ in range(rounds):
                lock.lock(timeout=30)
                if released:
                    latencies.append((time.monotonic() - released.pop()) * 1000)
                time.sleep(hold)
                released.append(time.monotonic())
                lock.unlock()
        threads = [threading.Thread(target=work) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = counters()
        cpu = _cpu() - cpu
    finally:
        # A lost lease of the bystanders' lock is a finding to report, not a reason to
        # throw the run's figures away (seen once over TLS on a loaded machine).
        try:
            other.unlock()
            holder_lost = False
        except ylock.LockLost:
            holder_lost = True
        for thread in bystanders:
            thread.join()
        engine.close()
    return {"latencies_ms": sorted(latencies), "connections": after[0] - connections,
            "evalsha": after[1] - evalsha, "cpu_s": cpu, "holder_lost": holder_lost}


def run(case: str, workers: int = 3, rounds: int = 4) -> str:
    """Measure one ACL ``case`` on a server of its own; return the line to print."""
    server = RedisServer().start()
    try:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "u", "reset", "on", ">pw", *ACLS[case])
        got = handoffs(f"redis://u:pw@127.0.0.1:{server.port}/0?max_connections=4", admin, workers, rounds)
        latencies = got["latencies_ms"]
        return (f"{case}: {len(latencies)} handoffs, connections +{got['connections']}, "
                f"EVALSHA +{got['evalsha']}, client CPU {got['cpu_s']:.2f} s, latency median "
                f"{latencies[len(latencies) // 2]:.1f} ms, max {latencies[-1]:.1f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    for name in sys.argv[1:] or list(ACLS):
        print(run(name))
