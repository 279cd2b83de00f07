"""The Flask extension: ``YLock(app)`` or ``ylock.init_app(app)`` in an app factory.

Per-app state lives in ``app.extensions["ylock"]`` (a :class:`State`), never on the
extension object, so one ``YLock()`` serves several apps in a process, each with its own
engines and named locks. The view decorator and the per-user request hooks share one
implementation (:meth:`YLock._enter` / :meth:`YLock._exit`).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, has_app_context, request, session

import ylock
import ylock.metrics
from flask_ylock import signals
from flask_ylock.config import make_registry, settings_from_app, user_lock_settings
from ylock import events, report
from ylock.engines.base import READ, WRITE
from ylock.owner import run_as, task_owner

logger = logging.getLogger("flask_ylock")

F = TypeVar("F", bound=Callable[..., Any])
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_DEFAULT: Any = object()


class State:
    """One app's ylock state: its registry of engines and locks, metrics and hook settings."""

    def __init__(self, app: Flask) -> None:
        # Validate everything before starting anything (exporters are process-wide).
        self.settings = settings_from_app(app)
        self.registry = make_registry(self.settings)
        self.registry.validate()
        self.user_lock = user_lock_settings(app)
        self.retry_after = app.config.get("YLOCK_RETRY_AFTER")
        if self.retry_after is not None and (isinstance(self.retry_after, bool)
                                             or not isinstance(self.retry_after, int) or self.retry_after < 0):
            raise ylock.ConfigurationError(f"YLOCK_RETRY_AFTER must be a number of seconds >= 0, "
                                           f"got {self.retry_after!r}")
        ylock.metrics.validate(self.settings["METRICS"], setting="YLOCK_METRICS")
        self.metrics = ylock.metrics.configure(self.settings["METRICS"], setting="YLOCK_METRICS")


