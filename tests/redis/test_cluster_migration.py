"""A Redis Cluster slot migrated the standard way (``CLUSTER SETSLOT IMPORTING/MIGRATING``,
``MIGRATE`` key by key, ``SETSLOT NODE``) under held and waited-for locks: while the lock's
keys are split between two masters, renewals, polls and releases meet ``ASK``, ``TRYAGAIN``
and ``MOVED``. The holder keeps its lock and is never told it lost it (its renewal declares
its one key, so it runs on whichever node has it), the waiter is granted after the release
with a higher token, and under four processes hammering twelve names while three slots
move, the journal of holds shows no overlap and no token given twice, and every call ends
within its timeout plus the socket timeout."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

import ylock
from tests.faults import SLACK, Journal
from tests.faults.workers import Checkers
from tests.helpers import Runner, collect, wait_until, waiters
from tests.redis import workers
from ylock.engines.redis.keys import slot_of
from ylock.testing.redis import RedisCluster

pytestmark = pytest.mark.slow

spawn = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def cluster():
    served = RedisCluster(3).start()
    try:
        yield served
    finally:
        served.stop()


def _x_first(key: bytes) -> tuple[int, bytes]:
    """Migrate the lock's x key first: the holder's renewals then meet ASK for as long as
    the other keys stay behind."""
    return (0 if key.endswith(b":x") else 1, key)


def test_a_held_and_waited_for_lock_keeps_its_holder_through_two_slot_migrations(cluster, group):
    engine = ylock.engine_from_url(cluster.url)
    waiter_engine = ylock.engine_from_url(cluster.url)
    slot = slot_of(f"{group}:moved")
    holder = ylock.Lock(engine, group, "moved", lease=3.0)
    taken, release = threading.Event(), threading.Event()
    held: dict[str, float] = {}

    def hold() -> None:
        holder.lock(timeout=5)
        held["token"] = holder.token
        taken.set()
        release.wait(60)
        held["held"] = holder.held() and not holder.lost
        started = time.monotonic()
        holder.unlock()                    # LockLost if the hold was lost meanwhile
        held["at"], held["took"] = time.monotonic(), time.monotonic() - started

    with collect(ylock.events.LOST) as lost, collect(ylock.events.RENEWED) as renewed:
        holding = Runner(hold)
        holding.start()
        assert taken.wait(10)
        got: dict[str, float] = {}

        def wait() -> None:
            lock = ylock.Lock(waiter_engine, group, "moved", lease=3.0)
            lock.lock(timeout=60)
            got["token"], got["at"] = lock.token, time.monotonic()
            lock.unlock()
        waiting = Runner(wait)
        waiting.start()
        wait_until(lambda: waiters(engine, group, "moved"), what="the waiter queued")

        # 1. The slot moves while the lock is held and waited for: x first, then 2 s (two
        #    renewal periods of the 3 s lease) before the other keys follow.
        moved_at = time.monotonic()
        before = len(renewed)
        target = cluster.migrate_slot(slot, order=_x_first,
                                      after_key=lambda key: time.sleep(2.0) if key.endswith(b":x") else None,
                                      pause=0.3)
        assert not [e for e in lost if e.name == "moved"] and "token" not in got, \
            "the holder lost the lock to the migration"
        redirected = engine.cluster_redirections()
        assert redirected.get("renew ask", 0) >= 1, f"no renewal met the split slot: {redirected}"
        assert len([e for e in renewed[before:] if e.name == "moved"]) >= 2
        assert cluster.slot_owner(slot).port == target.port

        # 2. It moves on, and the holder releases while x is on the next master and the
        #    queue still on this one: the release meets TRYAGAIN, then MOVED, and ends
        #    within the socket timeout; the waiter is granted with a higher token.
        def release_while_split(key: bytes) -> None:
            if key.endswith(b":x"):
                release.set()
                time.sleep(0.5)              # the release meets the split keys meanwhile
        cluster.migrate_slot(slot, order=_x_first, after_key=release_while_split, pause=0.1)
        holding.outcome()
        waiting.outcome()
        seconds = time.monotonic() - moved_at
    assert held["held"] and held["took"] <= engine.socket_timeout + SLACK, held
    assert got["token"] > held["token"] and got["at"] >= held["at"] - 0.05
    assert not [e for e in lost if e.name == "moved"], "a migration told a holder it lost its lock"
    tried_again = engine.cluster_redirections().get("tryagain", 0) + \
        waiter_engine.cluster_redirections().get("tryagain", 0)
    assert tried_again >= 1, "nobody met the split keys: the test did not test"
    assert engine.cluster_redirections().get("moved", 0) + engine.cluster_redirections().get("renew moved", 0) >= 1
    print(f"two migrations in {seconds:.1f} s; holder's redirections {engine.cluster_redirections()}, "
          f"waiter's {waiter_engine.cluster_redirections()}")
    engine.close()
    waiter_engine.close()


def test_four_processes_on_twelve_names_while_three_slots_move(cluster, group, tmp_path):
    names = [f"n{i}" for i in range(12)]
    stop = tmp_path / "stop"
    for name in names:
        (tmp_path / name).mkdir()
    timeout = 5.0
    ends = []
    procs = []
    for _ in range(4):
        parent, child = spawn.Pipe()
        procs.append(spawn.Process(target=workers.hammer,
                                   args=(cluster.url, group, names, str(tmp_path), str(stop), timeout, child)))
        ends.append(parent)
    for proc in procs:
        proc.start()
    try:
        engine = ylock.engine_from_url(cluster.url)
        wait_until(lambda: sum(len(i.owners) for i in engine.describe(group)) > 0, timeout=60,
                   what="the processes holding locks")
        time.sleep(1.0)
        for name in names[:3]:                   # three slots, each with a lock in use
            cluster.migrate_slot(slot_of(f"{group}:{name}"), pause=0.15)
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        stop.touch()
    results = [end.recv() for end in ends]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    journals = {n: Journal(Checkers(tmp_path / n)) for n in names}
    calls = [c for _, cs, _ in results for c in cs]
    redirected: dict[str, int] = {}
    for records, _, redirections in results:
        for name, record in records:
            journals[name].add(record)
        for kind, count in redirections.items():
            redirected[kind] = redirected.get(kind, 0) + count
    verdicts = {n: j.check() for n, j in journals.items()}
    holds = sum(v.holds for v in verdicts.values())
    errors = [c for c in calls if c[2] not in ("ok", "released", "LockTimeout")]
    slowest = max(seconds for verb, seconds, _ in calls if verb == "lock")
    slowest_release = max(seconds for verb, seconds, _ in calls if verb == "unlock")
    print(f"{holds} holds, {len(calls)} calls, slowest lock {slowest:.2f} s, release {slowest_release:.2f} s, "
          f"redirections {redirected}")
    assert holds > 100
    assert not errors, errors[:5]
    assert sum(v.lost for v in verdicts.values()) == 0
    assert slowest <= timeout + 2.0 + SLACK and slowest_release <= 2.0 + SLACK
    # the control: the calls met the split slots (ASK, TRYAGAIN) and their end (MOVED)
    assert min(redirected.get(k, 0) for k in ("ask", "tryagain", "moved")) >= 1, redirected
    assert all(not os.path.exists(tmp_path / n / "lost") for n in names)
