"""Thousands of seeded schedules of the Redis protocol (and of the local engine, its
reference semantics), each checked by :func:`~tests.simulation.checker.check`.

``python -m pytest tests/simulation`` runs YLOCK_SIM_SCHEDULES schedules (default 2000 of
the Redis protocol and 400 of the local engine), spread over chunks so that pytest-xdist
shares them between its workers. Every failure prints its seed, its configuration, the
violations and the end of its trace; ``YLOCK_SIM_SEED=<seed> python -m pytest
tests/simulation`` replays exactly that schedule (both engines); ``YLOCK_SIM_SOAK=<seconds>``
runs fresh seeds for that long per chunk (``YLOCK_SIM_START`` picks the first seed).
"""
from __future__ import annotations

import os
import time

import pytest

from tests.simulation.checker import check
from tests.simulation.client import RedisProtocol
from tests.simulation.lua import ScriptHost
from tests.simulation.world import simulate

CHUNKS = 8
SCHEDULES = int(os.environ.get("YLOCK_SIM_SCHEDULES", "2000"))
LOCAL_SCHEDULES = SCHEDULES // 5
START = int(os.environ.get("YLOCK_SIM_START", "0"))
SOAK = float(os.environ.get("YLOCK_SIM_SOAK", "0"))
REPLAY = os.environ.get("YLOCK_SIM_SEED")

_host: ScriptHost | None = None


def host() -> ScriptHost:
    """One Lua runtime per worker process, its scripts compiled once."""
    global _host
    if _host is None:
        _host = ScriptHost(RedisProtocol(0.5).sources())
    return _host


def run_seed(seed: int, engine: str) -> str | None:
    """Run one schedule; None if it holds every invariant, else the report to print."""
    config, history = simulate(seed, engine, host() if engine == "redis" else None)
    problems = check(config, history)
    if not problems:
        return None
    trace: list[str] = []
    simulate(seed, engine, host() if engine == "redis" else None, trace=trace)
    return (f"seed {seed} ({engine}) failed; replay: YLOCK_SIM_SEED={seed} python -m pytest tests/simulation\n"
            f"{config}\n" + "\n".join(problems[:10]) + "\n-- the last 60 lines of its trace:\n"
            + "\n".join(trace[-60:]))


def seeds(chunk: int, total: int) -> range:
    return range(START + chunk, START + total, CHUNKS)


def run_chunk(chunk: int, total: int, engine: str) -> None:
    if REPLAY is not None:
        if chunk:
            pytest.skip("replaying one seed (YLOCK_SIM_SEED): chunk 0 runs it")
        failure = run_seed(int(REPLAY), engine)
        assert failure is None, failure
        return
    ran = 0
    if SOAK:
        deadline, seed = time.monotonic() + SOAK, START + chunk
        while time.monotonic() < deadline:
            failure = run_seed(seed, engine)
            assert failure is None, failure
            seed += CHUNKS
            ran += 1
    else:
        for seed in seeds(chunk, total):
            failure = run_seed(seed, engine)
            assert failure is None, failure
            ran += 1
    assert ran > 0


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_redis_protocol(chunk: int) -> None:
    """The Redis engine's scripts and steps hold every invariant over these seeds."""
    run_chunk(chunk, SCHEDULES, "redis")


@pytest.mark.parametrize("chunk", range(2))
def test_local_engine(chunk: int) -> None:
    """The local engine (the reference semantics) holds the same invariants."""
    run_chunk(chunk, LOCAL_SCHEDULES, "local")


#: A seed for each bug the simulation found (fixed), replayed on every run: each fails with
#: its fix taken back (checked by the mutation run of issue 43's closing note).
REGRESSIONS = {
    1384: "a waiter whose queue entry was gone (granted, the grant run out before it polled) queued "
          "again and popped the stale grant pushed for it as a new one: a reader beside a writer "
          "(acquire.lua: a request that queues drops its notify list)",
    358: "a new request that found a permit granted to its abandoned request took it with the "
         "old token, below tokens issued since (sem_acquire.lua)",
    356: "the reader fast path gave a new request the token of a read grant left by a request "
         "whose answer never came, below a token issued since (acquire.lua)",
    87: "a new write request that found the write grant of its abandoned request took it with "
        "the old token, the token of an earlier hold of its own (acquire.lua)",
    1926: "a write hold detached after a downgrade whose answer never came left its owner a read "
          "beside the ticket's write; its new read request took it (adopt.lua drops it)",
    20: "a new hold whose first renewal did not come through was taken for held for a whole "
        "lease, its first lease (the waiter's) long run out (ylock.holds)",
    2024: "a new request of an owner kept the queue place of its request given up on (its answer "
          "never came), ahead of a fair writer queued since (acquire.lua: a new request dequeues it)",
    5685: "a ticket's write ran out 70 us before a whole lease after its renewal's send (Redis's deadlines "
          "are whole milliseconds of a clock rounded down) and another writer was granted it: leases are "
          "counted less that millisecond (ylock.holds.TICK, and the checker's model of the server)",
    5951: "a watchdog woken both by its timer during its process's pause and by a renewal scheduled "
          "after it read None as its renewals' answer (the simulator's own bug: tests/simulation/world.py)",
}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_seed(seed: int) -> None:
    failure = run_seed(seed, "redis")
    assert failure is None, f"{REGRESSIONS[seed]}\n{failure}"