class YLock:
    """Distributed read-write locks for a Flask app (see the package docstring)."""

    def __init__(self, app: Flask | None = None) -> None:
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read ``app.config``, build the app's registry, wire metrics, hooks, signals and the CLI."""
        if "ylock" in app.extensions:
            raise RuntimeError(f"ylock is already initialised on app {app.name!r}; call init_app once per app")
        state = State(app)
        app.extensions["ylock"] = state
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
        from flask_ylock.cli import ylock_cli
        app.cli.add_command(ylock_cli)

    # -- state --------------------------------------------------------------------------

    @staticmethod
    def state(app: Flask | None = None) -> State:
        """Return the ylock state of ``app`` (default: the current app); raise an actionable error if none."""
        if app is None:
            if not has_app_context():
                raise RuntimeError("flask_ylock needs an application context: call this inside a request, "
                                   "a CLI command or `with app.app_context():`")
            app = current_app._get_current_object()  # type: ignore[attr-defined]
        try:
            return app.extensions["ylock"]  # type: ignore[no-any-return]
        except KeyError:
            raise RuntimeError(f"ylock is not initialised on app {app.name!r}: did you forget to call "
                               "`ylock.init_app(app)` (or `YLock(app)`)?") from None

    def lock(self, name: str) -> ylock.Lock:
        """Return the named :class:`ylock.Lock` of the current app (``YLOCK_LOCKS[name]``, or defaults)."""
        return self.state().registry.lock(name)

    def locks(self, name: str) -> ylock.Locks:
        """Return the named :class:`ylock.Locks` family of the current app."""
        return self.state().registry.locks(name)

    def engine(self, alias: str = "default") -> ylock.Engine:
        """Return the current app's engine ``alias``."""
        return self.state().registry.engine(alias)

    # -- the view decorator -------------------------------------------------------------

    def locked(self, name: str, key: str | Callable[..., object] | None = None, mode: str = WRITE,
               timeout: float | None = _DEFAULT) -> Callable[[F], F]:
        """Hold a lock of family ``name`` around every call of a view.

        ``key`` picks the lock in the family: the name of a URL variable (``"account_id"``),
        a callable taking the view's keyword arguments, or None for the current user
        (Flask-Login's, else one per session). ``mode``: ``"write"`` or ``"read"``;
        ``timeout``: seconds to wait (default: the lock's, else 0: fail at once). A lock
        that cannot be had in time answers 423 with ``Retry-After``; an engine that cannot
        be reached answers 503. Works on sync and async views.
        """
        if mode not in (WRITE, READ):
            raise ValueError(f"mode must be 'write' or 'read', got {mode!r}")
        if not (key is None or isinstance(key, str) or callable(key)):
            raise ValueError(f"key must be a URL variable name, a callable or None, got {key!r}")

        def decorate(view: F) -> F:
            if inspect.iscoroutinefunction(view):
                @functools.wraps(view)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    target, wait = self._target(name, key, kwargs, timeout)
                    # As in the core, the asyncio task is the owner; the blocking calls run
                    # in worker threads on its behalf.
                    owner = task_owner()
                    refused = await asyncio.to_thread(run_as, owner, self._enter, target, mode, wait)
                    if refused is not None:
                        return refused
                    try:
                        return await view(*args, **kwargs)
                    finally:
                        await asyncio.to_thread(run_as, owner, self._exit, target, mode)
                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(view)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                target, wait = self._target(name, key, kwargs, timeout)
                refused = self._enter(target, mode, wait)
                if refused is not None:
                    return refused
                try:
                    return view(*args, **kwargs)
                finally:
                    self._exit(target, mode)
            return wrapper  # type: ignore[return-value]
        return decorate

    def _target(self, name: str, key: Any, view_kwargs: dict[str, Any], timeout: Any) -> tuple[ylock.Lock, float]:
        family = self.locks(name)
        if key is None:
            lock_name = current_user_key()
        elif isinstance(key, str):
            if key not in view_kwargs:
                raise LookupError(f"@locked({name!r}, key={key!r}): the view has no URL variable {key!r} "
                                  f"(it has {sorted(view_kwargs)})")
            lock_name = str(view_kwargs[key])
        else:
            lock_name = str(key(**view_kwargs))
        if timeout is _DEFAULT:
            timeout = family.timeout if family.timeout is not None else 0.0
        return family[lock_name], timeout

    # -- shared by the decorator and the hooks ------------------------------------------------

    def _enter(self, lock: ylock.Lock, mode: str, timeout: float | None) -> Response | None:
        """Acquire ``lock`` in ``mode``; return None, or the 423/503 response to answer instead."""
        try:
            ok = lock.try_lock(timeout) if mode == WRITE else lock.try_rlock(timeout)  # type: ignore[arg-type]
        except ylock.EngineUnavailable as exc:
            logger.warning("ylock engine unavailable for %s/%s: %s", lock.group, lock.name, exc)
            return _answer(503, report.unavailable(lock.group, lock.name, str(exc)))
        if ok:
            return None
        retry_after = self.state().retry_after
        if retry_after is None:
            retry_after = max(1, math.ceil(timeout or 0))
        return _answer(423, report.busy(lock.group, lock.name, mode, int(retry_after)))

    def _exit(self, lock: ylock.Lock, mode: str) -> None:
        """Release ``lock``; a lost lease is logged (and signalled), never turned into an error page."""
        try:
            lock.unlock() if mode == WRITE else lock.runlock()
        except ylock.LockLost as exc:
            logger.error("ylock: %s", exc)
        except ylock.EngineUnavailable as exc:
            logger.error("ylock: could not release %s/%s (its lease will expire): %s", lock.group, lock.name, exc)

    # -- per-user locking around requests ---------------------------------------------------

    def _before_request(self) -> Response | None:
        state = self.state()
        conf = state.user_lock
        if conf is None:
            return None
        path = request.path
        if not any(path.startswith(p) for p in conf["PATHS"]) or any(path.startswith(p) for p in conf["EXCLUDE"]):
            return None
        if state.metrics.prometheus_path and path == state.metrics.prometheus_path:
            return None
        lock = state.registry.locks(conf["LOCK"])[current_user_key()]
        mode = READ if request.method in SAFE_METHODS else WRITE
        refused = self._enter(lock, mode, conf["TIMEOUT"])
        if refused is None:
            g._ylock_user_hold = (lock, mode)
        return refused

    def _teardown_request(self, exc: BaseException | None) -> None:
        held = g.pop("_ylock_user_hold", None)
        if held is not None:
            self._exit(*held)


def current_user_key() -> str:
    """Return the lock name of the current user: ``user:<id>`` for a Flask-Login user,
    else ``session:<random id>`` kept in the session, else ``addr:<client address>``."""
    try:
        from flask_login import current_user
    except ImportError:
        current_user = None
    if current_user is not None and hasattr(current_app, "login_manager"):
        if getattr(current_user, "is_authenticated", False):
            return f"user:{current_user.get_id()}"
    try:
        sid = session.get("_ylock_id")
        if sid is None:
            sid = session["_ylock_id"] = uuid.uuid4().hex
        return f"session:{sid}"
    except RuntimeError:  # no SECRET_KEY: Flask's null session cannot store anything
        return f"addr:{request.remote_addr}"


def _answer(status: int, body: dict[str, Any]) -> Response:
    """A refusal as both plugins send it: a JSON body from :mod:`ylock.report`, ``Retry-After``."""
    return Response(json.dumps(body), status=status, mimetype="application/json",
                    headers={"Retry-After": str(body["retry_after"])})
