"""The Redis engine under ACL users that may not run every command: managed services and
proxies commonly deny ``CLIENT`` (or its admin subcommands). Waiters must still be handed
the lock promptly, without reconnecting or re-trying in a loop; and the documented minimal
ACL (:data:`ylock.engines.redis.ACL_COMMANDS`) must run every path, the CLI included.

Each case runs on a server of its own, so that its connection and command counters
(``INFO stats``, ``INFO commandstats``) count this test's traffic only."""
from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis

import ylock
from tests.helpers import wait_until
from ylock.engines.redis import ACL_COMMANDS, acl_rules
from ylock.engines.redis.hubs import refused
from ylock.engines.redis.scripts import SOURCES
from ylock.testing.redis import RedisSentinel, RedisServer

PASSWORD = "pw-acl"
#: Long enough that a waiter found only by its next poll shows in the latency.
POLL = 1.0
HOLD = 0.02          # each holder holds this long, so that the others are queued and blocked
ROUNDS = 4           # acquisitions per worker
WORKERS = 3

CASES = {
    "no-client": ["~*", "&*", "+@all", "-client"],
    "no-client-unblock": ["~*", "&*", "+@all", "-client|unblock"],
    "no-admin-no-dangerous": ["~*", "&*", "+@all", "-@admin", "-@dangerous"],
    "documented-minimal": acl_rules("ylock"),
}


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def _user(server: RedisServer, case: str) -> str:
    """Create the ACL user of ``case``; return its engine URL (a pool of 4 connections, so
    that all but one waiting thread wait in the shared hub)."""
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", case, "reset", "on", f">{PASSWORD}", *CASES[case])
    return f"redis://{case}:{PASSWORD}@127.0.0.1:{server.port}/0?max_connections=4"


def _counters(server: RedisServer) -> dict[str, int]:
    admin = redis.Redis(port=server.port)
    stats = admin.info("stats")
    commands = admin.info("commandstats")
    return {"connections": int(stats["total_connections_received"]),
            "rejected": sum(int(entry["count"]) for entry in admin.acl_log(count=1000)),   # every refusal
            **{name: int(commands.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "blpop")}}


def _latencies(events: list[tuple[float, str]]) -> list[float]:
    """Seconds from each release to the next acquisition."""
    latencies, released = [], None
    for when, what in sorted(events):
        if what == "released":
            released = when
        elif released is not None:
            latencies.append(when - released)
            released = None
    return latencies


def _check(server: RedisServer, before: dict[str, int], events: list[tuple[float, str]]) -> None:
    after = _counters(server)
    acquisitions = WORKERS * ROUNDS
    spent = {k: after[k] - before[k] for k in after}
    latencies = _latencies(events)
    assert len(latencies) >= acquisitions - 1
    # Reconnections: a handful per engine, never one per wait or per handoff.
    assert spent["connections"] <= 12, spent
    # An acquisition costs a try or two and its release: not a retry loop.
    assert spent["evalsha"] <= 4 * acquisitions, spent
    assert spent["blpop"] <= 6 * acquisitions, spent
    # A queued waiter is handed the lock by the release, not found by its next poll.
    assert max(latencies) < POLL / 2, latencies
    # A hub's wake-up list, if one is left over, expires on its own.
    admin = redis.Redis(port=server.port)
    assert all(0 < admin.pttl(key) <= 10_000 for key in admin.scan_iter("ylock:hub:*"))


def _blocked(server: RedisServer, count: int) -> None:
    """Wait until ``count`` connections are blocked in BLPOP on the server."""
    admin = redis.Redis(port=server.port)
    wait_until(lambda: int(admin.info("clients")["blocked_clients"]) == count, what=f"{count} blocked pops")


