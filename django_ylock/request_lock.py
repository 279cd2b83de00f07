"""The one implementation behind ``@locked``, ``@limited`` and ``PerUserLockMiddleware`` (as
Django's ``cache_page`` is built from ``CacheMiddleware``). What a locked or limited request
does is :mod:`ylock.web`'s (shared with Flask); this module translates: Django's request,
user and session, its settings, ``JsonResponse`` answers, and the ``on_commit`` option.

Every hold taken while a request runs (its lock or permit, and the view's own lock calls)
says what it is doing: the request's method and path (:func:`ylock.web.request_context`).

The request is the owner: every lock taken for one request (by the middleware and by
decorators) belongs to one owner id kept on the request, so they re-enter instead of
deadlocking, whichever thread (WSGI, ASGI's thread pool) runs each part. While the view
runs, :func:`current_lock` returns what the request holds (for its fencing token).
"""
from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

import ylock
from django_ylock import conf
from ylock import clients, web
from ylock.engines.base import PERMIT, WRITE
from ylock.owner import new_owner, owner_scope, run_as

_pending = threading.local()  # releases deferred to on_commit, for the request_finished safety net


def request_owner(request: HttpRequest) -> str:
    """Return the owner id of this request (created on first use)."""
    owner = getattr(request, "_ylock_owner", None)
    if owner is None:
        owner = new_owner()
        request._ylock_owner = owner  # type: ignore[attr-defined]
    return owner  # type: ignore[no-any-return]


def _held(request: HttpRequest) -> web.Held:
    held: web.Held | None = getattr(request, "_ylock_held", None)
    if held is None:
        held = web.Held()
        request._ylock_held = held  # type: ignore[attr-defined]
    return held


def request_held(request: HttpRequest) -> web.Held:
    """Return what ``request`` holds now (kept on the request; :func:`current_lock` reads it)."""
    return _held(request)


def current_lock(request: HttpRequest, name: str | None = None) -> ylock.Lock | ylock.Semaphore:
    """Return the lock (or, under ``@limited``, the semaphore) that ``request`` holds while
    its view runs: the innermost of its ``@locked``/``@limited`` decorators and the per-user
    lock, or the one of family ``name`` (the name given to the decorator, or
    ``USER_LOCK["LOCK"]``). Raise LookupError when the request holds none (or none of
    ``name``).

    The view runs as the request's owner, so ``current_lock(request).token`` is the fencing
    token of the request's hold, to pass to :func:`django_ylock.fenced_update` (or pass the
    lock itself). Works in sync and async function views and in class-based views
    (``current_lock(self.request)``), whatever the decorator's key (a URL argument, a
    callable, the user)."""
    return _held(request).find(name)


def user_key(request: HttpRequest, anonymous: str = "session") -> str | None:
    """Return the lock name of who sent ``request`` (:func:`ylock.clients.identify`):
    ``user-<pk>`` when authenticated, else ``client-<hmac>`` of what ``YLOCK["CLIENT_KEY"]``
    finds (default: the ``Authorization`` header), else (unless ``anonymous`` is "skip")
    ``session-<hmac>`` of the session the request came with; None (no lock) when nothing
    identifies it. Never creates a session: a cookie-less request costs no database write."""
    user = getattr(request, "user", None)
    return _identify(request, user.pk if user is not None and getattr(user, "is_authenticated", False) else None,
                     anonymous, lambda: _existing_visitor(request))


async def auser_key(request: HttpRequest, anonymous: str = "session") -> str | None:
    """:func:`user_key` in an async view: the user and the session are read through Django's
    async API (``request.auser()``, ``session.aget()``; Django 5.0+), else in a thread."""
    session = getattr(request, "session", None)
    auser = getattr(request, "auser", None)
    if (session is not None and not hasattr(session, "aget")) or (hasattr(request, "user") and auser is None):
        from asgiref.sync import sync_to_async

        return await sync_to_async(user_key)(request, anonymous)
    user = await auser() if auser is not None else None
    user_id = user.pk if user is not None and getattr(user, "is_authenticated", False) else None
    key = conf.current().web.client_key
    if user_id is None and key is not None and clients.may_block(key):     # e.g. a token looked up in the database
        from asgiref.sync import sync_to_async

        credential = await sync_to_async(key)(request)
        name = clients.identify(user_id=None, client=lambda: credential, visitor=None, secret=settings.SECRET_KEY)
    else:
        name = _identify(request, user_id, anonymous, lambda: None)
    if name is not None or user_id is not None or anonymous == "skip" or not _has_session_cookie(request):
        return name
    visitor = await session.aget(clients.SESSION_KEY)
    if not visitor and not _signed_cookies(session):
        visitor = session.session_key       # after aget's load: None if the cookie names no live session
    return clients.session_name(visitor, settings.SECRET_KEY) if visitor else None


