"""``@idempotent``: a retried POST runs once (the ``Idempotency-Key`` header). What an
idempotent request does is :mod:`ylock.idempotency`'s (shared with Flask); this module
translates Django's request and response (and Django REST framework's), the
``YLOCK["IDEMPOTENCY"]`` defaults, and the store: a ``CACHES`` alias or the lock engine.

Stores. The record of a key must be written with a compare on the lock's fencing token, on
the store itself, or a request paused past its lease could overwrite a retry's response:

- ``django.core.cache.backends.redis.RedisCache`` (and subclasses): the records are Redis
  hashes on the cache's server, written by Lua scripts (fenced on the server);
- ``LocMemCache`` and ``DummyCache``: per process, fenced by a mutex; for development and
  tests only (``django_ylock.E014`` when DEBUG is False; Dummy keeps nothing, so nothing
  is replayed);
- ``cache=None``: the lock engine's own server (Redis, including the embedded one: no
  cache to configure, and the record lives where the lock does);
- any other backend (Memcached, database, file) has no compare-and-set in Django's cache
  API: ``django_ylock.E015``.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import RawPostDataException
from django.template.response import SimpleTemplateResponse
from django.utils.module_loading import import_string

import ylock
from django_ylock import conf
from django_ylock.decorators import _is_async
from django_ylock.request_lock import answer, request_held, request_owner, user_key
from ylock import idempotency as idem
from ylock.idempotency.records import LocalRecords, RecordStore, RedisRecords, StoredResponse

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute that marks a view decorated by @idempotent (the system checks find them
#: in the URLconf by it: see :func:`decorated_views`).
MARK = "_ylock_idempotent"
#: Kinds of store a cache backend gives (see :func:`cache_kind`).
REDIS, PER_PROCESS, UNSUPPORTED = "redis", "per-process", "unsupported"


def idempotent(header: Any = ylock.DEFAULT, *, required: Any = ylock.DEFAULT, ttl: Any = ylock.DEFAULT,
               scope: Any = ylock.DEFAULT, timeout: Any = ylock.DEFAULT, lease: Any = ylock.DEFAULT,
               cache: Any = ylock.DEFAULT, lock: Any = ylock.DEFAULT) -> Callable[[F], F]:
    """Run the view at most once per idempotency key: a retried POST, PUT, PATCH or DELETE
    with the same ``Idempotency-Key`` header gets the first response replayed.

    ``header``: the header's name. ``required``: a request without it gets 400 (False: the
    view runs unprotected). ``ttl``: seconds a response is replayed (default a day).
    ``scope``: ``"user"`` (the authenticated user: two users' equal keys never meet;
    anonymous requests share one scope), ``"global"`` or a callable
    ``scope(request, *args, **kwargs)``. ``timeout``: seconds a duplicate waits for the
    first to finish and get its replay (default 0: 409 + Retry-After at once). ``lease``:
    the key lock's lease (default the LEASE of ``lock``, the lock family, default
    ``"idempotency"``, in ``YLOCK["LOCKS"]``), the longest a killed worker keeps its key.
    ``cache``: a ``CACHES`` alias (default ``"default"``) or None (the lock engine's
    server). Unset arguments take ``YLOCK["IDEMPOTENCY"]``'s values.

    The answers: 400 (key missing, empty or over 255 characters), 409 (in flight), 422
    (the key reused for another method, path or body), the replay with
    ``Idempotent-Replayed: true``, 503 (the engine or the store out of reach). A 5xx or an
    exception is not stored. Checked here, when applied. Works on sync and async function
    views (``@idempotent`` with no parentheses too), class-based views through
    ``method_decorator(idempotent(), name="dispatch")``,
    and Django REST framework: ``@api_view`` functions and ``APIView`` handlers
    (``method_decorator(idempotent(), name="post")``, where the request's user is the one
    DRF authenticated).
    """
    if callable(header):                # @idempotent without parentheses
        return idempotent()(header)  # type: ignore[no-any-return]
    decorator = Idempotent(idem.check_given(
        {"header": header, "required": required, "ttl": ttl, "scope": scope, "timeout": timeout, "lease": lease,
         "cache": cache, "lock": lock}, check_cache=conf.check_cache))
    return decorator.decorate


class Idempotent:
    """One ``@idempotent(...)``: the arguments it was given, resolved against the settings
    (once per settings) into :class:`ylock.idempotency.Options`."""

    def __init__(self, given: dict[str, Any]) -> None:
        self.given = given
        self._resolved: tuple[conf.Config, idem.Options] | None = None

    def options(self, config: conf.Config | None = None) -> idem.Options:
        """The options in force: ``YLOCK["IDEMPOTENCY"]`` with the decorator's arguments over it."""
        config = config or conf.current()
        resolved = self._resolved
        if resolved is None or resolved[0] is not config:
            resolved = self._resolved = (config, replace(config.idempotency, **self.given))
        return resolved[1]

    def behaviour(self, request: HttpRequest) -> idem.Idempotency[HttpResponseBase]:
        config = conf.current()
        o = self.options(config)
        django_request = getattr(request, "_request", request)      # under DRF: its HttpRequest
        return idem.Idempotency(o, store_for(o, config), idem.lock_family(config.registry, o.lock, o.lease),
                                request_owner(django_request), request_held(django_request))

    def decorate(self, view: F) -> F:
        if _is_async(view):
            @functools.wraps(view)
            async def async_view(request: Any, *args: Any, **kwargs: Any) -> Any:
                exchange = Exchange(request, args, kwargs)
                behaviour = self.behaviour(request)
                scope = None
                if exchange.method in idem.UNSAFE_METHODS and exchange.key(behaviour.options.header):
                    from asgiref.sync import sync_to_async

                    # The user (a database read) and the session must not be touched on the loop.
                    scope = await sync_to_async(exchange.scope)(behaviour.options.scope)
                return await behaviour.arun(exchange, lambda: view(request, *args, **kwargs), scope)
            setattr(async_view, MARK, self)
            return async_view  # type: ignore[return-value]

        @functools.wraps(view)
        def sync_view(request: Any, *args: Any, **kwargs: Any) -> Any:
            return self.behaviour(request).run(Exchange(request, args, kwargs), lambda: view(request, *args, **kwargs))
        setattr(sync_view, MARK, self)
        return sync_view  # type: ignore[return-value]


