"""Production scale on one redis-server (issue 41), at sizes the suite can afford (``python
-m bench.scale`` runs them at full size): many holds in one process, listing in a database
shared with many other keys, and many waiters on one fair lock. Each asserts what can be
counted (memory, keys, commands the server ran, the order of grants), never a wall-clock
figure a busy machine would break."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

import pytest
import redis

import ylock
from tests.faults import workers as fault_workers
from tests.helpers import wait_until
from tests.redis import workers
from ylock import cli
from ylock.testing.redis import RedisServer

pytestmark = pytest.mark.slow

spawn = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module")
def server():
    served = RedisServer().start()
    try:
        yield served
    finally:
        served.stop()


def _commands(client: redis.Redis) -> dict[str, int]:
    """The calls of each command the server ran since the last reset (scripts' own included)."""
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}


# -- many holds in one process ----------------------------------------------------------------------

def test_many_holds_cost_one_key_and_under_300_bytes_each_and_leave_their_fences(server):
    client = redis.Redis(port=server.port)
    client.flushall()
    engine = ylock.engine_from_url(server.url)
    # The first lease of a grant is the waiter lease (3 x the longest poll: 6 s here) until the
    # first renewal: a renewal thread starved by this loop on a loaded machine still makes it.
    locks = ylock.Locks(engine, "users", lease=3.0, polling=ylock.Polling(maximum=2.0))
    count = 3000
    names = [f"user-{i:05d}" for i in range(count)]
    with locks.write("warm-up"):
        pass
    client.flushall()
    used = lambda: int(client.info("memory")["used_memory"])  # noqa: E731
    base, keys = used(), client.dbsize()
    for name in names:
        locks.lock(name)
    per_hold = (used() - base) / count
    # one key per hold (its x: the writer and the fence), the group's index and the set of groups
    assert client.dbsize() - keys == count + 2
    assert client.scard("ylock:i:users") == count
    assert per_hold <= 300, f"{per_hold:.0f} bytes per write hold"
    renewed = ylock.WATCHDOG.stats()["renewals"]
    time.sleep(2 * 3.0)                              # two lease periods: each hold renewed 6 times
    assert ylock.WATCHDOG.stats()["renewals"] - renewed >= 4 * count
    assert not [n for n in names if locks[n].lost]
    for name in names:
        locks.unlock(name)
    left = [k.decode() for k in client.scan_iter(match="ylock:*")]
    assert len(left) == count                        # the fences alone (no index, no set of groups)
    assert all(k.endswith(":x") and client.get(k).endswith(b"|0|0|") for k in left)
    assert all(0 < client.pttl(k) <= 300_000 for k in left[:50])       # the retention
    engine.close()
    print(f"{per_hold:.0f} bytes per hold")


# -- listing in a big shared database --------------------------------------------------------------

@pytest.fixture(scope="module")
def crowded(server):
    """20,000 unrelated keys, 2,000 holds of group users, one of group orders."""
    client = redis.Redis(port=server.port)
    client.flushall()
    client.eval("for i = 1, 20000 do redis.call('SET', 'cache:item:' .. i, 'v') end", 0)
    engine = ylock.engine_from_url(server.url)
    renewed = ylock.WATCHDOG.stats()["renewals"]
    users = ylock.Locks(engine, "users", lease=600.0)
    for i in range(2000):
        users.lock(f"user-{i:05d}")
    orders = ylock.Lock(engine, "orders", "global", lease=600.0)
    orders.lock()
    # The tests count the server's commands while they list: every hold's first renewal (a
    # third of the waiter lease after its grant) done before they start, the next ones 200 s
    # later (a CI run counted 1,065 renewals' EVALSHA inside one describe).
    wait_until(lambda: ylock.WATCHDOG.stats()["renewals"] - renewed >= 2001, timeout=120,
               what="the holds' first renewals")
    yield engine, client
    orders.unlock()
    for i in range(2000):
        users.unlock(f"user-{i:05d}")
    engine.close()


def test_listing_a_group_reads_its_index_and_never_scans(crowded):
    engine, client = crowded
    engine.describe_lock("users", "user-00000")      # the describe script loaded on the server
    client.config_resetstat()
    listing = engine.describe("orders")
    calls = _commands(client)
    assert [(i.group, i.name, i.mode) for i in listing] == [("orders", "global", "write")] and listing.total == 1
    assert "scan" not in calls and "keys" not in calls
    assert calls["smembers"] == 1 and calls["evalsha"] == 1       # the group's index, then its one lock
    client.config_resetstat()
    assert engine.describe_lock("orders", "global").owners == listing[0].owners
    assert _commands(client)["evalsha"] == 1                      # one round trip
    client.config_resetstat()
    first = engine.describe("users", limit=50)
    assert [i.name for i in first] == [f"user-{i:05d}" for i in range(50)] and first.total == 2000
    assert _commands(client)["evalsha"] <= 58, "a page described far more locks than it shows"
    everything = engine.describe(limit=10)
    assert [(i.group, i.name) for i in everything][:1] == [("orders", "global")] and everything.total == 2001
    for bad in (0, -1, "5", 2.5, True):
        with pytest.raises(ValueError, match="limit"):
            engine.describe("users", limit=bad)


