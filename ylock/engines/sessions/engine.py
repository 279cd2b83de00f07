"""The engine protocol of a session engine (:class:`SessionEngine`): the options both take,
the frame of error translation, running the steps blocking or awaited, renewals (one
heartbeat per hold's connection, all in one wait), tickets, inspection on a borrowed
connection, and the life cycle. An engine adds its URL, its wire's and server's errors,
and what it inspects and administers."""
from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ylock import options as opt
from ylock.engines.base import AcquireRequest, Engine, RenewItem, Steps, arun_steps, run_steps, split_url_options
from ylock.engines.nonblocking import NoAnswer
from ylock.engines.sessions.connection import Hold, SessionConn
from ylock.engines.sessions.executor import SessionExecutor
from ylock.engines.sessions.pool import Pool
from ylock.engines.sessions.steps import SessionSteps, kind_of
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.holds import HOLDS


class SessionEngine(Engine):
    """Locks and semaphores held in server sessions, one connection per owner and lock (see
    :mod:`ylock.engines.sessions`). A subclass builds its pool, executor and steps
    (:meth:`_make_state`), names its URL schemes (:attr:`url_schemes`) and translates its
    own errors (:meth:`_translate_server`)."""

    #: The server's name in messages ("PostgreSQL").
    server: ClassVar[str] = ""
    #: The URL schemes of the engine.
    url_schemes: ClassVar[tuple[str, ...]] = ()

    _pool: Pool[Any]
    _executor: SessionExecutor
    _steps: SessionSteps[Any]

    def _limits(self, *, max_connections: int, idle_connections: int, socket_timeout: float,
                connect_timeout: float, keepalive: float) -> None:
        """Check and set the options every session engine takes."""
        where = f"{self.server} engine option"
        code = opt.E_ENGINE_URL
        self.max_connections = opt.number(max_connections, f"{where} max_connections", minimum=1, maximum=10_000,
                                          integer=True, code=code)
        self.idle_connections = opt.number(idle_connections, f"{where} idle_connections", minimum=0,
                                           maximum=10_000, integer=True, code=code)
        self.socket_timeout = opt.seconds(socket_timeout, f"{where} socket_timeout", maximum=3600, code=code)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600, code=code)
        self.keepalive = opt.seconds(keepalive, f"{where} keepalive", minimum=1, maximum=86400, above=None,
                                     code=code)

    def _check_prefix(self, prefix: Any, longest: int) -> str:
        """Return ``prefix`` if it is a lower-case SQL name of at most ``longest`` characters."""
        if not isinstance(prefix, str) or not re.fullmatch(rf"[a-z][a-z0-9_]{{0,{longest - 1}}}", prefix):
            raise ConfigurationError(f"{self.server} engine option prefix must be a lower-case SQL name (letters, "
                                     f"digits, _; at most {longest}), got {prefix!r}", code=opt.E_ENGINE_URL)
        return prefix

    def _make_state(self) -> tuple[Pool[Any], SessionExecutor, SessionSteps[Any]]:
        """Return a new pool, executor and steps (no connection is open)."""
        raise NotImplementedError

    def _reset_state(self) -> None:
        """Start with no connections (a new engine, or a forked child's copy)."""
        self._pool, self._executor, self._steps = self._make_state()
        # The executors, as attributes: a test or a benchmark wraps them to count round trips.
        self._do: Callable[[Any], Any] = self._executor.do
        self._ado: Callable[[Any], Awaitable[Any]] = self._executor.ado

    @classmethod
    def check_scheme(cls, url: str) -> None:
        """Raise ConfigurationError if ``url`` is not one of this engine's (:attr:`url_schemes`);
        the message never repeats the URL, which may carry a password."""
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise ConfigurationError(f"invalid {cls.server} URL: {exc}", code=opt.E_ENGINE_URL) from None
        if scheme not in cls.url_schemes:
            raise ConfigurationError(f"not a {cls.server} URL ({' or '.join(s + '://' for s in cls.url_schemes)}), "
                                     f"got scheme {scheme!r}", code=opt.E_ENGINE_URL)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Any:
        """Build an engine from a URL: ylock's options are taken out of the query and parsed,
        the driver's stay (and are checked when the engine is built); keyword ``options`` win."""
        cls.check_scheme(url)
        base, ours, rest = split_url_options(url, cls.url_options)
        return cls(base, **{**rest, **ours, **options})  # type: ignore[call-arg]

    # -- errors: the one place they are translated ----------------------------------------------------

    def _translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a driver's or the server's error."""
        where = self.url_for_display()
        if isinstance(exc, ConfigurationError) and exc.name is None and name is not None:
            # Found while opening a connection (a proxy, the server's version): the
            # connection serves this lock, so the error names it too.
            named = ConfigurationError(exc.problem, code=exc.code, hint=exc.hint, group=group, name=name)
            named.__cause__ = exc.__cause__
            return named
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, NoAnswer):
            detail = str(exc) if "connect_timeout" in str(exc) else f"socket_timeout {self.socket_timeout:g} s"
            return EngineUnavailable(f"{self.server} at {where} did not answer within its timeout ({detail}); the "
                                     "connection was closed", group=group, name=name)
        return self._translate_server(exc, where, group, name)

    def _translate_server(self, exc: Exception, where: str, group: str | None, name: str | None) -> Exception:
        """Return the ylock error for an error of the wire, the driver or the server (``exc``
        itself if it is none of those)."""
        raise NotImplementedError

    def _run(self, steps: Steps, group: str | None = None, name: str | None = None) -> Any:
        return run_steps(steps, self._do, lambda exc: self._translate(exc, group, name))

    async def _arun(self, steps: Steps, group: str, name: str) -> Any:
        return await arun_steps(steps, self._ado, lambda exc: self._translate(exc, group, name))

    # -- holds --------------------------------------------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> int | None:
        return self._run(self._steps.acquire(request), request.group, request.name)  # type: ignore[no-any-return]

    async def aacquire(self, request: AcquireRequest) -> int | None:
        return await self._arun(self._steps.acquire(request), request.group,  # type: ignore[no-any-return]
                                request.name)

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        return self._run(self._steps.release(group, name, owner, mode), group, name)  # type: ignore[no-any-return]

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return await self._arun(self._steps.release(group, name, owner, mode),  # type: ignore[no-any-return]
                                group, name)

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        """Send one heartbeat on each hold's connection, all at once, and wait for them
        together (one round trip's time for any number of holds): it resets the session's
        idle timer (the lease) and proves the session alive."""
        holds = [(Hold(i.group, i.name, i.owner, kind_of(i.mode)), i.mode) for i in items]
        return self._pool.renew(holds, time.monotonic() + self.socket_timeout, self._executor.failed)

    #: A hold lives in its connection's server session: only this process can take it over.
    adopts_across_processes = False

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Hand the connection that carries ``old_owner``'s hold to ``new_owner``. A detached
        hold is not renewed: once its lease has passed, the server has ended its session and
        this returns False."""
        kind = kind_of(mode)
        conn = self._pool.take(Hold(group, name, old_owner, kind), mode, token)
        if conn is None:
            return False
        return self._run(self._steps.adopt(conn, Hold(group, name, new_owner, kind), token),  # type: ignore[no-any-return]
                         group, name)

    # -- inspection and administration (blocking; on a borrowed connection) ------------------------------

    def _checkout_wait(self) -> float:
        """How long an inspection waits for a connection of the pool."""
        return self.socket_timeout

    def _borrowed(self, payload: Any, group: str | None = None, name: str | None = None) -> tuple[Any, SessionConn]:
        """Send ``payload`` (what the engine's ``Query`` sends) on a connection of the pool;
        return its results and the connection (given back already)."""
        def steps() -> Steps:
            conn = yield from self._pool.checkout(time.monotonic() + self._checkout_wait())
            try:
                results = yield self._executor.Query(conn, payload, time.monotonic() + self.socket_timeout)
            finally:
                self._pool.checkin(conn)
            return results, conn
        return self._run(steps(), group, name)  # type: ignore[no-any-return]

    # -- life cycle ---------------------------------------------------------------------------------------

    def check_options(self) -> None:
        """Everything was checked when the engine was built."""

    def close(self) -> None:
        if self._pool.close():
            HOLDS.mark_lost(self, detail="the engine was closed: its lock connections with it")

    def _after_fork(self) -> None:
        # The parent's connections are not ours (closing them would say goodbye for it, and
        # psycopg does not close a PGconn collected in another process than its maker's):
        # forget them.
        self._reset_state()
