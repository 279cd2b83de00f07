"""Single-flight caching over Flask-Caching: on a miss only one process in the deployment
computes the value, the others wait for it and read the cache.

    from flask_caching import Cache
    cache = Cache(app)
    ylock = YLock(app)

    @app.get("/reports/<month>")
    def report(month):
        return ylock.get_or_set(cache, f"report:{month}", lambda: build_report(month), timeout=300)

The behaviour (a compute that raises, a holder that dies, the lock engine down) is
:mod:`ylock.singleflight`'s, shared with Django. The lock is one per key of the lock family
``lock`` (default ``"cache"``: ``YLOCK_LOCKS["cache"]`` sets its engine and LEASE). Flask-Caching
answers a miss with None, so a cached None counts as a miss (it is computed again). The
cache must be shared by the processes (Redis, Memcached, filesystem): with ``SimpleCache``
each process computes its own value.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask_ylock.state import state
from ylock import singleflight

T = TypeVar("T")

__all__ = ["get_or_set"]


class _Adapter:
    """A Flask-Caching ``Cache`` as :class:`ylock.singleflight.Cache` (expiry bound)."""

    def __init__(self, cache: Any, timeout: int | None) -> None:
        self.cache, self.timeout = cache, timeout

    def get(self, key: str) -> Any:
        value = self.cache.get(key)
        return singleflight.MISSING if value is None else value

    def set(self, key: str, value: Any) -> None:
        self.cache.set(key, value, timeout=self.timeout)


def get_or_set(cache: Any, key: str, compute: Callable[[], T], timeout: int | None = None,
               lock_timeout: float | None = 10.0, *, lock: str = "cache", on_timeout: str = "compute") -> T:
    """Return the value of ``key`` in ``cache`` (a Flask-Caching ``Cache``); on a miss call
    ``compute()`` once deployment-wide, store it for ``timeout`` seconds (None: the cache's
    default) and return it. Needs an app context (the current app's ylock settings).

    ``lock_timeout``: seconds a caller waits for another one's computation (None: as long as
    it takes); past it, ``on_timeout="compute"`` computes without the lock (logged) and
    ``"raise"`` raises :class:`ylock.LockTimeout`. With the lock engine unreachable the
    value is computed without the lock (a warning is logged), never an error.
    """
    if not (hasattr(cache, "get") and hasattr(cache, "set")):
        raise TypeError(f"cache must be a Flask-Caching Cache, got {cache!r}")
    singleflight.check_on_timeout(on_timeout)
    target = state().registry.locks(lock)[singleflight.lock_name(key)]
    return singleflight.get_or_set(_Adapter(cache, timeout), key, compute, lock=target, lock_timeout=lock_timeout,
                                   on_timeout=on_timeout)
