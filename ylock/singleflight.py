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

1. The caller waits up to ``lock_timeout`` seconds for the key's lock (a write lock: one
   computing holder at a time, deployment-wide).
2. Holding it, it reads the cache again: a holder before it may have filled it while it
   waited (the common case for every caller but the first). Only on a second miss does it
   call ``compute()`` and store the value, then it releases the lock.
3. A ``compute()`` that raises propagates to its caller only; the lock is released, and the
   next waiter finds the cache still empty and computes (one retry per failure, not one
   per waiter). A holder that dies (SIGKILL, a lost machine) frees the lock within its
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
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ylock import options as opt
from ylock.errors import EngineUnavailable, LockLost, LockTimeout
from ylock.lock import Lock
from ylock.web import key_name

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
    return key_name(key)


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
        got = lock.try_lock(lock_timeout)
    except EngineUnavailable as exc:
        logger.warning("ylock: single-flight for cache key %r computes without its lock %s/%s: the lock engine "
                       "is unavailable (%s)", key, lock.group, lock.name, exc)
        return _fill(cache, key, compute)
    if not got:
        value = cache.get(key)
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


def _fill(cache: Cache, key: str, compute: Callable[[], T]) -> T:
    value = compute()
    cache.set(key, value)
    return value