def _identify(request: HttpRequest, user_id: object | None, anonymous: str,
              visitor: Callable[[], str | None]) -> str | None:
    key = conf.current().web.client_key
    return clients.identify(user_id=user_id, client=None if key is None else lambda: key(request),
                            visitor=None if anonymous == "skip" else visitor, secret=settings.SECRET_KEY)


def _has_session_cookie(request: HttpRequest) -> bool:
    return getattr(request, "session", None) is not None and settings.SESSION_COOKIE_NAME in request.COOKIES


def _signed_cookies(session: Any) -> bool:
    """A signed-cookie session's key is its data: two visitors with the same data share it."""
    return type(session).__module__ == "django.contrib.sessions.backends.signed_cookies"


def _existing_visitor(request: HttpRequest) -> str | None:
    """The id of the session ``request`` came with, read without creating or saving one: the
    visitor id an earlier release kept there, else a server-side session's key (None when
    the cookie names no live session)."""
    if not _has_session_cookie(request):
        return None
    session = request.session
    visitor = session.get(clients.SESSION_KEY)
    if not visitor and not _signed_cookies(session):
        visitor = session.session_key
    return str(visitor) if visitor else None


def answer(refusal: web.Refusal) -> HttpResponse:
    """A refusal as both plugins send it: status and reason, JSON body, Retry-After."""
    response = JsonResponse(refusal.body, status=refusal.status, reason=refusal.reason)
    for header, value in refusal.headers.items():
        response[header] = value
    return response


def request_context(request: HttpRequest) -> str:
    """What the request's holds say it is doing: ``"POST /orders/7"`` (no query string)."""
    return web.request_context(request.method or "GET", request.path)


