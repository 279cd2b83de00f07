"""The MySQL engine on a Django database's connection settings: ``django://ALIAS`` when
``DATABASES[ALIAS]`` is MySQL or MariaDB (``django.db.backends.mysql``).

::

    YLOCK = {"ENGINES": {"default": {"URL": "django://default"}}}
    YLOCK = {"ENGINES": {"default": {"URL": "django://default?max_connections=20"}}}

The engine reads the alias's ``NAME``, ``USER``, ``PASSWORD``, ``HOST`` (a path: a unix
socket), ``PORT`` and, from ``OPTIONS``, ``ssl`` (``ca``, ``cert``, ``key``) and
``unix_socket``; the query string takes the options of :class:`ylock.engines.mysql.MySQLEngine`
and the driver's, which win. It opens **its own connections** with them (PyMySQL): a lock is
never taken on the connection that serves the request (it would outlive the request in a
persistent connection, and the request's transactions would share its session).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django_ylock.databases import FromAlias, database_settings
from ylock.engines.mysql import MySQLEngine


def database_url(alias: str) -> tuple[str, dict[str, Any]]:
    """The MySQL engine's URL for ``DATABASES[alias]`` (no connection is made) and the driver
    options its ``OPTIONS`` give (TLS, unix socket)."""
    db = database_settings(alias)
    host, driver = str(db.get("HOST") or "localhost"), {}
    options = dict(db.get("OPTIONS") or {})
    if host.startswith("/"):
        driver["unix_socket"], host = host, "localhost"
    if options.get("unix_socket"):
        driver["unix_socket"] = str(options["unix_socket"])
    for key in ("ca", "cert", "key"):
        value = (options.get("ssl") or {}).get(key)
        if value:
            driver[f"ssl_{key}"] = str(value)
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}{':' + password if password else ''}@" if user else ""
    port = int(db.get("PORT") or 3306)
    return f"mysql://{auth}{host}:{port}/{quote(str(db.get('NAME') or ''), safe='')}", driver


class DjangoMySQLEngine(FromAlias, MySQLEngine):
    """:class:`~ylock.engines.mysql.MySQLEngine` on a ``DATABASES`` alias (see the module docstring)."""

    def __init__(self, alias: str = "default", **options: Any) -> None:
        self.alias = alias
        url, driver = database_url(alias)
        super().__init__(url, **{**driver, **options})
        self.url = f"django://{alias} ({self.target.display()})"
