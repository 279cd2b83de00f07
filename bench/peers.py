"""Adapters: every library as ``make(name) -> (acquire(), release())`` on the same servers."""
from __future__ import annotations

import uuid
from typing import Any

import redis

import ylock
from bench.common import Pair


def ylock_engine(url: str, **options: Any) -> ylock.Engine:
    return ylock.engine_from_url(url, **options)


def ylock_pair(engine: ylock.Engine, name: str, mode: str = "write") -> Pair:
    lock = ylock.Lock(engine, "bench", name)
    if mode == "write":
        return lock.lock, lock.unlock
    return lock.rlock, lock.runlock


def hand_written(client: redis.Redis, name: str) -> Pair:
    """SET NX PX + an EVALSHA compare-and-delete: the two-round-trip floor of a Redis lock."""
    release = client.register_script(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0")
    token = uuid.uuid4().hex
    key = f"hand:{name}"

    def acquire() -> None:
        while not client.set(key, token, nx=True, px=30000):
            pass

    return acquire, lambda: release(keys=[key], args=[token])


def redis_py(client: redis.Redis, name: str) -> Pair:
    lock = client.lock(f"redispy:{name}", timeout=30)
    return lock.acquire, lock.release


def python_redis_lock(client: redis.Redis, name: str, auto_renewal: bool = False) -> Pair:
    import redis_lock

    lock = redis_lock.Lock(client, f"prl:{name}", expire=30, auto_renewal=auto_renewal)
    return lock.acquire, lock.release


def pottery_redlock(client: redis.Redis, name: str) -> Pair:
    from pottery import Redlock

    lock = Redlock(key=f"pottery:{name}", masters={client}, auto_release_time=30)
    return lock.acquire, lock.release


def sherlock_lock(client: redis.Redis, name: str) -> Pair:
    import sherlock

    lock = sherlock.RedisLock(f"sherlock:{name}", client=client, expire=30, timeout=60, retry_interval=0.01)
    return lock.acquire, lock.release


def kazoo_pair(client: Any, name: str, kind: str = "write") -> Pair:
    recipe = {"lock": client.Lock, "write": client.WriteLock, "read": client.ReadLock}[kind](f"/kazoo/{name}")
    return recipe.acquire, recipe.release


def tooz_pair(coordinator: Any, name: str) -> Pair:
    lock = coordinator.get_lock(name.encode())
    return lock.acquire, lock.release


def tooz_coordinator(url: str) -> Any:
    from tooz import coordination

    coordinator = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
    coordinator.start()
    return coordinator


#: The fair-handoff floor's scripts (a ticket lock): the fewest Redis commands a FIFO handoff
#: needs. KEYS: the ticket counter, the count of releases served. A ticket is granted when
#: it is the one after the releases served; a waiter blocks on its ticket's own list, and the
#: release pushes to the next ticket's list only when that ticket has been drawn (so no list
#: is left behind). No liveness at all (a holder that dies blocks the queue for ever): a floor
#: to measure against, not a lock to use.
TICKET_ACQUIRE = """
local t = redis.call('INCR', KEYS[1])
if t == tonumber(redis.call('GET', KEYS[2]) or '0') + 1 then return 0 end
return t
"""
TICKET_RELEASE = """
local nxt = redis.call('INCR', KEYS[2]) + 1
if tonumber(redis.call('GET', KEYS[1]) or '0') >= nxt then redis.call('LPUSH', ARGV[1] .. nxt, 1) end
return nxt
"""


def ticket_lock(client: redis.Redis, name: str) -> Pair:
    """The fair-handoff floor: a ticket lock (INCR a ticket; wait with BLPOP on the ticket's
    list; the release advances the count served and LPUSHes the next ticket's list)."""
    acquire_script, release_script = client.register_script(TICKET_ACQUIRE), client.register_script(TICKET_RELEASE)
    keys = [f"ticket:{{{name}}}:t", f"ticket:{{{name}}}:s"]
    wake = f"ticket:{{{name}}}:l:"

    def acquire() -> None:
        ticket = acquire_script(keys=keys)
        if ticket and client.blpop([f"{wake}{ticket}"], 60) is None:
            raise TimeoutError(f"ticket {ticket} of {name!r} not served within 60 s")

    return acquire, lambda: release_script(keys=keys, args=[wake])
