"""The one implementation behind ``@locked`` and ``PerUserLockMiddleware`` (as Django's
``cache_page`` is built from ``CacheMiddleware``): pick a lock for a request, hold it
around the view, answer 423 (with ``Retry-After``) when it is busy and 503 when the
engine is down, release in ``finally``.

The request is the owner: every lock taken for one request (by the middleware and by
decorators) belongs to one owner id kept on the request, so they re-enter instead of
deadlocking, whichever thread (WSGI, ASGI's thread pool) runs each part.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

import ylock
from django_ylock import conf
from django_ylock import registry as reg
from ylock import report
from ylock.keys import MAX_NAME_LENGTH, check_name
from ylock.owner import _scoped, new_owner, run_as

logger = logging.getLogger("django_ylock")

READ, WRITE = "read", "write"
_pending = threading.local()  # releases deferred to on_commit, for the request_finished safety net


def request_owner(request: HttpRequest) -> str:
    """Return the owner id of this request (created on first use)."""
    owner = getattr(request, "_ylock_owner", None)
    if owner is None:
        owner = new_owner()
        request._ylock_owner = owner  # type: ignore[attr-defined]
    return owner  # type: ignore[no-any-return]


def key_for_name(value: object) -> str:
    """Turn a key value (a user pk, a URL kwarg) into a valid lock name."""
    name = quote(str(value), safe="")   # '/', '{', '}' and control characters get escaped
    if len(name) > MAX_NAME_LENGTH:
        import hashlib

        name = "sha1-" + hashlib.sha1(name.encode()).hexdigest()
    return check_name(name)


def user_key(request: HttpRequest, anonymous: str = "session") -> str | None:
    """Return the default key: the authenticated user's pk, else the session key (created
    if needed), else None (no lock) when ``anonymous`` is "skip"."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user-{user.pk}"
    if anonymous == "skip":
        return None
    session = getattr(request, "session", None)
    if session is None:
        return None
    if not session.session_key:
        session.save()
    return f"session-{session.session_key}"