@pytest.mark.parametrize("case", list(CASES))
def test_thread_handoffs_under_restricted_acl(acl_server, case, group):
    # Two bystanders wait on other locks first: one on a connection of its own, the other in
    # the shared hub, whose BLPOP the workers then join (a worker whose grant the hub does
    # not watch would only find it at its next poll).
    engine = ylock.engine_from_url(_user(acl_server, case))
    events: list[tuple[float, str]] = []
    start = threading.Barrier(WORKERS)
    errors: list[BaseException] = []

    def work() -> None:
        lock = ylock.Lock(engine, group, "n", fair=True, polling=ylock.Polling.constant(POLL))
        try:
            start.wait(10)
            for _ in range(ROUNDS):
                lock.lock(timeout=30)
                events.append((time.monotonic(), "acquired"))
                time.sleep(HOLD)        # the hold itself: the others queue meanwhile
                events.append((time.monotonic(), "released"))
                lock.unlock()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def stand_by(name: str) -> None:
        lock = ylock.Lock(engine, group, name, polling=ylock.Polling.constant(POLL))
        try:
            lock.lock(timeout=60)
            lock.unlock()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    others = [ylock.Lock(engine, group, f"other-{i}") for i in range(2)]
    before = _counters(acl_server)
    threads = []
    for i, other in enumerate(others):
        other.lock()
        threads.append(threading.Thread(target=stand_by, args=(f"other-{i}",)))
        threads[-1].start()
        _blocked(acl_server, i + 1)
    workers = [threading.Thread(target=work) for _ in range(WORKERS)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    for other in others:
        other.unlock()
    for thread in threads:
        thread.join(60)
    engine.close()
    assert not errors, errors
    _check(acl_server, before, events)


@pytest.mark.parametrize("case", list(CASES))
def test_task_handoffs_under_restricted_acl(acl_server, case, group):
    # A bystander task waits on another lock first: the hub is blocked when the workers join.
    engine = ylock.engine_from_url(_user(acl_server, case))
    events: list[tuple[float, str]] = []

    async def work(lock: ylock.Lock) -> None:
        for _ in range(ROUNDS):
            await lock.alock(timeout=30)
            events.append((time.monotonic(), "acquired"))
            await asyncio.sleep(HOLD)
            events.append((time.monotonic(), "released"))
            await lock.aunlock()

    async def stand_by() -> None:
        lock = ylock.Lock(engine, group, "other", polling=ylock.Polling.constant(POLL))
        await lock.alock(timeout=60)
        await lock.aunlock()

    async def main() -> dict[str, int]:
        before = _counters(acl_server)
        other = ylock.Lock(engine, group, "other")
        await other.alock()
        bystander = asyncio.ensure_future(stand_by())
        await asyncio.to_thread(_blocked, acl_server, 1)
        locks = [ylock.Lock(engine, group, "n", fair=True, polling=ylock.Polling.constant(POLL))
                 for _ in range(WORKERS)]
        await asyncio.wait_for(asyncio.gather(*(work(lock) for lock in locks)), 60)
        await other.aunlock()
        await asyncio.wait_for(bystander, 60)
        return before

    before = asyncio.run(main())
    engine.close()
    _check(acl_server, before, events)


def test_refused_blocking_pop_falls_back_to_polling_logged_once(acl_server, group, caplog):
    # A user that may not BLPOP at all (a proxy without blocking commands): the waiters poll,
    # within one poll interval each, and the refusal is logged once, naming the command.
    admin = redis.Redis(port=acl_server.port)
    admin.execute_command("ACL", "SETUSER", "no-blpop", "reset", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-blpop")
    engine = ylock.engine_from_url(f"redis://no-blpop:{PASSWORD}@127.0.0.1:{acl_server.port}/0")
    poll = 0.2
    holder = ylock.Lock(engine, group, "n")
    done: list[float] = []

    def wait() -> None:
        lock = ylock.Lock(engine, group, "n", polling=ylock.Polling.constant(poll))
        lock.lock(timeout=10)
        done.append(time.monotonic())
        lock.unlock()

    before = _counters(acl_server)
    with caplog.at_level(logging.WARNING, logger="ylock"):
        holder.lock()
        waiters = [threading.Thread(target=wait) for _ in range(3)]
        for thread in waiters:
            thread.start()
        time.sleep(1.0)             # the waiters wait: this is the time they must not spin in
        released = time.monotonic()
        holder.unlock()
        for thread in waiters:
            thread.join(10)
    spent = {k: v - before[k] for k, v in _counters(acl_server).items()}
    engine.close()
    assert len(done) == 3
    assert done[0] - released < 2 * poll
    assert spent["connections"] <= 10, spent
    # Three waiters polling every 0.2 s for about 1.2 s: some 20 tries, not thousands.
    assert spent["evalsha"] <= 60, spent
    refusals = [r for r in caplog.records if "BLPOP" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    assert refusals[0].levelno == logging.WARNING and "+blpop" in refusals[0].getMessage()


def test_documented_acl_runs_every_path(acl_server, group):
    # A user with exactly the documented ACL: locks, shared locks, semaphores, describe,
    # statistics, force_release, ping and the console script, with no command refused.
    url = _user(acl_server, "documented-minimal")
    before = _counters(acl_server)
    engine = ylock.engine_from_url(url)
    engine.ping()
    lock = ylock.Lock(engine, group, "n")
    with lock:
        assert lock.token
        assert [i.name for i in engine.describe(group)] == ["n"]
        assert engine.describe_lock(group, "n").mode == "write"
    with lock.read():
        other = ylock.Lock(engine, group, "n")
        assert other.try_rlock() is True
        other.runlock()
    sem = ylock.Semaphore(engine, group, "s", permits=2)
    with sem:
        assert [i.kind for i in engine.describe(group)] == ["semaphore"]
    ticket_lock = ylock.Lock(engine, group, "t")
    ticket_lock.lock()
    adopted = ylock.Lock.adopt(engine, ticket_lock.detach())
    assert adopted.token
    assert engine.force_release(group, "t") is True
    with pytest.raises(ylock.LockLost):
        adopted.unlock()
    assert engine.renew([ylock.RenewItem(group, "n", "nobody", "write", 1.0)]) == [False]   # the watchdog's pipeline
    engine.publish_stats("p1", b"{}", 10)
    assert engine.read_stats() == {"p1": b"{}"}
    engine.close()
    cli = "import sys; from ylock.cli import main; sys.exit(main(sys.argv[1:]))"
    listed = subprocess.run([sys.executable, "-c", cli, "--url", url, "list", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert _counters(acl_server)["rejected"] == before["rejected"]


def test_acl_rules_name_the_prefix():
    rules = acl_rules("app1")
    assert "~app1:*" in rules and "-@all" in rules and "+evalsha" in rules
    assert not any(r.startswith("+client") for r in rules)
    assert set(ACL_COMMANDS) <= {r[1:] for r in rules if r.startswith("+")}


def test_acl_commands_cover_every_command_the_scripts_call():
    # Redis checks a script's own calls against the user's ACL: a command added to a Lua
    # script must be added to ACL_COMMANDS (and so to the documented line) too.
    calls = [re.search(r"redis\.p?call\(\s*(['\"])(\w+)\1", text) for source in SOURCES.values()
             for text in re.findall(r"redis\.p?call\([^,)]*", source)]
    assert calls and all(calls), "every redis.call names its command literally"
    assert {m.group(2).lower() for m in calls if m} <= set(ACL_COMMANDS)


def _smoke(engine: ylock.Engine, group: str) -> None:
    lock = ylock.Lock(engine, group, "n")
    with lock:
        assert [i.name for i in engine.describe(group)] == ["n"]
    with lock.read():
        pass
    with ylock.Semaphore(engine, group, "s", permits=2):
        pass
    assert engine.renew([ylock.RenewItem(group, "n", "nobody", "write", 1.0)]) == [False]
    engine.publish_stats("p1", b"{}", 10)
    assert "p1" in engine.read_stats()
    assert engine.force_release(group, "n") is False


def test_documented_acl_on_cluster(redis_cluster, group):
    nodes = [redis.Redis(port=node.port) for node in redis_cluster.nodes]
    for node in nodes:
        node.execute_command("ACL", "SETUSER", "ylock-cluster", "reset", "on", f">{PASSWORD}",
                             *acl_rules("ylock", cluster=True))
        node.acl_log_reset()
    try:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in redis_cluster.nodes)
        engine = ylock.engine_from_url(f"redis+cluster://ylock-cluster:{PASSWORD}@{hosts}")
        _smoke(engine, group)
        engine.close()
        assert [node.acl_log() for node in nodes] == [[] for _ in nodes]
    finally:
        for node in nodes:
            node.acl_deluser("ylock-cluster")


def test_documented_acl_through_sentinel_with_wait_replicas(redis_sentinel, group):
    redis_sentinel.wait_replica_known()
    servers = [redis.Redis(port=s.port) for s in (redis_sentinel.master, redis_sentinel.replica)]
    for server in servers:
        server.execute_command("ACL", "SETUSER", "ylock-sentinel", "reset", "on", f">{PASSWORD}",
                               *acl_rules("ylock", wait_replicas=True))
        server.acl_log_reset()
    try:
        hosts = ",".join(f"127.0.0.1:{port}" for port, _, _ in redis_sentinel.sentinels)
        url = f"redis+sentinel://ylock-sentinel:{PASSWORD}@{hosts}/{redis_sentinel.master_name}/0"
        engine = ylock.engine_from_url(url + "?wait_replicas=1&wait_timeout=1")
        _smoke(engine, group)
        engine.close()
        assert [server.acl_log() for server in servers] == [[], []]
    finally:
        for server in servers:
            server.acl_deluser("ylock-sentinel")


def test_acl_line_is_the_rules_after_the_user():
    from ylock.engines.redis import acl_line

    assert acl_line("app1", "u", "pw").split() == ["ACL", "SETUSER", "u", "on", ">pw", *acl_rules("app1")]


@pytest.mark.parametrize(("message", "never"), [
    ("NOPERM this user has no permissions to run the 'blpop' command", True),
    ("ERR unknown command 'BLPOP', with args beginning with: ", True),
    ("CROSSSLOT Keys in request don't hash to the same slot", True),
    ("READONLY You can't write against a read only replica.", False),
    ("OOM command not allowed when used memory > 'maxmemory'.", False),
    ("LOADING Redis is loading the dataset in memory", False),
])
def test_only_a_refusal_for_good_turns_blocking_off(message, never):
    # A failover's READONLY or a full server's OOM passes; an ACL's NOPERM does not.
    from redis._parsers import _RESP2Parser

    assert refused(_RESP2Parser.parse_error(message)) is never


def test_sentinels_that_require_a_password(group):
    # The sentinels' own password (a user of theirs), apart from the master's in the URL.
    sentinel = RedisSentinel().start()
    try:
        port = sentinel.sentinels[0][0]
        redis.Redis(port=port).execute_command("ACL", "SETUSER", "default", "resetpass", ">sentinel-pw")
        url = sentinel.url
        with pytest.raises(ylock.EngineUnavailable):
            ylock.Lock(ylock.engine_from_url(url), group, "n").try_lock()
        for engine in (ylock.engine_from_url(url + "?sentinel_password=sentinel-pw"),
                       ylock.engine_from_url(url, sentinel_username="default", sentinel_password="sentinel-pw")):
            lock = ylock.Lock(engine, group, "n")
            with lock:
                assert lock.token
            assert "sentinel-pw" not in repr(engine) and "sentinel-pw" not in engine.url_for_display()
            engine.close()
        with pytest.raises(ylock.ConfigurationError, match="sentinel_password only go with a redis\\+sentinel"):
            ylock.engine_from_url("redis://127.0.0.1:1/0", sentinel_password="x")
    finally:
        sentinel.stop()
