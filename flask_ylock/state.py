"""One Flask app's ylock state, kept in ``app.extensions["ylock"]`` (never on the extension
object, so one ``YLock()`` serves several apps), and :func:`state`, which finds it."""
from __future__ import annotations

from typing import Any

from flask import Flask, current_app, has_app_context

import ylock
import ylock.metrics
from flask_ylock.config import idempotency_settings, setting_name, settings_from_app, web_settings_from_app, where
from ylock.registry import TOP_KEYS, Registry


class State:
    """One app's ylock state: its registry of engines and locks, web settings and metrics."""

    def __init__(self, app: Flask) -> None:
        # Validate everything before starting anything (exporters are process-wide).
        self.settings = settings_from_app(app)
        self.registry = Registry(self.settings, where=lambda *path: setting_name(app, *path))
        self.registry.validate(known=TOP_KEYS)
        self.web = web_settings_from_app(app)
        self.secret = app.secret_key
        ylock.metrics.validate(self.settings["METRICS"], setting=where("METRICS"))
        self.metrics = ylock.metrics.configure(self.settings["METRICS"], setting=where("METRICS"))
        self.user_locks = None if self.web.user_lock is None else self.web.user_lock.specs()
        self.idempotency = idempotency_settings(app)      # YLOCK_IDEMPOTENCY: the defaults of @idempotent
        self.idempotency_stores: dict[int, Any] = {}       # the record stores built for its caches


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
