"""Single-flight caching, framework-free: on a cache miss only one process in the deployment
computes the value; the others wait for it and read the cache (no cache stampede).

    value = singleflight.get_or_set(cache, "report:2026-11", build_report,
                                    lock=locks[singleflight.lock_name("report:2026-11")],
                                    lock_timeout=10)

``cache`` is any object with ``get(key)`` (returning :data:`MISSING` on a miss) and
``set(key, value)``: Django's and Flask-Caching's caches are adapted by the plugins
(``django_ylock.cache.get_or_set``, ``flask_ylock.cache.get_or_set``), which also pick the
lock (one per key, of a named lock family, so its lease and engine are settings).

What happens on a miss:

1. The first caller takes the key's lock (a write lock: one computing holder at a time,
   deployment-wide), reads the cache again (a holder before it may just have filled it),
   and only on a second miss calls ``compute()``, stores the value and releases the lock.
2. The others wait up to ``lock_timeout`` seconds as readers of the same lock: the
   computing holder's release admits them all at once (one handoff, however many wait),
   and they read the value from the cache.
3. A ``compute()`` that raises propagates to its caller only; the lock is released, the
   waiters find the cache still empty and queue as writers, one at a time, each reading
   the cache again under the lock: the first computes, the others read its value (one
   retry per failure, not one per waiter). A holder that dies (SIGKILL, a lost machine) frees the lock within its
   lease; the next waiter computes then.
4. The lock engine down (:class:`ylock.EngineUnavailable`): the value is computed without
   the lock and a warning is logged. A cache is an optimisation; it must never turn a lock
   outage into an error page.
5. ``lock_timeout`` spent while another holder still computes: the cache is read once more;
   on a miss, ``on_timeout="compute"`` (the default) computes without the lock (logged),
   ``"raise"`` raises :class:`ylock.LockTimeout`.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ylock import options as opt
from ylock.errors import EngineUnavailable, LockLost, LockTimeout
from ylock.lock import Lock
from ylock.names import name_for

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What an adapter's ``get`` returns on a miss (a cached None is a value, not a miss).
MISSING: Any = object()

#: What ``on_timeout`` may be.
ON_TIMEOUT = ("compute", "raise")


class Cache(Protocol):
    """What :func:`get_or_set` needs of a cache (the plugins adapt theirs)."""

    def get(self, key: str) -> Any:
        """Return the value cached for ``key``, or :data:`MISSING`."""

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` for ``key`` (with the adapter's expiry)."""


def lock_name(key: str) -> str:
    """The lock name of a cache key: the key escaped into a valid lock name, or a hash of it
    when it is too long (so any key is safe, and a short one stays readable in ``ylock list``)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a cache key must be a non-empty str, got {key!r}")
    return name_for(key)


def check_on_timeout(on_timeout: str) -> str:
    """Return ``on_timeout`` if valid, else raise a ConfigurationError naming it."""
    return str(opt.choice(on_timeout, "on_timeout", ON_TIMEOUT))


def get_or_set(cache: Cache, key: str, compute: Callable[[], T], *, lock: Lock, lock_timeout: float | None,
               on_timeout: str = "compute") -> T:
    """Return the value cached for ``key``; on a miss compute it once deployment-wide under
    ``lock`` and store it (see the module docstring for every case)."""
    if not callable(compute):
        raise TypeError(f"compute must be a callable taking no arguments, got {compute!r}")
    value = cache.get(key)
    if value is not MISSING:
        return value  # type: ignore[no-any-return]
    try:
        got, value = _take(cache, key, lock, lock_timeout)
    except EngineUnavailable as exc:
        logger.warning("ylock: single-flight for cache key %r computes without its lock %s/%s: the lock engine "
                       "is unavailable (%s)", key, lock.group, lock.name, exc)
        return _fill(cache, key, compute)
    if not got:
        if value is not MISSING:
            return value  # type: ignore[no-any-return]
        if on_timeout == "raise":
            raise LockTimeout(f"cache key {key!r} was still being computed after {lock_timeout} s",
                              group=lock.group, name=lock.name)
        logger.warning("ylock: single-flight for cache key %r computes without its lock %s/%s: another holder "
                       "was still computing after lock_timeout=%s s", key, lock.group, lock.name, lock_timeout)
        return _fill(cache, key, compute)
    try:
        value = cache.get(key)          # a holder before this one may have filled it
        if value is MISSING:
            value = _fill(cache, key, compute)
        return value  # type: ignore[no-any-return]
    finally:
        try:
            lock.unlock()
        except (LockLost, EngineUnavailable) as exc:
            # The value is computed and stored; a lease lost meanwhile only means another
            # caller may have computed it too.
            logger.warning("ylock: single-flight for cache key %r: %s", key, exc)


def _take(cache: Cache, key: str, lock: Lock, lock_timeout: float | None) -> tuple[bool, Any]:
    """Return (True, MISSING) holding ``lock`` (write): compute; or (False, the value) when
    another holder stored it meanwhile; or (False, MISSING) when ``lock_timeout`` ran out.

    The first caller on a miss takes the write lock at once; the others wait as readers, so
    that the release of the one computation admits all of them together (one handoff, not
    one per waiter), and read the cache. Only when they find it still empty (the holder
    raised or died) do they queue as writers, one at a time, each reading the cache again
    under the lock: one retry per failure."""
    deadline = None if lock_timeout is None else time.monotonic() + lock_timeout
    if lock.try_lock(0):
        return True, MISSING
    if not lock.try_rlock(lock_timeout):
        return False, cache.get(key)
    try:
        lock.runlock()
    except LockLost:
        pass                            # a read hold of an instant: nothing was done under it
    value = cache.get(key)
    if value is not MISSING:
        return False, value
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    if lock.try_lock(left):
        return True, MISSING
    return False, cache.get(key)


def _fill(cache: Cache, key: str, compute: Callable[[], T]) -> T:
    value = compute()
    cache.set(key, value)
    return value
