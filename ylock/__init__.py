"""ylock: a distributed reentrant read-write lock with fair queuing, self-renewing leases,
fencing tokens and metrics, over Redis, ZooKeeper or in-process.

    import ylock
    engine = ylock.engine_from_url("redis://127.0.0.1:6379/0")
    lock = ylock.Lock(engine, group="orders", name="global", fair=True, lease=30.0)
    with lock.write(timeout=5):
        ...
"""
from ylock import events
from ylock.engines import engine_from_path, engine_from_url
from ylock.engines.base import READ, WRITE, AcquireRequest, Engine, Listing, LockInfo, RenewItem
from ylock.errors import (
    ConfigurationError,
    EngineUnavailable,
    FencedOut,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    LockUpgradeError,
)
from ylock.guard import DEFAULT, Guard
from ylock.holds import HOLDS
from ylock.leader import Leadership
from ylock.lock import Lock, Locks
from ylock.multi import all_of
from ylock.owner import context, current_owner, owner_scope, run_as
from ylock.semaphore import Semaphore, Semaphores
from ylock.tickets import Ticket
from ylock.version import __version__ as __version__
from ylock.waiting import Polling
from ylock.watchdog import WATCHDOG

__all__ = [
    "Lock", "Locks", "Semaphore", "Semaphores", "Guard", "all_of", "Leadership", "Ticket",
    "Engine", "LockInfo", "Listing", "AcquireRequest", "RenewItem", "Polling",
    "READ", "WRITE", "DEFAULT", "engine_from_url", "engine_from_path", "current_owner", "owner_scope", "run_as",
    "context",
    "events", "WATCHDOG", "HOLDS",
    "LockError", "LockTimeout", "LockNotOwned", "LockLost", "FencedOut", "LockUpgradeError",
    "EngineUnavailable", "ConfigurationError",
]
