"""The Flask extension: ``YLock(app)`` or ``ylock.init_app(app)`` in an app factory.

Per-app state lives in ``app.extensions["ylock"]`` (a :class:`State`), never on the
extension object, so one ``YLock()`` serves several apps in a process, each with its own
engines and named locks. What a locked request does is :mod:`ylock.web`'s (shared with
Django); this module translates Flask's request, user, session and config into it.

The request is the owner: the per-user hook and the view's decorators take their locks
as one owner id kept in ``g``, so they re-enter instead of waiting for each other,
whether the view is sync or async. Every hold taken for a request says what it is doing:
its method and path (:func:`ylock.web.request_context`). While the view runs,
:func:`current_lock` returns what the request holds (for its fencing token).
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, has_app_context, request, session

import ylock
import ylock.idempotency
import ylock.metrics
from flask_ylock import idempotency, signals
from flask_ylock.cache import get_or_set as cache_get_or_set
from flask_ylock.cli import ylock_cli
from flask_ylock.config import check_cache
from flask_ylock.state import State, state
from ylock import clients, events, web
from ylock.engines.base import PERMIT, WRITE
from ylock.owner import new_owner, owner_scope

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class YLock:
    """Distributed read-write locks for a Flask app (see the package docstring)."""

    def __init__(self, app: Flask | None = None) -> None:
        # What the @limited views of this extension ask of the settings, checked by init_app
        # (declarations, not per-app state: they hold no engine and no lock).
        self._limited: list[web.LimitSpec] = []
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read ``app.config``, build the app's registry, wire metrics, hooks, signals and the CLI."""
        if "ylock" in app.extensions:
            raise RuntimeError(f"ylock is already initialised on app {app.name!r}; call init_app once per app")
        state = State(app)
        for spec in self._limited:
            spec.check(state.registry)          # its errors name the app.config keys (the registry's names)
        app.extensions["ylock"] = state
        # Labels by an unbounded lock name take a metrics server down: say so at startup.
        keyed = ylock.metrics.keyed_groups(state.registry, state.web)
        for found in ylock.metrics.unbounded(state.settings["METRICS"], keyed, setting="YLOCK_METRICS"):
            warnings.warn(f"{found.problem} ({found.hint})", ylock.metrics.UnboundedLabelsWarning, stacklevel=2)
        events.subscribe(signals.relay)
        app.before_request(self._before_request)
        app.teardown_request(self._teardown_request)
        path = state.metrics.prometheus_path
        if path and state.metrics.prometheus is not None:
            exporter = state.metrics.prometheus

            def metrics_view() -> Response:
                body, content_type = exporter.expose()
                return Response(body, content_type=content_type)

            app.add_url_rule(path, "ylock_metrics", metrics_view)
        app.cli.add_command(ylock_cli)

    # -- state --------------------------------------------------------------------------

    @staticmethod
    def state(app: Flask | None = None) -> State:
        """Return the ylock state of ``app`` (default: the current app); raise an actionable error if none."""
        return state(app)

    def lock(self, name: str) -> ylock.Lock:
        """Return the named :class:`ylock.Lock` of the current app (``YLOCK_LOCKS[name]``, or defaults)."""
        return state().registry.lock(name)

    def locks(self, name: str) -> ylock.Locks:
        """Return the named :class:`ylock.Locks` family of the current app."""
        return state().registry.locks(name)

    def semaphore(self, name: str, permits: int | None = None) -> ylock.Semaphore:
        """Return the named :class:`ylock.Semaphore` of the current app (``YLOCK_LOCKS[name]``:
        its GROUP and NAME, and its PERMITS unless ``permits`` is given)."""
        return state().registry.semaphore(name, permits)

    def semaphores(self, name: str, permits: int | None = None) -> ylock.Semaphores:
        """Return the named :class:`ylock.Semaphores` family of the current app (one semaphore
        per key, each with ``permits``, else the PERMITS of ``YLOCK_LOCKS[name]``)."""
        return state().registry.semaphores(name, permits)

    def engine(self, alias: str = "default") -> ylock.Engine:
        """Return the current app's engine ``alias``."""
        return state().registry.engine(alias)

    def get_or_set(self, cache: Any, key: str, compute: Callable[[], Any], timeout: int | None = None,
                   lock_timeout: float | None = 10.0, *, lock: str = "cache", on_timeout: str = "compute") -> Any:
        """Return ``key`` from ``cache`` (a Flask-Caching ``Cache``), computing it once
        deployment-wide on a miss: see :func:`flask_ylock.cache.get_or_set`."""
        return cache_get_or_set(cache, key, compute, timeout, lock_timeout, lock=lock, on_timeout=on_timeout)

    @staticmethod
    def current_lock(name: str | None = None) -> ylock.Lock | ylock.Semaphore:
        """Return the lock the current request holds while its view runs: see
        :func:`flask_ylock.current_lock`."""
        return current_lock(name)

    # -- the view decorator -------------------------------------------------------------

    def locked(self, name: str, key: str | Callable[..., object] | None | bool = None, mode: str = WRITE,
               timeout: float | None = ylock.DEFAULT, status: int | None = None,
               retry_after: int | None = None, anonymous: str = "session") -> Callable[[F], F]:
        """Hold a lock of family ``name`` around every call of a view.

        ``key`` picks the lock in the family: the name of a URL variable (``"account_id"``),
        a callable taking the view's keyword arguments, None for who sent the request
        (:func:`current_user_key`: Flask-Login's user, else the ``Authorization`` credential,
        else a server-side session; none of them: no lock; ``anonymous="skip"``: not the
        session) or False (the named lock itself). ``mode``: ``"write"`` or ``"read"``;
        ``timeout``: seconds to wait (None: forever), default the lock's TIMEOUT, else 5.
        A lock that cannot be had in time answers 423 with ``Retry-After``; an engine that
        cannot be reached answers 503. Works on sync and async views. The arguments are
        checked here, when the decorator is applied.
        """
        view_spec = web.LockSpec(name, key=key, mode=mode, timeout=timeout, status=status,
                                 retry_after=retry_after, anonymous=anonymous)
        if key is not False:
            web.check_family_name(name)
        return functools.partial(_decorate, view_spec)

    def limited(self, name: str, permits: int | None = None, key: str | Callable[..., object] | None | bool = None,
                timeout: float | None = 0, status: int | None = None, retry_after: int | None = None,
                anonymous: str = "session") -> Callable[[F], F]:
        """Let at most ``permits`` requests per key run a view at once; answer the others 429
        Too Many Requests with ``Retry-After``.

        Each key has a semaphore of the ``name`` family, shared by every process and machine
        on the engine. ``key`` as for :meth:`locked`: a URL variable name, a callable taking
        the view's keyword arguments, None for the current user (the default) or False (one
        semaphore for the whole view). ``permits``: default the PERMITS of
        ``YLOCK_LOCKS[name]`` (``init_app`` raises if neither says). ``timeout``: seconds to
        wait for a permit (default 0: answer at once; None: forever). ``status`` and
        ``retry_after`` replace 429 and the Retry-After seconds (default: YLOCK_RETRY_AFTER,
        else the timeout, at least 1). An unreachable engine answers 503. The permit is
        given back however the view ends. Works on sync and async views.
        """
        view_spec = web.LimitSpec(name, permits=permits, key=key, timeout=timeout, status=status,
                                  retry_after=retry_after, anonymous=anonymous)
        if key is not False:
            web.check_family_name(name)
        self._limited.append(view_spec)
        if has_app_context() and "ylock" in current_app.extensions:
            view_spec.check(state().registry)       # decorated after init_app: check now
        return functools.partial(_decorate, view_spec)

    def idempotent(self, header: Any = ylock.DEFAULT, *, required: Any = ylock.DEFAULT, ttl: Any = ylock.DEFAULT,
                   scope: Any = ylock.DEFAULT, timeout: Any = ylock.DEFAULT, lease: Any = ylock.DEFAULT,
                   cache: Any = ylock.DEFAULT, lock: Any = ylock.DEFAULT) -> Callable[[F], F]:
        """Run a view at most once per idempotency key: a retried POST, PUT, PATCH or DELETE
        with the same ``Idempotency-Key`` header gets the first response replayed (see
        :mod:`ylock.idempotency` for every answer: 400, 409, 422, the replay with
        ``Idempotent-Replayed: true``, 503; a 5xx or an exception is not stored).

        The arguments are Django's ``@idempotent``'s (unset ones take ``YLOCK_IDEMPOTENCY``'s
        values); ``scope`` is ``"user"`` (Flask-Login's user, else the session), ``"global"``
        or a callable taking the view's keyword arguments; ``cache`` is ``"auto"`` (the
        default: the app's Flask-Caching cache when it has one, else the lock engine's
        server), None (the lock engine's server) or a Flask-Caching ``Cache``. Checked here,
        when applied; works on sync and async views and with no arguments at all."""
        if callable(header):            # @ylock.idempotent without parentheses
            return self.idempotent()(header)  # type: ignore[no-any-return]
        given = ylock.idempotency.check_given(
            {"header": header, "required": required, "ttl": ttl, "scope": scope, "timeout": timeout, "lease": lease,
             "cache": cache, "lock": lock}, check_cache=check_cache)
        return idempotency.Idempotent(given, request_owner, _held, current_user_key, answer).decorate

    # -- per-user locking around requests ---------------------------------------------------

    def _before_request(self) -> Response | None:
        st = state()
        conf = st.web.user_lock
        if conf is None or st.user_locks is None or not conf.covers(request.path):
            return None
        if st.metrics.prometheus_path and request.path == st.metrics.prometheus_path:
            return None
        view_spec = st.user_locks[conf.mode(request.method)]
        target, mode, wait = _target(view_spec, {})
        if target is None:
            return None
        hold = _hold(target, mode, wait, view_spec)
        with ylock.context(web.request_context(request.method, request.path)):
            refusal = hold.enter()
        if refusal is not None:
            return _answer_for(refusal)
        g._ylock_user_hold = hold           # left in _teardown_request, however the request ends
        _held().push(view_spec.name, target)
        return None

    def _teardown_request(self, exc: BaseException | None) -> None:
        hold: web.RequestHold | None = g.pop("_ylock_user_hold", None)
        if hold is not None:
            _held().pop(hold.lock)
            hold.leave()