def test_ylock_list_limit_prints_the_first_locks_and_how_many_there_are(crowded, server, capsys):
    assert cli.main(["--url", server.url, "list", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("write") == 5 and "orders" in out and "the first 5 of about 2001 shown" in out
    assert cli.main(["--url", server.url, "list", "--limit", "0"]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err


def test_locks_whose_holder_died_leave_the_index_when_read(server, group):
    client = redis.Redis(port=server.port)
    parent, child = spawn.Pipe()
    holder = spawn.Process(target=fault_workers.hold, args=(server.url, group, child, 1.0))
    holder.start()
    assert parent.recv()[0] == "acquired"
    engine = ylock.engine_from_url(server.url)
    assert [i.name for i in engine.describe(group)] == ["n"]
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    wait_until(lambda: not engine.describe(group), timeout=30, what="the dead holder's lease running out")
    assert not client.exists(f"ylock:i:{group}") and not client.sismember("ylock:i", group)
    engine.close()


# -- many waiters on one fair lock -------------------------------------------------------------------

def test_many_asyncio_tasks_are_served_in_queue_order_through_one_hub(server, group):
    count = 200
    client = redis.Redis(port=server.port)

    async def main() -> tuple[list[str], list[tuple[str, int, float]], list[str], str]:
        # The 200 first tries open the loop's connections at once: on a CI machine at load 11
        # one connect outlasted the default connect_timeout (1 s), failing fast as designed.
        engine = ylock.engine_from_url(server.url + "?connect_timeout=10")
        holder = ylock.Lock(engine, group, "hot")
        await holder.alock()
        seen: list[tuple[str, int, float]] = []
        errors: list[str] = []

        async def one() -> None:
            lock = ylock.Lock(engine, group, "hot")
            try:
                await lock.alock(timeout=120)
            except ylock.LockError as exc:
                errors.append(repr(exc))
                return
            seen.append((ylock.current_owner(), int(lock.token or 0), time.monotonic()))
            await lock.aunlock()
        tasks = [asyncio.create_task(one()) for _ in range(count)]
        while True:
            info = await asyncio.to_thread(engine.describe_lock, group, "hot")
            if info is not None and len(info.waiters) + len(errors) >= count:
                break
            await asyncio.sleep(0.05)
        order = [w.split(":", 1)[1] for w in info.waiters]
        request = client.hget(f"ylock:{{{group}:hot}}:w", order[0]).decode()
        await holder.aunlock()
        await asyncio.gather(*tasks)
        engine.close()
        return order, seen, errors, request
    order, seen, errors, request = asyncio.run(main())
    assert not errors and len(seen) == count
    granted = sorted(seen, key=lambda s: s[2])
    assert [s[0] for s in granted] == order, "not served in queue order"
    tokens = [s[1] for s in granted]
    assert all(b > a for a, b in zip(tokens, tokens[1:]))
    hub, _, tag = request.split("|")[6].partition(".")     # "<hub id>.<the request's tag>"
    # its grant went to the loop's hub
    assert len(hub) == 32 and tag.isalnum(), f"the waiter's request names no hub: {request}"


def test_threads_of_five_processes_are_served_in_queue_order(server, group):
    client = redis.Redis(port=server.port)
    engine = ylock.engine_from_url(server.url)
    holder = ylock.Lock(engine, group, "hot")
    holder.lock()
    ends, procs = [], []
    for _ in range(5):
        parent, child = spawn.Pipe()
        procs.append(spawn.Process(target=workers.queue_threads, args=(server.url, group, "hot", 20, child)))
        ends.append(parent)
    for proc in procs:
        proc.start()
    for end in ends:
        assert end.recv()[0] == "started"
    def queued() -> int:
        info = engine.describe_lock(group, "hot")
        return 0 if info is None else len(info.waiters)
    wait_until(lambda: queued() == 100, timeout=60, what="a hundred threads queued")
    order = [w.split(":", 1)[1] for w in engine.describe_lock(group, "hot").waiters]
    holder.unlock()
    results = [end.recv() for end in ends]
    for proc in procs:
        proc.join(30)
    seen = [s for _, ss, _ in results for s in ss]
    assert not [e for _, _, es in results for e in es] and len(seen) == 100
    granted = sorted(seen, key=lambda s: s[2])
    assert [s[0] for s in granted] == order, "not served in queue order"
    assert all(b[1] > a[1] for a, b in zip(granted, granted[1:]))
    assert int(client.get(f"{group}:counter")) == 100                   # no lost update
    engine.close()
