"""The PostgreSQL engine on a Django database's connection settings: ``django://ALIAS``.

::

    YLOCK = {"ENGINES": {"default": {"URL": "django://default"}}}            # DATABASES["default"]
    YLOCK = {"ENGINES": {"default": {"URL": "django://default?scope=transaction&max_connections=20"}}}

``ALIAS`` names an entry of ``settings.DATABASES`` whose backend is PostgreSQL (Django's
``postgresql`` or PostGIS backend); the query string takes the options of
:class:`ylock.engines.postgres.PostgresEngine` (``scope``, ``max_connections``...) and libpq
parameters, which win over the alias's. The engine reads the alias's settings the way
Django's backend does (``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT``, and the libpq
parameters in ``OPTIONS``: ``sslmode``, ``service``, ``passfile``...) and opens **its own
connections** with them: a lock is never taken on the connection that serves the request
(a session lock there would outlive the request in a pooled connection, and the request's
transaction would have to stay open for the whole hold).

``@locked(..., on_commit=True)`` works with this engine as with any: the view runs in
``transaction.atomic()`` and its write lock is released once that transaction has
committed (or at the end of the request, after a rollback). With ``?scope=transaction``
the hold is itself a transaction on the engine's lock connection, ended by that release
(``COMMIT``); that is the scope to use when ``DATABASES`` points at pgbouncer in
transaction mode (``DISABLE_SERVER_SIDE_CURSORS``, which Django's documentation asks for
there, is taken as a sign of it by :meth:`DjangoDatabaseEngine.detect_pooler`).
"""
from __future__ import annotations

from typing import Any

from psycopg import pq
from psycopg.conninfo import make_conninfo

from django_ylock.databases import POSTGRES_BACKENDS, FromAlias, database_settings
from ylock import options as opt
from ylock.engines.postgres import PostgresEngine
from ylock.errors import ConfigurationError


def database_conninfo(alias: str) -> str:
    """The libpq connection string of ``DATABASES[alias]`` (no connection is made); raise
    ConfigurationError if there is no such alias or it is not PostgreSQL."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    backend = database_settings(alias).get("ENGINE", "")
    if backend not in POSTGRES_BACKENDS:
        raise ConfigurationError(f"django://{alias}: DATABASES[{alias!r}] is {backend!r}, not PostgreSQL",
                                 code=opt.E_ENGINE_URL, hint=f"ENGINE must be one of {', '.join(POSTGRES_BACKENDS)}")
    try:
        params = connections[alias].get_connection_params()
    except (ImproperlyConfigured, ImportError) as exc:
        raise ConfigurationError(f"django://{alias}: {exc}", code=opt.E_ENGINE_URL) from exc
    # Django's params also carry psycopg's own (cursor_factory, context, prepare_threshold...):
    # the engine speaks libpq, so it keeps what libpq knows.
    known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
    return make_conninfo("", **{k: str(v) for k, v in params.items() if k in known and v is not None})


class DjangoDatabaseEngine(FromAlias, PostgresEngine):
    """:class:`~ylock.engines.postgres.PostgresEngine` on a ``DATABASES`` alias (see the
    module docstring)."""

    def __init__(self, alias: str = "default", **options: Any) -> None:
        self.alias = alias
        super().__init__(database_conninfo(alias), **options)
        self._display = f"django://{alias} ({self._display})"

    def detect_pooler(self) -> str | None:
        """:meth:`PostgresEngine.detect_pooler`, and one more sign: the alias sets
        ``DISABLE_SERVER_SIDE_CURSORS``, as Django asks of a pgbouncer in transaction mode."""
        from django.conf import settings

        found = super().detect_pooler()
        if found is None and self.scope == "session" and self.pooler != "session" \
                and settings.DATABASES.get(self.alias, {}).get("DISABLE_SERVER_SIDE_CURSORS"):
            found = (f"DATABASES[{self.alias!r}] sets DISABLE_SERVER_SIDE_CURSORS, as Django asks for pgbouncer in "
                     "transaction mode, where session advisory locks break: use "
                     f"django://{self.alias}?scope=transaction (or ?pooler=session if the pooler keeps sessions)")
        return found