def _held() -> web.Held:
    held: web.Held | None = g.get("_ylock_held")
    if held is None:
        held = g._ylock_held = web.Held()
    return held


def current_lock(name: str | None = None) -> ylock.Lock | ylock.Semaphore:
    """Return the lock (or, under ``@limited``, the semaphore) that the current request
    holds while its view runs: the innermost of its ``@locked``/``@limited`` decorators and
    the per-user lock, or the one of family ``name`` (the name given to the decorator, or
    ``YLOCK_USER_LOCK["LOCK"]``). Raise LookupError when the request holds none (or none of
    ``name``).

    The view runs as the request's owner, so ``current_lock().token`` is the fencing token
    of the request's hold, to pass to :func:`ylock.sqlalchemy.fenced_update` (or pass the
    lock itself). Works in sync and async views, whatever the decorator's key."""
    return _held().find(name)


def request_owner() -> str:
    """Return the owner id of the current request (kept in ``g``)."""
    owner: str | None = g.get("_ylock_owner")
    if owner is None:
        owner = g._ylock_owner = new_owner()
    return owner


def current_user_key(anonymous: str = "session") -> str | None:
    """Return the lock name of who sent the current request (:func:`ylock.clients.identify`):
    ``user-<id>`` for a Flask-Login user (also one its ``request_loader`` found by a token),
    else ``client-<hmac>`` of what ``YLOCK_CLIENT_KEY`` finds (default: the ``Authorization``
    header), else (unless ``anonymous`` is "skip") ``session-<hmac>`` of the server-side
    session the request came with; None (no lock) when nothing identifies it. Never writes
    the session: a cookie-less request gets no ``Set-Cookie``."""
    try:
        from flask_login import current_user
    except ImportError:
        current_user = None
    user_id = None
    if current_user is not None and hasattr(current_app, "login_manager"):
        if getattr(current_user, "is_authenticated", False):
            user_id = current_user.get_id()
    key = state().web.client_key
    return clients.identify(user_id=user_id, client=None if key is None else lambda: key(request),
                            visitor=None if anonymous == "skip" else _existing_visitor,
                            secret=current_app.secret_key)


