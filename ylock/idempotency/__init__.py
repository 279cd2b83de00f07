"""Idempotency keys for unsafe requests, framework-free: the one behaviour behind Django's
``@idempotent`` and the Flask extension's (IETF httpapi "The Idempotency-Key HTTP Header
Field"; Stripe's API). The plugins only translate their requests, responses and settings.

A client sends ``Idempotency-Key: <unique value>`` with a POST, PUT, PATCH or DELETE and
the same value on every retry. The view runs at most once per (scope, key):

==============================================  ============================================
the request                                     the answer
==============================================  ============================================
GET, HEAD, OPTIONS, TRACE                       the view, untouched
no key (``required``), an empty one, or one     400, a JSON error naming the header
over 255 characters
the first with its key                          the view, holding the key's lock; its
                                                response is stored for ``ttl`` seconds
a duplicate while the first is in flight        409 + ``Retry-After`` (``timeout`` > 0: it
                                                waits that long, then gets the replay)
a duplicate once done (same method, path and    the stored response: status, headers the
body)                                           view set, body byte for byte, plus
                                                ``Idempotent-Replayed: true``; no view
the key with another method, path or body       422
a 5xx response or an exception                  not stored: the key is free, a retry runs
the lock engine or the store out of reach       503 + ``Retry-After`` (never the view)
==============================================  ============================================

How: the key's lock (one per (scope, key) in the lock family ``lock``, default
``"idempotency"``; a worker killed mid-request frees it within the lease) is held from
before the view until its response is stored; the record (:mod:`.records`) is written with
the lock's fencing token, so a request paused past its lease while a retry ran finds its
write refused and never overwrites the retry's response.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ylock import options as opt
from ylock import web
from ylock.engines.base import WRITE, Engine
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.guard import DEFAULT
from ylock.idempotency.records import (
    LocalRecords,
    MemorySlots,
    Record,
    RecordStore,
    RedisRecords,
    StoredResponse,
    fingerprint,
    record_id,
)
from ylock.lock import Lock, Locks
from ylock.names import check_name
from ylock.owner import owner_scope

__all__ = ["Options", "Idempotency", "Exchange", "StoredResponse", "Record", "RecordStore", "RedisRecords",
           "LocalRecords", "fingerprint", "record_id", "settings", "check_given", "engine_store",
           "UNSAFE_METHODS", "MAX_KEY_LENGTH", "REPLAYED", "DEFAULTS", "lock_family"]

logger = logging.getLogger(__name__)

#: The methods whose requests take a key; the others pass through untouched.
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The longest key accepted (the IETF draft leaves it to the server; Stripe's limit).
MAX_KEY_LENGTH = 255
#: The header a replayed response carries.
REPLAYED = "Idempotent-Replayed"
#: Headers never stored: the framework writes them anew (length) or they belong to one
#: exchange (cookies, hop-by-hop).
NOT_STORED = frozenset({"set-cookie", "content-length", "connection", "keep-alive", "transfer-encoding", "date",
                        "server", REPLAYED.lower()})
#: The scope of anonymous requests under ``scope="user"``: one for all of them (a session
#: would not do: a client that keeps no cookie would get a new one on every retry).
ANONYMOUS = "anonymous"
#: Reason phrases of the answers given instead of the view.
REASONS = {400: "Bad Request", 409: "Conflict", 422: "Unprocessable Content"}

#: The settings shared by Django (``YLOCK["IDEMPOTENCY"]``) and Flask (``YLOCK_IDEMPOTENCY``),
#: with their defaults; the decorators' arguments are these in lower case. CACHE: the store,
#: the plugin's business (Django: a CACHES alias; Flask: "auto"; both: None = the engine).
DEFAULTS: dict[str, Any] = {
    "HEADER": "Idempotency-Key",
    "REQUIRED": True,     # a request without a key: 400 (False: the view runs, unprotected)
    "TTL": 86400.0,       # seconds a response is replayed
    "SCOPE": "user",      # "user", "global" or a callable of the request
    "TIMEOUT": 0.0,       # seconds a duplicate waits for the first to finish (then: the replay)
    "LEASE": None,        # the key lock's lease (None: the lock family's LEASE)
    "LOCK": "idempotency",  # the lock family (its ENGINE, LEASE... in the LOCKS setting)
    "CACHE": None,
}
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")      # an HTTP field name (RFC 9110 token)


@dataclass(frozen=True)
class Options:
    """The validated options of one idempotent view (settings, then the decorator's)."""

    header: str = DEFAULTS["HEADER"]
    required: bool = True
    ttl: float = DEFAULTS["TTL"]
    scope: Any = "user"
    timeout: float | None = 0.0
    lease: float | None = None
    lock: str = DEFAULTS["LOCK"]
    cache: Any = None


def _check(key: str, value: Any, where: str, code: str) -> Any:
    """Return ``value`` for option ``key`` (upper case), validated; raise naming ``where``."""
    if key == "HEADER":
        text = opt.text(value, where, code=code)
        if not _HEADER.match(text):
            raise opt.fail(where, f"must be an HTTP header name (letters, digits, '-'), got {value!r}", code)
        return text
    if key == "REQUIRED":
        return opt.boolean(value, where, code=code)
    if key == "TTL":
        return opt.seconds(value, where, minimum=1, maximum=366 * 86400.0, above=None, code=code)
    if key == "SCOPE":
        if not (value in ("user", "global") or callable(value)):
            raise opt.fail(where, f"must be 'user', 'global' or a callable of the request, got {value!r}", code)
        return value
    if key == "TIMEOUT":
        return opt.timeout(value, where, code=code)
    if key == "LEASE":
        return None if value is None else opt.lease(value, where, code=code)
    if key == "LOCK":
        text = opt.text(value, where, code=code)
        try:
            check_name(text)
            web.check_family_name(text)
        except (ValueError, ConfigurationError) as exc:
            raise opt.fail(where, f"{text!r} cannot name a lock family: {exc}", code) from exc
        return text
    return value            # CACHE: checked by the plugin


def settings(value: Any, where: str, *, cache: Any = None, check_cache: Callable[[Any, str], Any] | None = None,
             code: str = opt.E_IDEMPOTENCY) -> Options:
    """Validate the IDEMPOTENCY setting ``value`` (a dict of :data:`DEFAULTS`' keys, or None)
    named ``where`` (``YLOCK['IDEMPOTENCY']``); ``cache``: the plugin's default store,
    ``check_cache(value, where)`` validates one. Raise ConfigurationError naming the key."""
    conf = opt.section(value, where, {**DEFAULTS, "CACHE": cache}, code=code)
    checked = {key: _check(key, conf[key], f"{where}[{key!r}]", code) for key in DEFAULTS}
    if check_cache is not None and value is not None and "CACHE" in value:
        checked["CACHE"] = check_cache(conf["CACHE"], f"{where}['CACHE']")
    return Options(**{key.lower(): v for key, v in checked.items()})


def check_given(given: Mapping[str, Any], decorator: str = "@idempotent",
                check_cache: Callable[[Any, str], Any] | None = None) -> dict[str, Any]:
    """Validate the arguments a decorator was given (lower-case keys of :data:`DEFAULTS`,
    :data:`ylock.DEFAULT` for those not given); return the given ones, validated. Raise
    ConfigurationError naming the argument, where the decorator is applied."""
    out = {}
    for key, value in given.items():
        if value is DEFAULT:
            continue
        where = f"{decorator} {key}"
        out[key] = check_cache(value, where) if key == "cache" and check_cache else \
            _check(key.upper(), value, where, opt.E_LOCK_OPTION)
    return out


# -- the answers ------------------------------------------------------------------------------


def _refusal(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Refusal:
    return web.Refusal(status, REASONS[status], body, headers or {})


def missing(header: str) -> web.Refusal:
    """400: the request has no key and needs one."""
    return _refusal(400, {"error": "idempotency key missing", "header": header,
                          "detail": f"this request needs an {header} header: a value unique to the operation "
                                    "(e.g. a UUID), sent again unchanged on every retry"})


def invalid_key(header: str, key: str) -> web.Refusal:
    """400: the key is empty or too long."""
    if not key:
        return _refusal(400, {"error": "idempotency key empty", "header": header,
                              "detail": f"the {header} header is empty"})
    return _refusal(400, {"error": "idempotency key too long", "header": header, "length": len(key),
                          "detail": f"the {header} header is {len(key)} characters long; the limit is "
                                    f"{MAX_KEY_LENGTH}"})


def in_flight(header: str, retry: int) -> web.Refusal:
    """409 + Retry-After: a request with the same key is still being processed."""
    return _refusal(409, {"error": "idempotency key in use", "header": header, "retry_after": retry,
                          "detail": f"a request with this {header} is still being processed; retry later "
                                    "with the same key to get its response"}, {"Retry-After": str(retry)})


def reused(header: str) -> web.Refusal:
    """422: the key was used for another request (method, path or body)."""
    return _refusal(422, {"error": "idempotency key reused", "header": header,
                          "detail": f"this {header} was used for another request (another method, path or "
                                    "body); send a new key for a new request"})


# -- the translation a plugin provides -------------------------------------------------------------

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Exchange(Protocol[R_co]):
    """One request and its response, as a plugin reads and writes them (``R``: its
    response type)."""

    method: str
    path: str               # with the query string

    def key(self, header: str) -> str | None:
        """The value of the request's ``header``, or None."""

    def body(self) -> bytes:
        """The request's body (read so that the view can still read it)."""

    def scope(self, scope: Any) -> str:
        """The scope value of the request: the authenticated user's lock name (``"user"``;
        :data:`ANONYMOUS` for anonymous requests), ``""`` (``"global"``), or the callable's
        result."""

    def capture(self, response: Any) -> tuple[R_co, StoredResponse | None]:
        """The view's result as the response to send, and as it is stored (None: not
        storable, e.g. a stream; 5xx answers are never stored whatever this says)."""

    def replay(self, stored: StoredResponse) -> R_co:
        """The response to send for a stored one (:data:`REPLAYED` added)."""

    def refuse(self, refusal: web.Refusal) -> R_co:
        """The response for an answer given instead of the view."""


@dataclass(frozen=True)
class _Plan:
    """What one request will do: None (run the view as it is) or its record's id,
    fingerprint and lock."""

    rid: str
    fingerprint: str
    lock: Lock


class Idempotency(Generic[R]):
    """The behaviour of one idempotent view for one request (see the module docstring):
    ``options`` resolved, ``store`` and ``locks`` (the key locks' family) chosen by the
    plugin, ``owner`` the request's owner id (or None: the thread or task), ``held`` the
    request's :class:`ylock.web.Held` (while the view runs, the plugins' ``current_lock``
    returns the key's lock under the family's name: its token fences the view's writes)."""

    __slots__ = ("options", "store", "locks", "owner", "held")

    def __init__(self, options: Options, store: RecordStore, locks: Locks, owner: str | None = None,
                 held: web.Held | None = None) -> None:
        self.options, self.store, self.locks, self.owner, self.held = options, store, locks, owner, held

    def _holding_lock(self, lock: Lock) -> Any:
        return self.held.holding(self.options.lock, lock) if self.held is not None else contextlib.nullcontext()

    def _scope(self) -> Any:
        return owner_scope(self.owner) if self.owner is not None else contextlib.nullcontext()

    def _plan(self, exchange: Exchange[R], scope: str | None) -> _Plan | web.Refusal | None:
        o = self.options
        if exchange.method.upper() not in UNSAFE_METHODS:
            return None
        key = exchange.key(o.header)
        if key is None:
            return missing(o.header) if o.required else None
        if not key or len(key) > MAX_KEY_LENGTH:
            return invalid_key(o.header, key)
        if scope is None:
            scope = exchange.scope(o.scope)
        rid = record_id(scope, key)
        return _Plan(rid, fingerprint(exchange.method, exchange.path, exchange.body()), self.locks[rid])

    def _known(self, record: Record | None, plan: _Plan, exchange: Exchange[R]) -> R | None:
        """The answer a record found gives (a replay, 422), or None: go on."""
        if record is None:
            return None
        if record.fingerprint != plan.fingerprint:
            return exchange.refuse(reused(self.options.header))
        if record.response is not None:
            return exchange.replay(record.response)
        return None

    def _busy(self, exchange: Exchange[R]) -> R:
        return exchange.refuse(in_flight(self.options.header, web.retry_after(self.options.timeout, None)))

    def _after(self, plan: _Plan, token: int, response: R, stored: StoredResponse | None) -> None:
        """Store the view's response (fenced by ``token``), or free the key."""
        o = self.options
        try:
            if stored is None or stored.status >= 500:
                self.store.abort(plan.rid, token)
            elif not self.store.commit(plan.rid, token, plan.fingerprint, stored, o.ttl):
                logger.warning("ylock: the response of idempotency record %s (lock %s/%s, token %s) was not stored: "
                               "a newer holder of its lock has begun or stored one (this request lost the lock, "
                               "e.g. paused past its lease); retries replay the newer response",
                               plan.rid[:16], plan.lock.group, plan.lock.name, token)
        except LockError as exc:
            logger.error("ylock: the idempotency store %s could not record %s: %s (a retry will run the view "
                         "again)", self.store.label, plan.rid[:16], exc)

    def _abort_quietly(self, plan: _Plan, token: int) -> None:
        try:
            self.store.abort(plan.rid, token)
        except LockError as exc:
            logger.error("ylock: the idempotency store %s could not free %s: %s", self.store.label, plan.rid[:16], exc)

    # -- sync views -----------------------------------------------------------------------------

    def run(self, exchange: Exchange[R], view: Callable[[], Any]) -> R:
        """Answer ``exchange``: run ``view()`` at most once per key, or replay, or refuse."""
        plan = self._plan(exchange, None)
        if plan is None:
            return exchange.capture(view())[0]
        if isinstance(plan, web.Refusal):
            return exchange.refuse(plan)
        lock = plan.lock
        with self._scope():
            try:
                known = self._known(self.store.get(plan.rid), plan, exchange)
                if known is not None:
                    return known
                if not lock.try_lock(self.options.timeout):
                    return self._known(self.store.get(plan.rid), plan, exchange) or self._busy(exchange)
            except EngineUnavailable as exc:
                return exchange.refuse(web.unavailable(lock, exc))
            try:
                return self._holding(exchange, plan, view)
            finally:
                web.leave(lock, WRITE)

    def _holding(self, exchange: Exchange[R], plan: _Plan, view: Callable[[], Any]) -> R:
        token = plan.lock.token
        assert token is not None
        try:
            record = self.store.begin(plan.rid, token, plan.fingerprint, self.options.ttl)
        except EngineUnavailable as exc:
            return exchange.refuse(web.unavailable(plan.lock, exc))
        if record is not None:
            return self._known(record, plan, exchange) or self._busy(exchange)
        try:
            with self._holding_lock(plan.lock):
                result = view()
            response, stored = exchange.capture(result)
        except BaseException:
            self._abort_quietly(plan, token)
            raise
        self._after(plan, token, response, stored)
        return response

    # -- async views ----------------------------------------------------------------------------

    async def arun(self, exchange: Exchange[R], view: Callable[[], Awaitable[Any]], scope: str | None = None) -> R:
        """:meth:`run` for async views: the lock is waited for without a thread, the store
        is called in one (a cancelled request frees its key and its lock). ``scope``: the
        request's scope value when the plugin read it already (Django's user must be read
        off the event loop)."""
        plan = self._plan(exchange, scope)
        if plan is None:
            return exchange.capture(await view())[0]
        if isinstance(plan, web.Refusal):
            return exchange.refuse(plan)
        lock = plan.lock
        with self._scope():
            try:
                known = self._known(await asyncio.to_thread(self.store.get, plan.rid), plan, exchange)
                if known is not None:
                    return known
                if not await lock.atry_lock(self.options.timeout):
                    found = await asyncio.to_thread(self.store.get, plan.rid)
                    return self._known(found, plan, exchange) or self._busy(exchange)
            except EngineUnavailable as exc:
                return exchange.refuse(web.unavailable(lock, exc))
            try:
                return await self._aholding(exchange, plan, view)
            finally:
                await web.aleave(lock, WRITE)

    async def _aholding(self, exchange: Exchange[R], plan: _Plan, view: Callable[[], Awaitable[Any]]) -> R:
        token = plan.lock.token
        assert token is not None
        try:
            record = await asyncio.to_thread(self.store.begin, plan.rid, token, plan.fingerprint, self.options.ttl)
        except EngineUnavailable as exc:
            return exchange.refuse(web.unavailable(plan.lock, exc))
        if record is not None:
            return self._known(record, plan, exchange) or self._busy(exchange)
        try:
            with self._holding_lock(plan.lock):
                result = await view()
            response, stored = exchange.capture(result)
        except BaseException:
            # A cancelled request too: the key is freed (in a thread the cancellation cannot stop).
            await asyncio.shield(asyncio.to_thread(self._abort_quietly, plan, token))
            raise
        await asyncio.to_thread(self._after, plan, token, response, stored)
        return response


# -- helpers the plugins share ------------------------------------------------------------------------


def stored_response(status: int, reason: str, headers: Any, body: bytes) -> StoredResponse:
    """A response as stored: ``headers`` (pairs) without those of :data:`NOT_STORED`."""
    kept = tuple((str(k), str(v)) for k, v in headers if str(k).lower() not in NOT_STORED)
    return StoredResponse(int(status), str(reason), kept, bytes(body))


_families: weakref.WeakKeyDictionary[Any, dict[tuple[str, float | None], Locks]] = weakref.WeakKeyDictionary()


def lock_family(registry: Any, name: str, lease: float | None) -> Locks:
    """The key locks of family ``name`` of ``registry`` (a :class:`ylock.registry.Registry`):
    the family itself, or (``lease`` given) one like it with that lease, built once."""
    if lease is None:
        return registry.locks(name)  # type: ignore[no-any-return]
    built = _families.setdefault(registry, {})
    family = built.get((name, lease))
    if family is None:
        o = registry.lock_options(name)
        family = built[(name, lease)] = Locks(registry.engine(o.engine), o.group, fair=o.fair, lease=lease,
                                              timeout=o.timeout, polling=o.polling)
    return family


def lease_of(registry: Any, options: Options) -> float:
    """The lease the key locks of ``options`` have."""
    return options.lease if options.lease is not None else float(registry.lock_options(options.lock).lease)


_engine_stores: weakref.WeakKeyDictionary[Engine, RecordStore] = weakref.WeakKeyDictionary()


def engine_store(engine: Engine) -> RecordStore:
    """The records on the lock engine's own server: Redis (every kind: a server, Sentinel,
    Cluster, the embedded one), or the in-process engine's memory. Raise ConfigurationError
    for an engine that has no place for them (ZooKeeper, PostgreSQL: use a cache)."""
    store = _engine_stores.get(engine)
    if store is not None and engine.scheme == "redis" and store.client is not engine.client:  # type: ignore[attr-defined]
        store = None                        # the engine made a new client (after fork, close): follow it
    if store is None:
        if engine.scheme == "redis":
            store = RedisRecords(engine.client, f"{engine.prefix}:idempotency:",  # type: ignore[attr-defined]
                                 label=f"engine {engine.url_for_display()}")
        elif engine.scheme == "local":
            store = LocalRecords(MemorySlots(), label="the in-process engine")
        else:
            raise ConfigurationError(
                f"the {engine.scheme} engine ({engine.url_for_display()}) cannot keep idempotency records",
                code=opt.E_IDEMPOTENCY, hint="give the lock family a Redis engine, or store the records in a "
                                             "Redis cache (CACHE / cache=)")
        _engine_stores[engine] = store
    return store
