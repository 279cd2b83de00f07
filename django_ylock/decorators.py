"""``@locked``: hold a distributed lock around a view; ``@limited``: at most N requests
per key in flight at once."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured

import ylock
from django_ylock.request_lock import RequestLock
from ylock import web
from ylock.engines.base import WRITE

F = TypeVar("F", bound=Callable[..., Any])


def locked(name: str, *, key: str | Callable[..., object] | None | bool = None, mode: str = WRITE,
           timeout: float | None = ylock.DEFAULT, on_commit: bool = False, using: str | None = None,
           status: int | None = None, retry_after: int | None = None,
           on_locked: Callable[..., Any] | str | None = None, anonymous: str = "session") -> Callable[[F], F]:
    """Hold lock ``name`` around the view.

    ``key`` picks one lock of the ``name`` family per request: a URL kwarg name
    (``key="account_id"``), a callable ``key(request, *args, **kwargs)``, ``None`` (the
    default: who sent the request, :func:`django_ylock.request_lock.user_key`: the
    authenticated user, else the ``Authorization`` credential, else the session it came
    with, never a new one; none of them: no lock; ``anonymous="skip"``: not the session)
    or ``False`` (the single named lock itself). ``mode`` is
    ``"write"`` or ``"read"`` (or a callable of the request). ``timeout``: seconds to wait
    (None: forever), default the lock's TIMEOUT setting, else 5. When the lock cannot be
    had in time the view is not called and the answer is 423 Locked with ``Retry-After``
    (``status``, ``retry_after`` or ``on_locked(request, exc)`` change that); when the
    engine is down, 503. With ``on_commit=True`` the view runs in
    ``transaction.atomic(using=using)`` and a write lock is released only once the
    transaction commits.

    The arguments are checked here, when the decorator is applied: a lock name that can
    never be valid is a :class:`~ylock.ConfigurationError` (a ``ValueError``) at import,
    not a 500 on every request. Works on sync and async function views, and on
    class-based views through ``method_decorator(locked(...), name="dispatch")``.
    """
    return _decorator(RequestLock(
        web.LockSpec(name, key=key, mode=mode, timeout=timeout, status=status, retry_after=retry_after,
                     anonymous=anonymous),
        on_commit=on_commit, using=using, on_locked=on_locked))


def limited(name: str, permits: int | None = None, *, key: str | Callable[..., object] | None | bool = None,
            timeout: float | None = 0, status: int | None = None, retry_after: int | None = None,
            anonymous: str = "session") -> Callable[[F], F]:
    """Let at most ``permits`` requests per key run the view at once; answer the others 429
    Too Many Requests with ``Retry-After``.

    Each key has a semaphore of the ``name`` family (shared by every process and machine on
    the engine): ``key`` is a URL kwarg name, a callable ``key(request, *args, **kwargs)``,
    ``None`` (the default: who sent the request, as for :func:`locked`; a request that
    nothing identifies is not limited) or ``False`` (one semaphore for the whole view).
    ``permits``: default the PERMITS of ``name`` in ``YLOCK["LOCKS"]`` (one of the two is
    needed). ``timeout``: seconds to wait for a permit (default 0: answer at once; None:
    forever). ``status``/``retry_after`` replace 429 and the Retry-After seconds (default:
    the RETRY_AFTER setting, else the timeout, at least 1). An unreachable engine answers
    503. The permit is given back however the view ends (it returns, raises, or an async
    view is cancelled because its client went away). Checked here, when applied: sync and
    async views, class-based views through ``method_decorator``.
    """
    return _decorator(RequestLock(web.LimitSpec(name, permits=permits, key=key, timeout=timeout, status=status,
                                                retry_after=retry_after, anonymous=anonymous)))


def _is_async(view: Callable[..., Any]) -> bool:
    """Whether ``view`` returns a coroutine: an async function, or the ``dispatch`` of a
    class-based view whose handlers are async. ``method_decorator(locked(...),
    name="dispatch")`` hands the decorator the view's own ``dispatch()``, a sync method
    that returns the handler's coroutine: wrapped as a sync view, the lock would be released
    before the handler ran."""
    if inspect.iscoroutinefunction(view) or iscoroutinefunction(view):
        return True
    instance = getattr(getattr(view, "func", view), "__self__", None)     # partial(bound dispatch)
    try:
        return getattr(type(instance), "view_is_async", False) is True
    except ImproperlyConfigured:        # a view with sync and async handlers: Django refuses it itself
        return False


def _decorator(request_lock: RequestLock) -> Callable[[F], F]:
    def decorate(view: F) -> F:
        if _is_async(view):
            @functools.wraps(view)
            async def async_view(request: Any, *args: Any, **kwargs: Any) -> Any:
                return await request_lock.arun(request, args, kwargs, lambda: view(request, *args, **kwargs))
            return async_view  # type: ignore[return-value]

        @functools.wraps(view)
        def sync_view(request: Any, *args: Any, **kwargs: Any) -> Any:
            return request_lock.run(request, args, kwargs, lambda: view(request, *args, **kwargs))
        return sync_view  # type: ignore[return-value]
    return decorate