def _existing_visitor() -> str | None:
    """The id of the session the request came with, read without writing it: the visitor id
    an earlier release kept there, else a server-side session's id (Flask-Session's ``sid``).
    Flask's own cookie sessions have no id: their visitors are keyed by a credential only."""
    if current_app.session_interface.get_cookie_name(current_app) not in request.cookies:
        return None
    visitor = session.get(clients.SESSION_KEY) or getattr(session, "sid", None)
    return str(visitor) if visitor else None


def _decorate(spec: web.RequestSpec, view: F) -> F:
    """Wrap ``view`` (sync or async) to hold what ``spec`` asks for around each call."""
    if inspect.iscoroutinefunction(view):
        @functools.wraps(view)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with ylock.context(web.request_context(request.method, request.path)):
                target, held_mode, wait = _target(spec, kwargs)
                if target is None:
                    return await view(*args, **kwargs)
                with owner_scope(request_owner()):      # the view's own lock calls too
                    async with _hold(target, held_mode, wait, spec) as hold:
                        if hold.refusal is not None:
                            return _answer_for(hold.refusal)
                        with _held().holding(spec.name, target):
                            return await view(*args, **kwargs)
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with ylock.context(web.request_context(request.method, request.path)):
            target, held_mode, wait = _target(spec, kwargs)
            if target is None:
                return view(*args, **kwargs)
            with owner_scope(request_owner()), _hold(target, held_mode, wait, spec) as hold:
                if hold.refusal is not None:
                    return _answer_for(hold.refusal)
                with _held().holding(spec.name, target):
                    return view(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _target(spec: web.RequestSpec, view_kwargs: dict[str, Any]) -> tuple[web.Target | None, str, float | None]:
    registry = state().registry
    name = spec.key_value(view_kwargs, lambda: spec.key(**view_kwargs),  # type: ignore[operator]
                          lambda: current_user_key(spec.anonymous))
    if name is None:
        return None, WRITE, None
    return spec.target(registry, name), spec.mode_for(request), spec.timeout_for(registry)


def _custom(st: State, mode: str) -> bool:
    """Whether YLOCK_ON_LOCKED answers a busy lock (never a refused permit: always 429)."""
    return st.web.on_locked is not None and mode != PERMIT


def _hold(lock: web.Target, mode: str, timeout: float | None, spec: web.RequestSpec) -> web.RequestHold:
    """The request's hold, as :mod:`ylock.web` takes it for both plugins."""
    st = state()
    return web.RequestHold(lock, mode, timeout, st.web, retry=spec.retry_after, status=spec.status,
                           custom=_custom(st, mode), owner=request_owner())


def _answer_for(outcome: web.Refusal | ylock.LockTimeout) -> Response:
    if isinstance(outcome, ylock.LockTimeout):
        return state().web.on_locked(outcome)  # type: ignore[misc, no-any-return]
    return answer(outcome)


def answer(refusal: web.Refusal) -> Response:
    """A refusal as both plugins send it: status and reason, JSON body, Retry-After."""
    response = Response(json.dumps(refusal.body), mimetype="application/json", headers=refusal.headers)
    response.status = f"{refusal.status} {refusal.reason}"
    return response
