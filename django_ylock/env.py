"""Read engine URLs from the environment with django-environ, for use in settings.py
(this module imports nothing of Django, so settings.py may import it)::

    from django_ylock.env import engine_config
    YLOCK = {"ENGINES": {"default": engine_config("YLOCK_URL", default="redis://127.0.0.1:6379/0")}}
"""
from __future__ import annotations

from typing import Any

import environ


def engine_config(var: str = "YLOCK_URL", default: str | None = None, **options: Any) -> dict[str, Any]:
    """Return ``{"URL": ..., "OPTIONS": ...}`` for an engine whose URL is in ``$var`` (like
    django-environ's ``env.cache_url()`` for ``CACHES``)."""
    url = environ.Env().str(var, default=default)
    config: dict[str, Any] = {"URL": url}
    if options:
        config["OPTIONS"] = options
    return config


def url_from_env(var: str = "YLOCK_URL") -> str | None:
    """Return ``$var`` if it is set (and not empty), else None."""
    value = environ.Env().str(var, default="")
    return value or None
