"""``django://ALIAS``: a lock engine on the database that ``settings.DATABASES[ALIAS]`` names,
with connections of its own (never the request's).

::

    YLOCK = {"ENGINES": {"default": {"URL": "django://default"}}}

The alias's backend picks the engine: PostgreSQL (``django.db.backends.postgresql``, PostGIS)
builds :class:`django_ylock.database.DjangoDatabaseEngine` (the PostgreSQL engine, ``pip
install 'ylock[postgres]'``), MySQL or MariaDB (``django.db.backends.mysql``, its GIS twin)
builds :class:`django_ylock.mysql.DjangoMySQLEngine` (the MySQL engine, ``ylock[mysql]``).
The query string takes that engine's options, which win over the alias's.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ylock import options as opt
from ylock.engines.base import Engine, split_url_options
from ylock.errors import ConfigurationError

POSTGRES_BACKENDS = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")
MYSQL_BACKENDS = ("django.db.backends.mysql", "django.contrib.gis.db.backends.mysql")


def alias_of(url: str) -> str:
    """The alias of ``django://ALIAS[?options]``; ConfigurationError for anything else."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"invalid django:// URL {url!r}: {exc}", code=opt.E_ENGINE_URL) from exc
    if parts.scheme.lower() != "django" or parts.path not in ("", "/") or "@" in parts.netloc:
        raise ConfigurationError(f"a Django database engine's URL is django://ALIAS[?options], got {url!r}",
                                 code=opt.E_ENGINE_URL)
    return parts.netloc or "default"


def database_settings(alias: str) -> dict[str, Any]:
    """``settings.DATABASES[alias]``; ConfigurationError naming the alias if there is none."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    where = f"django://{alias}"
    try:
        databases = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise ConfigurationError(f"{where}: Django's settings are not configured ({exc})",
                                 code=opt.E_ENGINE_URL) from exc
    if alias not in databases:
        raise ConfigurationError(f"{where}: settings.DATABASES has no {alias!r}", code=opt.E_ENGINE_URL,
                                 hint=f"known: {', '.join(sorted(databases)) or 'none'}")
    return dict(databases[alias])


class FromAlias:
    """What the engines on a ``DATABASES`` alias share: built from ``django://ALIAS?options``
    (the options are the engine's own; keyword ``options`` win) by ``cls(alias, **options)``."""

    url_options: ClassVar[dict[str, Callable[[str], Any]]]

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Any:
        alias = alias_of(url)
        _, ours, rest = split_url_options(url, cls.url_options)
        return cls(alias, **{**rest, **ours, **options})  # type: ignore[call-arg]


class DjangoEngines:
    """What ``django://`` URLs are registered to: builds the engine of the alias's backend
    (this class is a factory, not an engine)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Engine:
        alias = alias_of(url)
        backend = database_settings(alias).get("ENGINE", "")
        if backend in MYSQL_BACKENDS:
            extra, module, name = "mysql", "django_ylock.mysql", "DjangoMySQLEngine"
        elif backend in POSTGRES_BACKENDS:
            extra, module, name = "postgres", "django_ylock.database", "DjangoDatabaseEngine"
        else:
            raise ConfigurationError(f"django://{alias}: DATABASES[{alias!r}] is {backend!r}, neither PostgreSQL nor "
                                     "MySQL/MariaDB", code=opt.E_ENGINE_URL,
                                     hint=f"ENGINE must be one of {', '.join(POSTGRES_BACKENDS + MYSQL_BACKENDS)}")
        import importlib

        try:
            engine_class = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ConfigurationError(f"django://{alias} on {backend} needs the {extra!r} extra (pip install "
                                     f"'ylock[{extra}]'): {exc}", code=opt.E_EXTRA) from exc
        return engine_class.from_url(url, **options)  # type: ignore[no-any-return]
