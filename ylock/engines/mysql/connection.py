"""One lock connection of the MySQL engine: where it goes (the URL, checked once when the
engine is built), how it is opened (PyMySQL's handshake, authentication and TLS, bounded by
one deadline), what the server is (flavour, version, read-only), and what the connection
carries while it serves a hold."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from pymysql.connections import Connection as _PyMySQLConnection

from ylock import options as opt
from ylock.engines.base import parse_bool
from ylock.engines.mysql.wire import IO, NoAnswer, Wire
from ylock.engines.sessions.connection import Hold, SessionConn, keepalive_timing
from ylock.errors import ConfigurationError

__all__ = ["DRIVER_OPTIONS", "Conn", "Hold", "Server", "Target", "check_version", "driver_error", "handshake",
           "keepalive_timing", "parse_target", "parse_version", "read_only_error"]

#: The driver options a URL may carry besides ylock's (PyMySQL's names): TLS and the socket.
DRIVER_OPTIONS: dict[str, Any] = {"ssl_ca": str, "ssl_cert": str, "ssl_key": str, "ssl_key_password": str,
                                  "ssl_verify_cert": parse_bool, "ssl_verify_identity": parse_bool,
                                  "ssl_disabled": parse_bool, "unix_socket": str}

_CLIENT_MULTI_STATEMENTS = 1 << 16


@dataclass(frozen=True)
class Target:
    """Where the engine connects, and as whom (the password never shows in ``repr``)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    driver: dict[str, Any] = field(default_factory=dict)
    scheme: str = "mysql"

    def display(self) -> str:
        """The URL without its password."""
        where = self.driver.get("unix_socket") or f"{self.host}:{self.port}"
        return f"{self.scheme}://{self.user}{'@' if self.user else ''}{where}/{self.database}"


