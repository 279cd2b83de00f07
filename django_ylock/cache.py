"""Single-flight caching over Django's cache framework: on a miss only one process in the
deployment computes the value, the others wait for it and read the cache.

    import django_ylock.cache

    def monthly_report(request, month):
        report = django_ylock.cache.get_or_set(f"report:{month}", lambda: build_report(month),
                                               timeout=300, lock_timeout=30)

The behaviour (a compute that raises, a holder that dies, the lock engine down) is
:mod:`ylock.singleflight`'s, shared with Flask. The lock is one per cache key (its key as
made by the cache, with its KEY_PREFIX and version, so two caches or versions never share
one) of the lock family ``lock`` (default ``"cache"``: set its ENGINE or LEASE in
``YLOCK["LOCKS"]["cache"]``; the lease bounds how long a dead holder delays the others).
The cache must be shared by the processes (Redis, Memcached, database, file-based):
with ``LocMemCache`` each process computes its own value.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from django_ylock.registry import locks
from ylock import singleflight

T = TypeVar("T")

__all__ = ["get_or_set"]


class _Adapter:
    """A Django cache as :class:`ylock.singleflight.Cache` (version and expiry bound)."""

    def __init__(self, cache: BaseCache, timeout: Any, version: int | None) -> None:
        self.cache, self.timeout, self.version = cache, timeout, version

    def get(self, key: str) -> Any:
        return self.cache.get(key, singleflight.MISSING, version=self.version)

    def set(self, key: str, value: Any) -> None:
        self.cache.set(key, value, self.timeout, version=self.version)


def get_or_set(key: str, compute: Callable[[], T], timeout: Any = DEFAULT_TIMEOUT, lock_timeout: float | None = 10.0,
               *, cache: str = "default", lock: str = "cache", version: int | None = None,
               on_timeout: str = "compute") -> T:
    """Return the value of ``key`` in the cache ``cache`` (an alias of ``CACHES``); on a miss,
    call ``compute()`` once deployment-wide, store its value for ``timeout`` seconds (as
    ``cache.set``; default the cache's TIMEOUT) and return it.

    ``lock_timeout``: seconds a caller waits for another one's computation (None: as long as
    it takes); past it, ``on_timeout="compute"`` computes without the lock (logged) and
    ``"raise"`` raises :class:`ylock.LockTimeout`. With the lock engine unreachable the
    value is computed without the lock (a warning is logged), never an error.
    """
    singleflight.check_on_timeout(on_timeout)
    backend = caches[cache]
    name = singleflight.lock_name(backend.make_key(key, version=version))
    return singleflight.get_or_set(_Adapter(backend, timeout, version), key, compute, lock=locks(lock)[name],
                                   lock_timeout=lock_timeout, on_timeout=on_timeout)
