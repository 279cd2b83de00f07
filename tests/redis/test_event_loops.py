"""Event loops that come and go (under WSGI, every async view of Flask, and of Django under
gunicorn, runs in an ``asyncio.run`` of its own): the Redis engine's connections of a loop
close with it, so that neither this process's file descriptors nor the server's clients
grow with the number of loops. On a real redis-server."""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis

import ylock
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

LOOPS = 200


def _local_ports_of_socket_fds() -> list[int]:
    """The local TCP port of each socket file descriptor of this process (from /proc)."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                ports[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)      # inode -> local port
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue                                                           # closed meanwhile
        if target.startswith("socket:[") and target[8:-1] in ports:
            found.append(ports[target[8:-1]])
    return found


def open_fds(admin: redis.Redis, name: str) -> int:
    """This process's file descriptors on connections of the engine under test: sockets
    whose local port the server lists among the clients named ``name`` (an fd left open
    stays such a client). Sockets of other tests in this worker, which may close late, have
    other names and do not count."""
    ours = {int(c["addr"].rsplit(":", 1)[1]) for c in admin.client_list() if c.get("name") == name}
    return sum(port in ours for port in _local_ports_of_socket_fds())


def clients_named(admin: redis.Redis, name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


async def one_request(engine: ylock.Engine, group: str, contended: bool) -> None:
    """What one async view does: take the lock and give it back; ``contended``: behind
    another task that holds it, so that it waits (on the loop's notify hub)."""
    lock = ylock.Lock(engine, group, "n")
    if not contended:
        await lock.alock(timeout=10)
        await lock.aunlock()
        return
    holding, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        await lock.alock(timeout=10)
        holding.set()
        await release.wait()
        await lock.aunlock()

    async def waiter() -> None:
        await lock.alock(timeout=10)
        await lock.aunlock()

    held = asyncio.create_task(holder())
    await holding.wait()
    waited = asyncio.create_task(waiter())
    while not (info := await asyncio.to_thread(engine.describe_lock, group, "n")) or not info.waiters:
        await asyncio.sleep(0.002)
    release.set()
    await asyncio.gather(held, waited)


@pytest.fixture
def named(redis_server, group):
    name = f"loops{uuid.uuid4().hex[:8]}"
    engine = ylock.engine_from_url(f"{redis_server.url}?client_name={name}")
    admin = redis.Redis.from_url(redis_server.url)
    yield engine, admin, name
    engine.close()
    admin.close()


def test_a_loop_per_request_leaves_no_connection_open(named, group):
    engine, admin, name = named
    for contended in (False, True):                 # warm up: the sync client, the first loop's
        asyncio.run(one_request(engine, group, contended))
    fds, clients = open_fds(admin, name), clients_named(admin, name)
    for n in range(LOOPS):
        asyncio.run(one_request(engine, group, contended=n % 2 == 1))
        if n == LOOPS // 2:
            halfway = open_fds(admin, name), clients_named(admin, name)
    after = open_fds(admin, name), clients_named(admin, name)
    assert after[0] - fds <= 3, f"{after[0] - fds} more file descriptors open after {LOOPS} loops"
    assert after[1] <= max(clients, 3), f"{after[1]} server clients of this engine after {LOOPS} loops"
    assert after[0] <= halfway[0] + 2 and after[1] <= halfway[1] + 2, (halfway, after)
    assert engine.describe_lock(group, "n") is None


def test_loops_closed_without_shutdown_leave_no_connection_open(named, group):
    """``loop.run_until_complete(...); loop.close()``, without ``shutdown_asyncgens()``:
    the next loop's first use closes the sockets of the closed ones."""
    engine, admin, name = named
    asyncio.run(one_request(engine, group, contended=True))
    fds = open_fds(admin, name)
    for n in range(LOOPS // 4):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(one_request(engine, group, contended=n % 2 == 1))
        finally:
            loop.close()
    asyncio.run(one_request(engine, group, contended=False))
    more = open_fds(admin, name) - fds
    assert more <= 3, f"{more} more file descriptors open after {LOOPS // 4} loops"
    wait_until(lambda: clients_named(admin, name) <= 3, 5, "the server to drop the closed loops' clients")
    assert engine.describe_lock(group, "n") is None