def parse_target(url: str, driver: dict[str, str], ours: tuple[str, ...]) -> Target:
    """Return the :class:`Target` of ``mysql://[user[:password]@]host[:port]/database`` with the
    driver options ``driver`` (TLS, unix socket); ``ours``: the engine's own option names, for
    the error about an option that is neither."""
    unknown = sorted(set(driver) - set(DRIVER_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown MySQL engine option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                                 code=opt.E_ENGINE_URL,
                                 hint=f"ylock's: {', '.join(sorted(ours))}; the driver's: "
                                      f"{', '.join(sorted(DRIVER_OPTIONS))}")
    try:
        parts = urlsplit(url)
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigurationError(f"invalid MySQL URL: {exc}", code=opt.E_ENGINE_URL) from None
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigurationError("a MySQL engine URL names its database: mysql://user:password@host:3306/DATABASE "
                                 "(the engine keeps its tables there)", code=opt.E_ENGINE_URL)
    options: dict[str, Any] = {}
    for key, raw in driver.items():
        try:
            options[key] = DRIVER_OPTIONS[key](raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise ConfigurationError(f"MySQL engine option {key}={raw!r} is invalid: {exc}",
                                     code=opt.E_ENGINE_URL) from None
    scheme = parts.scheme.lower() if parts.scheme.lower() in ("mysql", "mariadb") else "mysql"
    return Target(parts.hostname or "localhost", port, unquote(parts.username or ""),
                  unquote(parts.password or ""), database, options, scheme)


class Server(NamedTuple):
    """What the server said about itself when a connection opened."""

    id: int                 # CONNECTION_ID() of the session
    version: str
    mariadb: bool
    read_only: bool
    client: str             # the client's host:port as the server sees it


class Conn(SessionConn):
    """One lock connection: its socket and what it carries (one owner's holds of one lock
    or semaphore, or nothing while pooled)."""

    __slots__ = ("wire", "server", "local_port", "lk", "kx", "mark", "lease_set")

    def __init__(self, wire: Wire, server: Server, local_port: int | None) -> None:
        super().__init__()
        self.wire = wire
        self.server = server
        self.local_port = local_port
        self.lk = ""                          # the hold's key in the holds table
        self.kx = ""                          # the lock's (or semaphore queue's) GET_LOCK name
        self.mark = ""                        # the hold's own GET_LOCK name (its liveness)
        self.lease_set = False                # wait_timeout is the lease (reset when pooled)

    @property
    def id(self) -> int:
        return self.server.id

    def close(self) -> None:
        self.broken = True
        self.wire.close(quit=self.pending is None)

    def stale(self) -> bool:
        return self.wire.stale()

    def heartbeat(self) -> IO[Any]:
        """``COM_PING``: it resets the session's idle timer (``wait_timeout``: the lease) and
        proves the session alive."""
        return self.wire.ping()

    def unbind(self) -> None:
        super().unbind()
        self.lk, self.kx, self.mark = "", "", ""

    def reusable(self) -> bool:
        return not self.broken and self.pending is None and not self.lease_set


_CONTEXTS: dict[tuple[tuple[str, str], ...], Any] = {}
_CONTEXTS_LOCK = threading.Lock()


class _DeadlineConnection(_PyMySQLConnection):  # type: ignore[misc]
    """PyMySQL's connection with every socket wait of its handshake bounded by one deadline
    (PyMySQL's own timeouts are per read: a server that trickles could stretch them)."""

    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        self._deadline = deadline
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        # One TLS context per set of options for the process: PyMySQL makes one per connection,
        # and loading the system's CA bundle costs ~0.1 s of CPU with the GIL held (ten threads
        # opening connections at once took 2 s each).
        if not isinstance(sslp, dict):
            return super()._create_ssl_ctx(sslp)
        key = tuple(sorted((k, repr(v)) for k, v in sslp.items()))
        with _CONTEXTS_LOCK:
            context = _CONTEXTS.get(key)
            if context is None:
                context = _CONTEXTS[key] = super()._create_ssl_ctx(sslp)
        return context

    @property
    def _read_timeout(self) -> float:
        return max(0.001, self._deadline - time.monotonic())

    @_read_timeout.setter
    def _read_timeout(self, value: Any) -> None:
        pass

    @property
    def _write_timeout(self) -> float:
        return max(0.001, self._deadline - time.monotonic())

    @_write_timeout.setter
    def _write_timeout(self, value: Any) -> None:
        pass


def driver_error(exc: BaseException) -> tuple[int, str, bool] | None:
    """(errno, message, whether it is the caller's mistake: a ProgrammingError) of a PyMySQL
    error, or None for anything else. By class name, not identity: Django's MySQL backend run
    on PyMySQL (``pymysql.install_as_MySQLdb()``) imports PyMySQL's modules a second time as
    ``MySQLdb.*``, and a connection may then raise the other copy's classes."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "MySQLError" not in names:
        return None
    args = exc.args
    if args and isinstance(args[0], int):
        return args[0], str(args[1]) if len(args) > 1 else str(exc), "ProgrammingError" in names
    return 0, str(exc), "ProgrammingError" in names


def handshake(target: Target, end: float, keepalive: float) -> tuple[Wire, int | None]:
    """Open a connection (TCP or unix socket, TLS if asked, authentication: PyMySQL's), all
    within ``end`` (monotonic); return its socket as a :class:`Wire`, and our local port."""
    left = end - time.monotonic()
    if left <= 0:
        raise NoAnswer(f"no time left to connect within {end - time.monotonic() + left:.3g} s (connect_timeout)")
    kwargs: dict[str, Any] = {k: v for k, v in target.driver.items() if k != "unix_socket"}
    try:
        conn = _DeadlineConnection(host=target.host, port=target.port, user=target.user,
                                   password=target.password.encode(),  # UTF-8, as the server hashed it
                                   database=target.database, unix_socket=target.driver.get("unix_socket"),
                                   charset="utf8mb4", autocommit=True, client_flag=_CLIENT_MULTI_STATEMENTS,
                                   connect_timeout=min(left, 31536000), program_name="ylock", deadline=end,
                                   **kwargs)
    except Exception as exc:
        found = driver_error(exc)
        if found is not None and found[0] == 2013 and time.monotonic() >= end - 0.002:
            raise NoAnswer(f"no answer to the connection's handshake within {left:.3g} s (connect_timeout)") from exc
        raise
    sock: socket.socket = conn._sock
    local_port = None
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        idle, interval = keepalive_timing(keepalive)
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(keepalive * 1000))
        local_port = int(sock.getsockname()[1])
    # The socket is ours from here on: PyMySQL's reader lets go of it (nothing is buffered:
    # the server sent nothing after the answer to SET NAMES).
    rfile, conn._rfile, conn._sock = conn._rfile, None, None
    rfile.close()
    return Wire(sock), local_port


def parse_version(text: str) -> tuple[bool, tuple[int, ...]]:
    """Return (whether it is MariaDB, the version numbers) of ``VERSION()``'s answer."""
    numbers = []
    for part in text.split("-", 1)[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    return "mariadb" in text.lower(), tuple(numbers)


def check_version(version: str, where: str) -> bool:
    """Return whether the server is MariaDB; raise ConfigurationError for a version the engine
    does not support (MariaDB before 10.6, MySQL before 8.0)."""
    mariadb, numbers = parse_version(version)
    if (mariadb and numbers < (10, 6)) or (not mariadb and numbers < (8, 0)):
        raise ConfigurationError(f"the server at {where} is {version}; ylock needs MySQL 8.0 or later, or MariaDB 10.6 "
                                 "or later (multiple GET_LOCK per session, RELEASE_ALL_LOCKS, a persistent "
                                 "AUTO_INCREMENT for the fencing tokens)", code=opt.E_ENGINE_URL)
    return mariadb


def read_only_error(where: str, group: str | None = None, name: str | None = None) -> ConfigurationError:
    return ConfigurationError(f"the server at {where} is read-only (read_only: a replica?): the MySQL engine writes "
                              "its holds and fencing tokens, and GET_LOCK locks are the server's own, not shared "
                              "with its primary", code=opt.E_ENGINE_URL,
                              hint="point the engine at the primary", group=group, name=name)


