"""``@ylock.idempotent``: a retried POST runs once (the ``Idempotency-Key`` header). What an
idempotent request does is :mod:`ylock.idempotency`'s (shared with Django); this module
translates Flask's request and response, ``YLOCK_IDEMPOTENCY`` and the store.

The store (``cache=``, default ``"auto"``): the app's Flask-Caching cache when it has one
(``app.extensions["cache"]``), else the lock engine's own server (``cache=None`` forces
that). A Redis cache (``RedisCache``, ``RedisSentinelCache``, ``RedisClusterCache``) keeps
the records as Redis hashes written by Lua scripts (fenced on the server); ``SimpleCache``
and ``NullCache`` are per process (a warning is logged outside debug and testing: another
worker runs a retry again); any other backend has no compare-and-set, so a request that
lost its lock could overwrite a retry's response: it is refused (ConfigurationError).
"""
from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from flask import Flask, Response, current_app, request

from flask_ylock.config import AUTO
from flask_ylock.state import State, state
from ylock import idempotency as idem
from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.idempotency.records import LocalRecords, RecordStore, RedisRecords, StoredResponse

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

class Idempotent:
    """One ``@ylock.idempotent(...)``: its arguments, resolved against each app's settings.
    The extension hands it how it reads the request's owner and user and how it answers
    (``owner()``, ``held()``, ``user_key(anonymous)``, ``answer(refusal)``)."""

    def __init__(self, given: dict[str, Any], owner: Callable[[], str], held: Callable[[], Any],
                 user_key: Callable[[str], str | None], answer: Callable[[Any], Response]) -> None:
        self.given, self.owner, self.held, self.user_key, self.answer = given, owner, held, user_key, answer

    def behaviour(self) -> idem.Idempotency[Response]:
        st = state()
        o = replace(st.idempotency, **self.given)
        return idem.Idempotency(o, store_for(o, st), idem.lock_family(st.registry, o.lock, o.lease), self.owner(),
                                self.held())

    def decorate(self, view: F) -> F:
        if inspect.iscoroutinefunction(view):
            @functools.wraps(view)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                exchange = Exchange(kwargs, self.user_key, self.answer)
                return await self.behaviour().arun(exchange, lambda: view(*args, **kwargs))
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.behaviour().run(Exchange(kwargs, self.user_key, self.answer), lambda: view(*args, **kwargs))
        return wrapper  # type: ignore[return-value]


# -- the store -------------------------------------------------------------------------------------

_mutex = threading.Lock()


def store_for(options: idem.Options, st: State) -> RecordStore:
    """The store of ``options.cache`` for the current app (built once per app and cache)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    cache = options.cache
    backend = None
    if cache is not None:
        caches: dict[Any, Any] = app.extensions.get("cache") or {}
        if cache == AUTO:
            if len(caches) > 1:
                raise ConfigurationError(f"@idempotent(cache='auto'): app {app.name!r} has {len(caches)} "
                                         "Flask-Caching caches; pass the one to use as cache=",
                                         code=opt.E_IDEMPOTENCY)
            backend = next(iter(caches.values()), None)
        else:
            backend = caches.get(cache, getattr(cache, "cache", cache))
    if backend is None:
        engine = st.registry.engine(st.registry.lock_options(options.lock).engine)
        return idem.engine_store(engine)
    with _mutex:
        store: RecordStore | None = st.idempotency_stores.get(id(backend))
        if store is None:
            store = st.idempotency_stores[id(backend)] = _backend_store(backend, app)
    return store


def _backend_store(backend: Any, app: Flask) -> RecordStore:
    from flask_caching.backends.nullcache import NullCache
    from flask_caching.backends.rediscache import RedisCache
    from flask_caching.backends.simplecache import SimpleCache

    name = type(backend).__name__
    if isinstance(backend, RedisCache):
        return RedisRecords(backend._write_client, f"{backend.key_prefix or ''}ylock-idempotency:",
                            label=f"Flask-Caching {name}")
    if isinstance(backend, (SimpleCache, NullCache)):
        if not (app.debug or app.testing):
            logger.warning("ylock: @idempotent keeps its records in Flask-Caching's %s, in each process: another "
                           "worker or machine runs a retried request again (use a Redis cache, or cache=None: the "
                           "lock engine's server)", name)
        return LocalRecords(_Slots(backend), label=f"Flask-Caching {name} (per process)")
    raise ConfigurationError(f"@idempotent: Flask-Caching's {name} cannot keep idempotency records: it has no "
                             "compare-and-set, so a request that lost its lock could overwrite a retry's response",
                             code=opt.E_IDEMPOTENCY,
                             hint="use CACHE_TYPE='RedisCache', or cache=None (the lock engine's server)")


class _Slots:
    """A per-process Flask-Caching backend as :class:`ylock.idempotency.records.Slots`."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def get(self, key: str) -> bytes | None:
        value = self.backend.get(key)
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes, ttl: float) -> None:
        self.backend.set(key, value, timeout=max(1, int(ttl)))

    def delete(self, key: str) -> None:
        self.backend.delete(key)


# -- the exchange ---------------------------------------------------------------------------------------


class Exchange:
    """The current Flask request and its response, translated for
    :class:`ylock.idempotency.Idempotency`."""

    def __init__(self, view_kwargs: dict[str, Any], user_key: Callable[[str], str | None],
                 answer: Callable[[Any], Response]) -> None:
        self.view_kwargs, self.user_key, self.answer = view_kwargs, user_key, answer
        self.method = request.method.upper()
        query = request.query_string.decode("latin-1")
        self.path = request.path + (f"?{query}" if query else "")

    def key(self, header: str) -> str | None:
        return request.headers.get(header)

    def body(self) -> bytes:
        return request.get_data(cache=True)          # cached: the view reads it as usual

    def scope(self, scope: Any) -> str:
        if scope == "global":
            return ""
        if callable(scope):
            return str(scope(**self.view_kwargs))
        return self.user_key("skip") or idem.ANONYMOUS

    def capture(self, result: Any) -> tuple[Response, StoredResponse | None]:
        response = current_app.make_response(result)
        if response.is_streamed:
            logger.warning("ylock: %s %s answered a streamed response: idempotency cannot store it (a retry runs "
                           "the view again)", self.method, request.path)
            return response, None
        reason = response.status.partition(" ")[2]
        return response, idem.stored_response(response.status_code, reason, response.headers.items(),
                                              response.get_data())

    def replay(self, stored: StoredResponse) -> Response:
        response = Response(stored.body, status=f"{stored.status} {stored.reason}".strip(),
                            headers=list(stored.headers))
        response.headers[idem.REPLAYED] = "true"
        return response

    def refuse(self, refusal: Any) -> Response:
        return self.answer(refusal)