class RequestLock:
    """Which lock (or semaphore) a request takes, in which mode, for how long, and what to
    answer when it cannot (see ``django_ylock.locked`` and ``limited`` for the parameters):
    ``spec`` is a :class:`ylock.web.LockSpec` or :class:`ylock.web.LimitSpec`, checked
    against the settings here, when the decorator is applied."""

    def __init__(self, spec: web.RequestSpec, *, on_commit: bool = False, using: str | None = None,
                 on_locked: Callable[..., HttpResponse] | str | None = None) -> None:
        self.spec = spec
        registry = conf.current().registry
        if spec.key is not False and spec.name not in registry.locks_settings:
            web.check_family_name(spec.name)
        if isinstance(spec, web.LimitSpec):
            spec.check(registry)
        self.on_commit = on_commit
        self.using = using
        self.on_locked = None if on_locked is None else \
            ylock.options.importable(on_locked, "@locked on_locked", call=True)

    # -- choosing ---------------------------------------------------------------------

    def lock_for(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> web.Target | None:
        """Return the lock (or semaphore) this request takes, or None (an anonymous user,
        when skipped)."""
        name = self.spec.key_value(kwargs, lambda: self.spec.key(request, *args, **kwargs),  # type: ignore[operator]
                                   lambda: user_key(request, self.spec.anonymous))
        if name is None:
            return None
        return self.spec.target(conf.current().registry, name)

    # -- answering ----------------------------------------------------------------------

    def _on_locked(self, config: conf.Config, mode: str) -> Callable[..., HttpResponse] | None:
        """The handler answering instead of a 423 (a refused permit is always a 429)."""
        if mode == PERMIT:
            return None
        return self.on_locked or config.web.on_locked  # type: ignore[no-any-return]

    def _hold(self, request: HttpRequest, lock: web.Target, mode: str, owner: str, *,
              deferred: bool = True) -> web.RequestHold:
        """The request's hold, as :mod:`ylock.web` takes it for both plugins; ``deferred``:
        released when the surrounding transaction commits (``on_commit``), else at once."""
        config = conf.current()
        return web.RequestHold(lock, mode, self.spec.timeout_for(config.registry), config.web,
                               retry=self.spec.retry_after, status=self.spec.status,
                               custom=self._on_locked(config, mode) is not None, owner=owner,
                               release=(lambda: self._release_later(owner, lock, mode)) if deferred else None)

    def _refused(self, request: HttpRequest, refusal: web.Refusal | ylock.LockTimeout, mode: str) -> HttpResponse:
        if isinstance(refusal, ylock.LockTimeout):
            on_locked = self._on_locked(conf.current(), mode)
            return on_locked(request, refusal)  # type: ignore[no-any-return, misc]
        return answer(refusal)

    # -- holding ----------------------------------------------------------------------------

    def _release_later(self, owner: str, lock: web.Target, mode: str) -> None:
        """Release now, or when the surrounding transaction commits (on_commit=True)."""
        if not (self.on_commit and mode == WRITE and transaction.get_connection(self.using).in_atomic_block):
            run_as(owner, web.leave, lock, mode)
            return
        done = threading.Event()

        def once() -> None:
            if not done.is_set():
                done.set()
                run_as(owner, web.leave, lock, mode)
        transaction.on_commit(once, using=self.using)
        # A rollback drops on_commit callbacks: request_finished releases what is left.
        if not hasattr(_pending, "releases"):
            _pending.releases = []
        _pending.releases.append(once)

    def run(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
            call: Callable[[], HttpResponse]) -> HttpResponse:
        """Call ``call()`` holding the request's lock (sync views and middleware)."""
        with ylock.context(request_context(request)):
            return self._run(request, args, kwargs, call)

    def _run(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
             call: Callable[[], HttpResponse]) -> HttpResponse:
        lock = self.lock_for(request, args, kwargs)
        if lock is None:
            return call()
        mode, owner = self.spec.mode_for(request), request_owner(request)
        # The view runs as the request's owner too: it may re-enter the lock, and what it
        # registers with on_commit runs while the lock is still held.
        with owner_scope(owner), self._hold(request, lock, mode, owner) as hold:
            if hold.refusal is not None:
                return self._refused(request, hold.refusal, mode)
            with _held(request).holding(self.spec.name, lock):
                if self.on_commit and mode == WRITE:
                    with transaction.atomic(using=self.using):
                        return call()
                return call()

    async def arun(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
                   call: Callable[[], Awaitable[HttpResponse]]) -> HttpResponse:
        """Await ``call()`` holding the request's lock. Waiting costs no thread; if the
        request is cancelled (the client went away: Django cancels the view), the wait
        leaves the queue, or the lock is released, and nothing stays held."""
        with ylock.context(request_context(request)):
            return await self._arun(request, args, kwargs, call)

    async def _arun(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any],
                    call: Callable[[], Awaitable[HttpResponse]]) -> HttpResponse:
        lock = await self.alock_for(request, args, kwargs)
        if lock is None:
            return await call()
        mode, owner = self.spec.mode_for(request), request_owner(request)
        with owner_scope(owner):   # the view's own lock calls act as the request's owner
            # An async view's release is awaited at its end (on_commit is for sync views).
            async with self._hold(request, lock, mode, owner, deferred=False) as hold:
                if hold.refusal is not None:
                    return self._refused(request, hold.refusal, mode)
                with _held(request).holding(self.spec.name, lock):
                    return await call()

    async def alock_for(self, request: HttpRequest, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> web.Target | None:
        """:meth:`lock_for` in an async view: the user and the session are read through
        Django's async API (the database must not be touched from the loop)."""
        if self.spec.key is not None:
            return self.lock_for(request, args, kwargs)
        name = await auser_key(request, self.spec.anonymous)
        return None if name is None else self.spec.target(conf.current().registry, name)


def release_pending(**kwargs: Any) -> None:
    """Release what on_commit never did because the transaction rolled back
    (connected to ``request_finished``)."""
    releases = getattr(_pending, "releases", None)
    if releases:
        _pending.releases = []
        for once in releases:
            once()