class RequestLock:
    """Which lock a request takes, in which mode, for how long, and what to answer when
    it cannot (see ``django_ylock.locked`` for the parameters)."""

    def __init__(self, name: str, *, key: str | Callable[..., object] | None | bool = None,
                 mode: str | Callable[[HttpRequest], str] = WRITE, timeout: float | None = ylock.lock.DEFAULT,
                 on_commit: bool = False, using: str | None = None, status: int | None = None,
                 retry_after: int | None = None, on_locked: Callable[..., HttpResponse] | str | None = None,
                 anonymous: str = "session") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"@locked needs a lock name, got {name!r}")
        if not callable(mode) and mode not in (READ, WRITE):
            raise ValueError(f"@locked mode must be 'read' or 'write', got {mode!r}")
        if anonymous not in ("session", "skip"):
            raise ValueError(f"anonymous must be 'session' or 'skip', got {anonymous!r}")
        if key is not None and key is not False and not isinstance(key, str) and not callable(key):
            raise ValueError(f"@locked key must be a URL kwarg name, a callable or None, got {key!r}")
        self.name = name
        self.key = key
        self.mode = mode
        self.timeout = timeout
        self.on_commit = on_commit
        self.using = using
        self.status = status
        self.retry_after = retry_after
        self.on_locked = on_locked
        self.anonymous = anonymous

    # -- choosing ---------------------------------------------------------------------

    def lock_for(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ylock.Lock | None:
        """Return the lock this request takes, or None (an anonymous user, when skipped)."""
        if self.key is False:
            return reg.lock(self.name)
        if self.key is None:
            value: object = user_key(request, self.anonymous)
        elif isinstance(self.key, str):
            if self.key not in kwargs:
                raise ValueError(f"@locked({self.name!r}, key={self.key!r}): the view got no URL argument "
                                 f"{self.key!r} (it got {sorted(kwargs)})")
            value = kwargs[self.key]
        else:
            value = self.key(request, *args, **kwargs)
        if value is None:
            return None
        return reg.locks(self.name)[key_for_name(value)]

    def mode_for(self, request: HttpRequest) -> str:
        mode = self.mode(request) if callable(self.mode) else self.mode
        if mode not in (READ, WRITE):
            raise ValueError(f"@locked mode callable returned {mode!r}, not 'read' or 'write'")
        return mode

    # -- answering ----------------------------------------------------------------------

    def locked_response(self, request: HttpRequest, lock: ylock.Lock, exc: ylock.LockTimeout,
                        mode: str = WRITE) -> HttpResponse:
        on_locked = self.on_locked or conf.plugin_setting("ON_LOCKED")
        if isinstance(on_locked, str):
            module, _, attr = on_locked.rpartition(".")
            on_locked = getattr(importlib.import_module(module), attr)
        if on_locked is not None:
            return on_locked(request, exc)  # type: ignore[no-any-return, operator]
        timeout = lock.timeout if self.timeout is ylock.lock.DEFAULT else self.timeout
        retry = self.retry_after or conf.plugin_setting("RETRY_AFTER") or max(1, math.ceil(timeout or 1))
        status = self.status or conf.plugin_setting("LOCKED_STATUS")
        return _answer(status, report.busy(lock.group, lock.name, mode, int(retry)))

    @staticmethod
    def unavailable_response(lock: ylock.Lock, exc: Exception) -> HttpResponse:
        logger.error("ylock: engine unavailable for %s/%s: %s", lock.group, lock.name, exc)
        return _answer(503, report.unavailable(lock.group, lock.name, str(exc)))

    # -- holding ----------------------------------------------------------------------------

    def _acquire(self, lock: ylock.Lock, mode: str) -> None:
        if mode == WRITE:
            lock.lock(self.timeout)
        else:
            lock.rlock(self.timeout)

    def _release(self, lock: ylock.Lock, mode: str) -> None:
        try:
            lock.unlock() if mode == WRITE else lock.runlock()
        except ylock.LockLost as exc:
            logger.error("ylock: %s", exc)      # the view already ran: report, keep its response
        except ylock.EngineUnavailable as exc:
            logger.error("ylock: could not release %s/%s (its lease will expire): %s", lock.group, lock.name, exc)

    def _release_later(self, owner: str, lock: ylock.Lock, mode: str) -> None:
        """Release now, or when the surrounding transaction commits (on_commit=True)."""
        if not (self.on_commit and mode == WRITE and transaction.get_connection(self.using).in_atomic_block):
            run_as(owner, self._release, lock, mode)
            return
        done = threading.Event()

        def once() -> None:
            if not done.is_set():
                done.set()
                run_as(owner, self._release, lock, mode)
        transaction.on_commit(once, using=self.using)
        # A rollback drops on_commit callbacks: request_finished releases what is left.
        if not hasattr(_pending, "releases"):
            _pending.releases = []
        _pending.releases.append(once)

    def run(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
            call: Callable[[], HttpResponse]) -> HttpResponse:
        """Call ``call()`` holding the request's lock (sync views and middleware)."""
        lock = self.lock_for(request, args, kwargs)
        if lock is None:
            return call()
        mode, owner = self.mode_for(request), request_owner(request)
        try:
            run_as(owner, self._acquire, lock, mode)
        except ylock.LockTimeout as exc:
            return self.locked_response(request, lock, exc, mode)
        except ylock.EngineUnavailable as exc:
            return self.unavailable_response(lock, exc)
        def body() -> HttpResponse:
            # The view runs as the request's owner too: it may re-enter the lock, and
            # what it registers with on_commit runs while the lock is still held.
            if self.on_commit and mode == WRITE:
                with transaction.atomic(using=self.using):
                    return call()
            return call()
        try:
            response: HttpResponse = run_as(owner, body)  # type: ignore[assignment]
        finally:
            self._release_later(owner, lock, mode)
        return response

    async def arun(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
                   call: Callable[[], Awaitable[HttpResponse]]) -> HttpResponse:
        """Await ``call()`` holding the request's lock; the blocking lock calls run in a
        worker thread so the event loop keeps serving other requests."""
        lock = await asyncio.to_thread(self.lock_for, request, args, kwargs)  # may touch the session
        if lock is None:
            return await call()
        mode, owner = self.mode_for(request), request_owner(request)
        try:
            await asyncio.to_thread(run_as, owner, self._acquire, lock, mode)
        except ylock.LockTimeout as exc:
            return self.locked_response(request, lock, exc, mode)
        except ylock.EngineUnavailable as exc:
            return self.unavailable_response(lock, exc)
        token = _scoped.set(owner)   # the view's own lock calls act as the request's owner
        try:
            return await call()
        finally:
            _scoped.reset(token)
            await asyncio.to_thread(run_as, owner, self._release, lock, mode)


def release_pending(**kwargs: Any) -> None:
    """Release what on_commit never did because the transaction rolled back
    (connected to ``request_finished``)."""
    releases = getattr(_pending, "releases", None)
    if releases:
        _pending.releases = []
        for once in releases:
            once()


def _answer(status: int, body: dict[str, Any]) -> HttpResponse:
    """A refusal as both plugins send it: a JSON body from :mod:`ylock.report`, ``Retry-After``."""
    response = JsonResponse(body, status=status)
    response["Retry-After"] = str(body["retry_after"])
    return response