def decorated_views(patterns: Any = None) -> list[tuple[Idempotent, Any]]:
    """The views the URLconf serves (``patterns``: default the root URLconf's) that are
    @idempotent, as (decorator, the URL's view): function views, class-based views'
    ``dispatch`` and handlers (through ``method_decorator``), and Django REST framework's
    ``@api_view`` functions."""
    if patterns is None:
        from django.urls import get_resolver

        patterns = get_resolver().url_patterns
    found: list[tuple[Idempotent, Any]] = []
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            found.extend(decorated_views(pattern.url_patterns))
            continue
        callback = getattr(pattern, "callback", None)
        candidates = [callback]
        view_class = getattr(callback, "view_class", None)
        if view_class is not None:
            for name in ("dispatch", *getattr(view_class, "http_method_names", ())):
                method = getattr(view_class, name, None)
                candidates.append(method)
                # @api_view: the handler calls the decorated function, kept in its closure
                candidates.extend(cell.cell_contents for cell in getattr(method, "__closure__", None) or ()
                                  if callable(getattr(cell, "cell_contents", None)))
        for candidate in candidates:
            mark = getattr(candidate, MARK, None)
            if isinstance(mark, Idempotent) and (mark, callback) not in found:
                found.append((mark, callback))
    return found


# -- the store -----------------------------------------------------------------------------------


def cache_kind(backend: str | type) -> str:
    """What a cache backend (a class, or its dotted path in CACHES) can be as a store:
    :data:`REDIS`, :data:`PER_PROCESS` or :data:`UNSUPPORTED`."""
    cls = import_string(backend) if isinstance(backend, str) else backend
    if issubclass(cls, RedisCache):
        return REDIS
    if issubclass(cls, (LocMemCache, DummyCache)):
        return PER_PROCESS
    return UNSUPPORTED


