"""A per-user lock around each request (read for safe methods, write for the others), or a
per-user concurrency limit.

Enable with ``"django_ylock.middleware.PerUserLockMiddleware"`` in MIDDLEWARE (after
the session and authentication middleware) and ``YLOCK["USER_LOCK"]``::

    "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"], "EXCLUDE": ["/api/health"],
                  "TIMEOUT": 5, "ANONYMOUS": "session",   # or "skip"
                  "PERMITS": 1}                           # N > 1: up to N requests at once
    "CLIENT_KEY": None,     # who an API client is: default its Authorization header (hashed)

Requests of one user are serialised (reads shared); different users run in parallel. A
request is its logged-in user, else its client's credential (``CLIENT_KEY``), else the
session it came with (:mod:`ylock.clients`); the middleware never creates a session, and
a request that nothing identifies takes no lock.
With ``PERMITS`` N > 1, up to N requests of one user run at once (whatever their method),
and one more waits up to ``TIMEOUT`` for a place, then gets 429.
The settings are read once (again after a test changes them), not per request.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from django_ylock import conf
from django_ylock.request_lock import RequestLock


class PerUserLockMiddleware:
    """Take the user's lock of the ``USER_LOCK["LOCK"]`` family around each request."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        self._built: tuple[conf.Config, dict[str, RequestLock]] | None = None

    def request_lock(self, request: HttpRequest) -> RequestLock | None:
        """Return how to lock this request, or None if its path is not covered."""
        config = conf.current()
        settings = config.web.user_lock
        if settings is None or not settings.covers(request.path_info):
            return None
        built = self._built
        if built is None or built[0] is not config:     # built once per settings: one per mode
            built = self._built = (config, {mode: RequestLock(spec) for mode, spec in settings.specs().items()})
        return built[1][settings.mode(request.method or "GET")]

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        request_lock = self.request_lock(request)
        if request_lock is None:
            return self.get_response(request)
        return request_lock.run(request, (), {}, lambda: self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        request_lock = self.request_lock(request)
        if request_lock is None:
            return await self.get_response(request)  # type: ignore[no-any-return]
        return await request_lock.arun(request, (), {}, lambda: self.get_response(request))
