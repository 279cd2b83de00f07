"""The ZooKeeper engine's connection: one kazoo client and its session, what its state
means for the holds, and the one place kazoo's errors become ylock's."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import select
import threading
import time
import warnings
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback
from kazoo.retry import KazooRetry

from ylock import events
from ylock.engines.base import Engine, settle
from ylock.engines.zookeeper.guard import LOST, WAIT, QuorumGuard, observe_negotiation
from ylock.engines.zookeeper.handler import Handler
from ylock.engines.zookeeper.url import Settings
from ylock.errors import EngineUnavailable, LockError
from ylock.holds import HOLDS
from ylock.threads import quiet_signals

#: kazoo's own log records (every failed reconnection attempt) go to this logger, filtered.
KAZOO_LOGGER = "ylock.engines.zookeeper.kazoo"

#: kazoo errors that mean the server could not be reached (or answer) in time.
UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
               KazooTimeoutError)


class Session:
    """The kazoo client of one engine (started on first use, in the background) and the
    state of its connection and session.

    * The client: hosts, chroot and credentials from :class:`~ylock.engines.zookeeper.url.Settings`
      (connection options such as ACLs and TLS belong in :meth:`_make_client`); kazoo
      reconnects forever in the background, at most a second apart.
    * Its state (:meth:`_on_state`, kazoo's listener): connected or not; a suspended
      connection publishes ``suspended`` for every live hold, its return ``reconnected``;
      a lost session (expired or closed) marks every hold lost. What a connection state
      means for the holds is decided there, and only there.
    * The quorum guard (:mod:`ylock.engines.zookeeper.guard`): holds are marked lost once the
      quorum has been silent long enough that it may have expired the session
      (:meth:`_quorum_silent`), or at once on a suspension with ``suspended=lost``.
    * One hold lost (its node deleted): :meth:`report_lost`.
    * Errors: :meth:`translate` is the one place kazoo's errors become ylock's.
    """

    def __init__(self, engine: Engine, settings: Settings, *, on_connected: Callable[[], None],
                 on_lost: Callable[[], None], on_abandon: Callable[[], None],
                 has_holds: Callable[[], bool]) -> None:
        self.engine = engine
        self.settings = settings
        self.hosts = settings.hosts
        self._on_connected = on_connected       # the connection is (back) up
        self._on_lost = on_lost                 # the session is gone: mark the claims lost
        self._on_abandon = on_abandon           # the session may be gone: mark lost, delete our nodes
        self._has_holds = has_holds
        self.guard = self._new_guard()
        self._client: KazooClient | None = None
        self._mutex = threading.RLock()
        self.connected = threading.Event()
        self._tried = False                      # a first connection was waited for already
        self._connect_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.last_problem = ""                   # kazoo's last warning (a refused TLS handshake...)

    # -- the client ---------------------------------------------------------------------------

    @property
    def started(self) -> KazooClient | None:
        """Return the kazoo client if it was started and not closed since, else None."""
        return self._client

    def client(self) -> KazooClient:
        """Return the kazoo client, started (in the background) on first use."""
        client = self._client
        if client is None:
            with self._mutex:
                if self._client is None:
                    self._client = self._make_client()
                    self._client.add_listener(self._on_state)
                    with warnings.catch_warnings():
                        # kazoo warns when the chroot does not exist yet; creates make it.
                        warnings.filterwarnings("ignore", "No chroot path exists")
                        with quiet_signals():   # kazoo's threads leave signals to the application's
                            self._client.start_async()
                client = self._client
        return client

    def _make_client(self) -> KazooClient:
        """Build the kazoo client from the settings (not started)."""
        kazoo_logger = logging.getLogger(KAZOO_LOGGER)
        if not any(isinstance(f, _OncePerMinute) for f in kazoo_logger.filters):
            kazoo_logger.addFilter(_OncePerMinute())
        s = self.settings
        client = KazooClient(hosts=s.hosts, timeout=s.session_timeout, auth_data=s.auth_data(),
                             default_acl=s.default_acl(),     # every node ylock creates (creates pass no acl)
                             connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
                             logger=_LastProblem(kazoo_logger, self),
                             handler=Handler() if hasattr(select, "poll") else None,
                             **s.tls_options())
        if s.suspended != WAIT and not observe_negotiation(client, self.guard):
            logging.getLogger(__name__).warning(
                "ylock: this kazoo does not tell the negotiated session timeout; the ZooKeeper quorum "
                "guard assumes the requested %.3g s (a server that lowers it makes the guard late)",
                s.session_timeout)
        return client

    def _new_guard(self) -> QuorumGuard:
        s = self.settings
        return QuorumGuard(s.lost_after, s.session_timeout, client=lambda: self._client,
                           has_holds=self._has_holds, expired=self._quorum_silent, enabled=s.suspended != WAIT)

    def sendable(self) -> KazooClient:
        """Return the client if it is connected; raise EngineUnavailable if not."""
        client = self.client()
        if not client.connected:
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected ({client.state})")
        return client

    def close(self) -> None:
        """Stop and close the client; the next use starts a new one."""
        with self._mutex:
            client, self._client = self._client, None
            self.connected.clear()
            self._tried = False
            guard, self.guard = self.guard, self._new_guard()     # the next client gets a new one
        guard.stop()
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()

    # -- connection state ------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # Runs in kazoo's event thread: never block here.
        if state == KazooState.CONNECTED:
            self.connected.set()
            with self._mutex:
                waiters, self._connect_waiters = self._connect_waiters, []
            for loop, future in waiters:
                loop.call_soon_threadsafe(settle, future, None, None)
            self._on_connected()
        else:
            self.connected.clear()
        if state == KazooState.LOST:
            self._on_lost()
            HOLDS.mark_lost(self.engine, detail="ZooKeeper session lost (expired or closed)")
        elif state == KazooState.SUSPENDED and self.settings.suspended == LOST:
            # The strict mode: a suspended connection may be a partition; never wait to know.
            self._abandon("ZooKeeper connection suspended (suspended=lost)")
        else:
            # A suspended connection puts every hold at risk until it reconnects in time
            # (the session, and with it the holds, survive) or the session expires (LOST).
            kind = events.SUSPENDED if state == KazooState.SUSPENDED else events.RECONNECTED
            for h in HOLDS.holds(self.engine):
                if not h.lost:
                    events.publish(kind, h.group, h.name, self.engine.scheme, None, owner=h.owner, token=h.token,
                                   detail=f"ZooKeeper connection {'suspended' if state != 'CONNECTED' else 'back'}")

    def _why(self) -> str:
        return f" (last: {self.last_problem})" if self.last_problem and not self.connected.is_set() else ""

    def connect_wait(self, left: float | None, deadline: float | None) -> float:
        """Return how long a call may wait for a connection: the first call of the engine up
        to ``connect_timeout`` (a cold start), later ones only within their own deadline (the
        client reconnects in the background)."""
        first = not self._tried
        self._tried = True
        connect_timeout = self.settings.connect_timeout
        wait = connect_timeout if first else \
            (connect_timeout if deadline is None else max(0.0, deadline - time.monotonic()))
        return wait if left is None else min(wait, left)

    def wait_connected(self, timeout: float) -> None:
        """Start the client if need be and wait up to ``timeout`` seconds for its connection;
        raise EngineUnavailable if it is not up by then."""
        self.client()
        if not self.connected.wait(timeout):
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected after {timeout:.3g} s"
                                    f"{self._why()}")

    async def await_connected(self, timeout: float) -> None:
        """:meth:`wait_connected` for asyncio: the state listener resolves a future, so no
        thread waits."""
        self.client()
        if self.connected.is_set():
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._mutex:
            self._connect_waiters.append((loop, future))
        if self.connected.is_set():
            return
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected after {timeout:.3g} s"
                                    f"{self._why()}") \
                from None

    # -- loss and errors ---------------------------------------------------------------------------

    def _quorum_silent(self, silent_for: float, timeout: float) -> None:
        # The guard's thread: the quorum may expire the session from now on (see guard.py).
        self._abandon(f"ZooKeeper quorum not heard for {silent_for:.3g} s (session timeout {timeout:.3g} s): "
                      "the session may have expired and the lock been granted to another client")

    def _abandon(self, why: str) -> None:
        """Mark every hold of the session lost although the session may live on: its nodes
        are deleted once connected (see :meth:`LockKeeper.abandon_all`)."""
        self._on_abandon()
        HOLDS.mark_lost(self.engine, detail=why)

    def report_lost(self, group: str, name: str, owner: str, why: str) -> None:
        """Mark one hold lost in the hold table (which publishes ``lost``)."""
        report = functools.partial(HOLDS.mark_lost, self.engine, group, name, owner, detail=why)
        client = self._client
        if client is not None and client.handler.running:
            # The "lost" event's subscribers are anybody's code, and this may run in kazoo's
            # connection thread (see Handler): report it from the callback thread.
            client.handler.dispatch_callback(Callback("loss", report, ()))
        else:
            report()

    def translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a kazoo error: the one place this engine maps them."""
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, UNAVAILABLE):
            return EngineUnavailable(f"ZooKeeper at {self.hosts} is unavailable: {type(exc).__name__} {exc}",
                                     group=group, name=name)
        if isinstance(exc, NoAuthError):
            who = f"user {self.settings.auth.user!r}" if self.settings.auth else "a client without credentials"
            return LockError(f"ZooKeeper at {self.hosts} refused {who} (NoAuth): the lock's nodes were created "
                             "with other credentials, or an ACL that does not let this client change them",
                             group=group, name=name)
        if isinstance(exc, KazooException):
            return LockError(f"ZooKeeper at {self.hosts} failed: {type(exc).__name__} {exc}", group=group, name=name)
        return exc


class _LastProblem(logging.LoggerAdapter):  # type: ignore[type-arg]
    """kazoo's logger for one session: it also keeps kazoo's last warning on the session,
    so that "not connected" can say why (a TLS handshake refused, a connection refused)."""

    def __init__(self, logger: logging.Logger, session: Session) -> None:
        super().__init__(logger, {})
        self.session = session

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        if level >= logging.WARNING:
            try:
                self.session.last_problem = (str(msg) % args if args else str(msg))[:300]
            except (TypeError, ValueError):
                self.session.last_problem = str(msg)[:300]
        super().log(level, msg, *args, **kwargs)  # type: ignore[arg-type]


class _OncePerMinute(logging.Filter):
    """Let a repeated kazoo log message through once a minute: kazoo logs every failed
    reconnection attempt, many per second while a server is down."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:60]
        now = time.monotonic()
        if now - self._seen.get(key, -1e9) < 60:
            return False
        self._seen[key] = now
        if len(self._seen) > 1000:
            self._seen.clear()
        return True