class _CacheSlots:
    """A per-process Django cache as :class:`ylock.idempotency.records.Slots`."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def get(self, key: str) -> bytes | None:
        value = caches[self.alias].get(key)
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes, ttl: float) -> None:
        caches[self.alias].set(key, value, timeout=ttl)

    def delete(self, key: str) -> None:
        caches[self.alias].delete(key)


_local_stores: dict[str, LocalRecords] = {}
_local_mutex = threading.Lock()


def store_for(options: idem.Options, config: conf.Config) -> RecordStore:
    """The store of ``options.cache``: the lock engine's server (None) or a CACHES alias."""
    if options.cache is None:
        return idem.engine_store(config.registry.engine(config.registry.lock_options(options.lock).engine))
    alias = options.cache
    if alias not in settings.CACHES:
        raise ImproperlyConfigured(f"@idempotent cache={alias!r}: no such alias in CACHES (django_ylock.E015)")
    backend: BaseCache = caches[alias]
    kind = cache_kind(type(backend))
    if kind == REDIS:
        client = backend._cache.get_client(None, write=True)
        return RedisRecords(client, backend.make_key("ylock-idempotency:"), label=f"cache {alias!r}")
    if kind == PER_PROCESS:
        with _local_mutex:
            store = _local_stores.get(alias)
            if store is None:
                store = _local_stores[alias] = LocalRecords(_CacheSlots(alias), backend.make_key("ylock-idempotency:"),
                                                            label=f"cache {alias!r} (per process)")
        return store
    raise ImproperlyConfigured(f"@idempotent cache={alias!r}: {type(backend).__name__} cannot keep idempotency "
                               "records (django_ylock.E015): use a Redis cache, or cache=None (the lock engine)")


# -- the exchange ----------------------------------------------------------------------------------


class Exchange:
    """One Django (or Django REST framework) request and its response, translated for
    :class:`ylock.idempotency.Idempotency`."""

    def __init__(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.request, self.args, self.kwargs = request, args, kwargs
        self.method = (request.method or "GET").upper()
        self.path = request.get_full_path()

    def key(self, header: str) -> str | None:
        value = self.request.headers.get(header)
        return None if value is None else str(value)

    def body(self) -> bytes:
        try:
            return bytes(self.request.body)
        except RawPostDataException:
            # A multipart body that something (CSRF's check of request.POST) read as a
            # stream: the parsed form stands for it.
            return _form_digest(self.request)

    def scope(self, scope: Any) -> str:
        if scope == "global":
            return ""
        if callable(scope):
            return str(scope(self.request, *self.args, **self.kwargs))
        # Who sent it, as the per-user lock says (a user, else an API client's credential,
        # hashed), never a session: Flask's scope is the same (flask_ylock.current_user_key).
        return user_key(self.request, "skip") or idem.ANONYMOUS

    def capture(self, response: Any) -> tuple[HttpResponseBase, StoredResponse | None]:
        response = self._rendered(response)
        if getattr(response, "streaming", False):
            logger.warning("ylock: %s %s answered a streaming response: idempotency cannot store it (a retry runs "
                           "the view again)", self.method, self.request.path)
            return response, None
        assert isinstance(response, HttpResponse)
        stored = idem.stored_response(response.status_code, response.reason_phrase, response.headers.items(),
                                      response.content)
        return response, stored

    def _rendered(self, response: Any) -> Any:
        """A template response rendered (its body is what is stored); a Django REST framework
        ``Response`` finalized first, as its view would (the decorator runs inside it)."""
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            view = (getattr(self.request, "parser_context", None) or {}).get("view")
            if view is not None and getattr(response, "accepted_renderer", None) is None:
                response = view.finalize_response(self.request, response, *self.args, **self.kwargs)
            response.render()
        return response

    def replay(self, stored: StoredResponse) -> HttpResponse:
        response = HttpResponse(stored.body, status=stored.status, reason=stored.reason)
        for name in list(response.headers):
            del response.headers[name]
        for name, value in stored.headers:
            response.headers[name] = value
        response.headers[idem.REPLAYED] = "true"
        return response

    def refuse(self, refusal: Any) -> HttpResponse:
        return answer(refusal)


def _form_digest(request: Any) -> bytes:
    digest = hashlib.sha256()
    for key in sorted(request.POST):
        for value in request.POST.getlist(key):
            digest.update(f"{key}={value}\0".encode("utf-8", "surrogatepass"))
    for key in sorted(request.FILES):
        for upload in request.FILES.getlist(key):
            digest.update(f"{key}:{upload.name}:{upload.size}:{upload.content_type}\0".encode())
    return digest.digest()
