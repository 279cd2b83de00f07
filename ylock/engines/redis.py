"""RedisEngine: the seed's AQS-like fair read-write lock on Redis, in Lua.

URLs and connection options: :mod:`ylock.engines.redis_clients`. ylock's options (query
parameters or keyword arguments): ``prefix`` (key prefix, default ``ylock``),
``socket_timeout`` (seconds, default 2: the longest a frozen server can stall one call),
``connect_timeout`` (default 1), ``notify`` (default true: releases push the lock to the
next waiter; false: polling only), ``fence_retention`` (seconds a lock's token counter
outlives its last use, default 86400), ``wait_replicas`` (default 0: after acquiring,
``WAIT`` for that many replicas to acknowledge, else release and raise EngineUnavailable)
and ``wait_timeout`` (seconds for that WAIT, default 0.5), ``barge_window`` (non-fair
requests may barge past a head that has waited less than this, default 0.1).

Data model and algorithm: see ``lua/common.lua``. One script round trip acquires an
uncontended lock and one releases it; a release grants the lock to the next fair waiter
inside the script and pushes the token to that waiter's own list, on which it blocks,
so a handoff costs the waiter no further round trip. Polling (``ylock.Polling``) remains
the fallback and bounds the cost of a lost notification to one poll interval; a waiter
never sleeps past the holders' remaining lease. No pub/sub.

Connections: each engine makes at most ``max_connections`` per process (redis-py's option:
a query parameter of ``redis://`` and ``rediss://`` URLs, a keyword argument elsewhere;
redis-py 8's default is 100), and as many again in each event loop that uses it. The lock
path (acquire, release, a waiter's tries) takes all of them but a reserve (a quarter, at
most 8) that the watchdog's renewals, ``describe()`` and the statistics keep, so that a
renewal always finds one; each lock call holds a connection for one round trip, and one
that finds them all busy waits for one within its timeout. Waiters take at most half of
them: the first waiting threads (or greenlets) of a process each block on a connection of
their own (the quickest handoff), the others share one blocking pop, run by a thread of its
own while anybody waits; the waiting tasks of an event loop share one too. The pool thus
bounds the round trips in flight, not the waiters: 300 threads wait on the default pool.
A loop's connections close when it shuts down (see :meth:`RedisEngine._open_side`).

Guarantees: exclusion holds while the Redis primary that holds the keys keeps them.
Leases are Redis-time (PEXPIRE/TIME in scripts), renewed by the process watchdog; a
holder paused past its lease loses the lock (``lock.lost``, ``LockLost`` at release), so
protect resources with the fencing token. Asynchronous replication means a failover can
lose a recent acquisition; ``wait_replicas`` narrows that window, fencing closes it.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import socket
import threading
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from importlib import resources
from typing import Any

import redis.exceptions as rex

from ylock import events
from ylock import options as opt
from ylock.engines.base import (
    LOCK,
    PERMIT,
    READ,
    SEMAPHORE,
    WRITE,
    Abandon,
    AcquireRequest,
    Engine,
    LockInfo,
    RenewItem,
    Steps,
    arun_steps,
    holder_context,
    run_steps,
)
from ylock.engines.redis_clients import Clients, split_url
from ylock.engines.redis_direct import AsyncDirectCalls, DirectCalls, NotifyHub, ThreadNotifyHub
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.owner import check_fork

logger = logging.getLogger(__name__)


def _script(name: str) -> str:
    """Return a script's source: the keys of ``common.lua``, then the script with the
    helpers of ``common.lua`` spliced in at its ``--@common`` line and the queue machinery
    at its ``--@queue`` line (after its fast path, so a fast call never pays for defining
    what it does not use)."""
    lua = resources.files("ylock.engines").joinpath("lua")
    head, helpers = re.split(r"^--@functions.*$", lua.joinpath("common.lua").read_text(), maxsplit=1, flags=re.M)
    body = lua.joinpath(name).read_text()
    if not re.search(r"^--@common$", body, flags=re.M):
        body = "--@common\n" + body
    body = re.sub(r"^--@common$", lambda _: helpers, body, count=1, flags=re.M)
    body = re.sub(r"^--@queue$", lambda _: lua.joinpath("queue.lua").read_text(), body, count=1, flags=re.M)
    body = re.sub(r"^--@permits$", lambda _: lua.joinpath("permits.lua").read_text(), body, count=1, flags=re.M)
    return head + "\n" + body


# Script templates; each engine fills in its own constants (fewer arguments per call).
_SOURCES = {name: _script(f"{name}.lua") for name in ("acquire", "release", "renew", "describe", "force_release",
                                                     "sem_acquire", "sem_release", "adopt")}


class RedisEngine(Engine):
    """Redis engine (see module docstring)."""

    scheme = "redis"

    def __init__(self, url: str, *, prefix: str = "ylock", socket_timeout: float = 2.0,
                 connect_timeout: float = 1.0, notify: bool = True, fence_retention: float = 86400.0,
                 wait_replicas: int = 0, wait_timeout: float = 0.5, barge_window: float = 0.1,
                 renew_chunk: int = 2000, **client_options: Any) -> None:
        super().__init__()
        where = "Redis engine option"
        if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{} \n"):
            raise ConfigurationError(f"{where} prefix must be a non-empty string without braces or spaces, "
                                     f"got {prefix!r}", code=opt.E_ENGINE_URL)
        self.socket_timeout = opt.seconds(socket_timeout, f"{where} socket_timeout", maximum=3600,
                                          code=opt.E_ENGINE_URL)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600,
                                           code=opt.E_ENGINE_URL)
        retention = opt.seconds(fence_retention, f"{where} fence_retention", minimum=0.001, maximum=10 * 365 * 86400,
                                above=None, code=opt.E_ENGINE_URL)
        self.wait_replicas = opt.number(wait_replicas, f"{where} wait_replicas", minimum=0, maximum=100,
                                        integer=True, code=opt.E_ENGINE_URL)
        wait = opt.seconds(wait_timeout, f"{where} wait_timeout", maximum=3600, code=opt.E_ENGINE_URL)
        if self.wait_replicas and wait >= self.socket_timeout:
            raise ConfigurationError(f"{where} wait_timeout ({wait}) must be below socket_timeout "
                                     f"({self.socket_timeout}), or WAIT would look like a dead server",
                                     code=opt.E_ENGINE_URL)
        barge = opt.seconds(barge_window, f"{where} barge_window", minimum=0, maximum=3600, above=None,
                            code=opt.E_ENGINE_URL)
        self.clients = Clients(url, self.socket_timeout, self.connect_timeout, client_options)
        self.url = url
        self.kind = self.clients.kind
        self.prefix = prefix
        self.notify = opt.boolean(notify, f"{where} notify", code=opt.E_ENGINE_URL)
        self.fence_retention_ms = int(retention * 1000)
        self.wait_timeout_ms = int(wait * 1000)
        self.barge_window_ms = int(barge * 1000)
        self.renew_chunk = renew_chunk
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._call: Any = None     # DirectCalls, or the client's execute_command on Cluster
        self._hub: ThreadNotifyHub | None = None     # where threads wait for grants (not on Cluster)
        self._init_lock = threading.Lock()
        self._async: dict[asyncio.AbstractEventLoop, _AsyncSide] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisEngine:
        """Build an engine from a URL: ylock's query options are taken out (and parsed),
        redis-py's stay in the URL for its client; keyword ``options`` win."""
        clean, mine = split_url(url)
        return cls(clean, **{**mine, **options})

    def url_for_display(self) -> str:
        return self.clients.display_url()

    # -- connection ---------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client, built on first use (after fork, built anew)."""
        check_fork()
        client = self._client
        if client is None:
            with self._init_lock:
                if self._client is None:
                    client = self.clients.build()
                    # Scripts first, client last: another thread that sees the client
                    # must also see its scripts.
                    self._scripts = {name: client.register_script(self._fill(src)) for name, src in _SOURCES.items()}
                    pool = getattr(client, "connection_pool", None)
                    if pool is None:
                        self._call, self._hub = _cluster_call(client), None
                    else:
                        self._call = DirectCalls(pool)
                        self._hub = ThreadNotifyHub(self._call) if self.notify else None
                    self._client = client
                client = self._client
        return client

    def _fill(self, template: str) -> str:
        return (template.replace("__RETENTION_MS__", str(self.fence_retention_ms))
                .replace("__BARGE_MS__", str(self.barge_window_ms)))

    def check_options(self) -> None:
        if self._client is None:
            self.clients.check()

    def _after_fork(self) -> None:
        # The child must not use the parent's sockets; redis-py pools also check the pid,
        # but dropping the client is simpler and covers Sentinel and Cluster too.
        self._client = None
        self._call = None
        self._hub = None
        self._init_lock = threading.Lock()
        self._async = {}          # the parent's loops do not run here; their sockets are the parent's

    def close(self) -> None:
        client, self._client = self._client, None
        self._call = None
        self._hub = None          # its thread ends when the connections close under it
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        for loop in list(self._async):
            side = self._async.pop(loop, None)
            if side is not None:
                side.close_soon(loop)

    @contextlib.contextmanager
    def _errors(self, group: str | None = None, name: str | None = None) -> Iterator[None]:
        """Translate redis-py errors into ylock's (see :meth:`_translate`)."""
        try:
            yield
        except Exception as exc:
            raise self._translate(exc, group, name) from exc

    def _translate(self, exc: Exception, group: str | None, name: str | None) -> Exception:
        """Return the ylock error for a redis-py error: the one place this engine maps them.
        (The lock path calls it from a plain ``except``: a generator-based context manager
        costs microseconds per call.)"""
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, rex.AuthenticationError):
            return EngineUnavailable(f"Redis at {self.url_for_display()} refused the credentials: {exc}",
                                     group=group, name=name)
        if isinstance(exc, rex.InvalidResponse):
            return EngineUnavailable(f"the server at {self.url_for_display()} does not answer like Redis "
                                     f"(is the port right?): {exc}", group=group, name=name)
        if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, rex.BusyLoadingError, rex.ReadOnlyError,
                            rex.ClusterDownError, rex.TryAgainError, rex.MasterDownError, rex.RedisClusterException,
                            OSError)):
            return EngineUnavailable(f"Redis at {self.url_for_display()} is unavailable: {exc}",
                                     group=group, name=name)
        if isinstance(exc, rex.RedisError):
            if "CLUSTERDOWN" in str(exc) or "READONLY" in str(exc) or "MASTERDOWN" in str(exc):
                return EngineUnavailable(f"Redis at {self.url_for_display()} is unavailable: {exc}",
                                         group=group, name=name)
            return LockError(f"Redis at {self.url_for_display()} failed: {exc}", group=group, name=name)
        return exc

    def ping(self) -> None:
        with self._errors():
            self.client.ping()

    # -- keys ---------------------------------------------------------------------------

    def _base(self, group: str, name: str) -> str:
        return f"{self.prefix}:{{{group}:{name}}}"

    def _key(self, group: str, name: str, mode: str = WRITE) -> str:
        """The x key of a lock (a semaphore's for mode "permit"): every script takes it as
        KEYS[1] and derives the others from it."""
        if mode == PERMIT:
            return f"{self.prefix}:{{{group}:{name}}}:p:x"
        return f"{self.prefix}:{{{group}:{name}}}:x"

    # -- ownership ------------------------------------------------------------------------

    def _request(self, r: AcquireRequest) -> tuple[str, list[Any]]:
        """The acquire script's key and arguments for ``r`` (flags: fair, stay, queued; a
        semaphore's script takes its permit count in the mode's place)."""
        fair = "1" if r.fair else "0"
        return (self._key(r.group, r.name, r.mode),
                [r.owner, r.permits if r.mode == PERMIT else r.mode, fair + "10", int(r.lease * 1000),
                 int(r.polling.waiter_lease * 1000), r.context])

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        key, args = self._request(r)
        reply = None
        if not self.wait_replicas and (r.deadline is None or time.monotonic() < r.deadline):
            # The first try, on its own: an uncontended write comes back as a bare token.
            try:
                reply = self._run(_ACQUIRE[r.mode], key, args, self.socket_timeout)
            except Exception as exc:
                raise self._translate(exc, r.group, r.name) from exc
            if reply.__class__ is int:
                return reply
        try:
            return run_steps(self._acquire_steps(r, key, args, reply), self._do,  # type: ignore[no-any-return]
                             lambda exc: self._translate(exc, r.group, r.name))
        finally:
            hub = self._hub
            if hub is not None:
                hub.leave(_notify_key(key, r.owner))

    def _acquire_steps(self, r: AcquireRequest, key: str, args: list[Any], reply: Any) -> Steps:
        """The rest of an acquisition, after the first reply (None: not tried yet): queueing,
        waiting for a grant or a poll, trying again until the deadline. Every operation gets
        what is left of the call's budget, the deadline plus one socket timeout, so that the
        call ends by then whatever the server or the network does. Run by :func:`run_steps`
        (blocking) or :func:`arun_steps` (asyncio), which throws :class:`Abandon` in when the
        awaiting task is cancelled."""
        waiter_lease = r.polling.waiter_lease
        fair = args[2][0]
        intervals = r.polling.intervals()
        notify_key = _notify_key(key, r.owner)
        end = None if r.deadline is None else r.deadline + self.socket_timeout
        unreachable_since: float | None = None
        queued = False
        acked = 0
        try:
            while True:
                now = time.monotonic()
                last_try = r.deadline is not None and now >= r.deadline
                if reply is None:
                    left = self.socket_timeout if end is None else min(self.socket_timeout, end - now)
                    if left <= 0:          # no time for another try: a queue entry expires on its own
                        if queued:
                            return None
                        raise EngineUnavailable(f"Redis at {self.url_for_display()} did not answer in time",
                                                group=r.group, name=r.name)
                    args[2] = fair + ("0" if last_try else "1") + ("1" if queued else "0")
                    try:
                        reply, acked = yield ("acquire", _ACQUIRE[r.mode], key, args, left)
                        unreachable_since = None
                    except EngineUnavailable:
                        # Before we are queued, fail fast; once queued, ride out a blip until the
                        # waiter lease (our place in the queue) or the deadline is gone.
                        if unreachable_since is None:
                            unreachable_since = now
                        if not queued or last_try or now - unreachable_since >= waiter_lease:
                            raise
                        yield ("sleep", min(next(intervals), 0.1))
                        continue
                if reply.__class__ is int:
                    yield from self._confirm_steps(r, key, acked)
                    return int(reply)
                self._publish_evicted(r.group, r.name, reply[2:])
                if reply[0] == 1:
                    yield from self._confirm_steps(r, key, acked)
                    return int(reply[1])
                queued = True
                if last_try:
                    return None
                wait = min(next(intervals), max(0.001, int(reply[1]) / 1000))
                reply = None
                if r.deadline is not None:
                    wait = min(wait, r.deadline - time.monotonic())
                if wait <= 0:
                    continue
                if not self.notify:
                    yield ("sleep", wait)
                    continue
                # The pop blocks on the server for ``wait``; its socket waits one socket
                # timeout more, so a healthy wait is never taken for a dead server.
                try:
                    popped = yield ("pop", notify_key, wait, wait + self.socket_timeout)
                except EngineUnavailable:
                    continue           # the next try finds out whether the server is back
                if popped is None or popped[1] == b"wake":
                    continue
                if self.wait_replicas:
                    # the grant was written by the releaser's connection: confirm ours
                    # with one more script call, which finds the grant and re-writes it.
                    continue
                return int(popped[1])
        except Abandon:
            # The caller gave up (a cancelled task) while queued, or while a grant was on its
            # way: leave the queue in a last try that does not wait, and give back a grant.
            args[2] = fair + "01"
            try:
                reply, _ = yield ("acquire", _ACQUIRE[r.mode], key, args, self.socket_timeout)
                if reply.__class__ is int or reply[0] == 1:
                    yield ("release", _RELEASE[r.mode], key, _release_args(r.owner, r.mode), self.socket_timeout)
            except EngineUnavailable:
                pass               # the queue entry and a grant's short lease expire on their own
            raise

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        key, args = self._request(r)
        side = self._async.get(asyncio.get_running_loop()) or await self._open_side()
        return await arun_steps(self._acquire_steps(r, key, args, None),  # type: ignore[no-any-return]
                                functools.partial(self._ado, side), lambda exc: self._translate(exc, r.group, r.name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        side = self._async.get(asyncio.get_running_loop()) or await self._open_side()
        try:
            reply = await self._arun(side, _RELEASE[mode], self._key(group, name, mode), _release_args(owner, mode),
                                     self.socket_timeout)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc
        return self._released(group, name, reply)

    async def _open_side(self) -> _AsyncSide:
        """Return this event loop's client, direct calls and notify hub, made on its first use
        here (asyncio connections belong to the loop that made them: one set per loop).

        They must not outlive their loop: under WSGI every async view runs in a loop of its
        own (Flask, Django under gunicorn: asgiref's ``asyncio.run`` per request), and its
        connections would stay open for good. They close when the loop shuts down, in the loop:
        an async generator started here is among the ones the loop closes before it closes
        itself (``loop.shutdown_asyncgens()``, which ``asyncio.run``, ``asyncio.Runner`` and
        asgiref call), and its ``finally`` closes the side. Not at garbage collection: the
        connections keep their loop alive (transports refer to it), so a finalizer would wait
        for the cycle collector, which may come much later, or never before the fds run out.
        A loop closed without that shutdown (``loop.close()`` alone) cannot run anything any
        more: the sockets of its side are closed without it when the next loop opens a side
        or the engine is closed."""
        check_fork()
        loop = asyncio.get_running_loop()
        side = self._async.get(loop)
        if side is not None:
            return side
        self._close_dead_sides()
        self.client  # noqa: B018 - registers the scripts (their SHAs) once
        client = self.clients.build_async()
        pool = getattr(client, "connection_pool", None)
        if pool is None:        # Cluster: redis-py routes; waiters poll (no multi-key BLPOP across slots)
            side = _AsyncSide(client, _async_cluster_call(client), None)
        else:
            calls = AsyncDirectCalls(pool)
            side = _AsyncSide(client, calls, NotifyHub(pool, calls) if self.notify else None)
        self._async[loop] = side
        closer = _closed_with_loop(self, loop, side)
        await closer.asend(None)     # now the loop's: its shutdown_asyncgens() closes it
        side.closer = closer
        return side

    def _close_dead_sides(self) -> None:
        """Close the sides of loops that were closed without shutting down their async
        generators (their sockets, without the loop, which can no longer run anything)."""
        for loop in [loop for loop in list(self._async) if loop.is_closed()]:
            side = self._async.pop(loop, None)
            if side is not None:
                side.close_now()

    async def _ado(self, side: _AsyncSide, op: tuple[Any, ...]) -> Any:
        """Do one operation of the steps, awaiting it (the asyncio world's executor)."""
        kind = op[0]
        if kind == "acquire":
            if not self.wait_replicas:
                return await self._arun(side, op[1], op[2], op[3], op[4]), 0
            pipe = side.client.pipeline(transaction=False)
            pipe.evalsha(self._scripts[op[1]].sha, 1, op[2], *op[3])
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
            reply, acked = await pipe.execute()
            return reply, int(acked)
        if kind == "pop":
            if side.hub is None:
                await asyncio.sleep(op[2])
                return None
            return await side.hub.wait(op[1], op[2])
        if kind == "release":
            return await self._arun(side, op[1], op[2], op[3], op[4])
        await asyncio.sleep(op[1])     # "sleep"
        return None

    async def _arun(self, side: _AsyncSide, name: str, key: str, args: list[Any], timeout: float | None) -> Any:
        script = self._scripts[name]
        try:
            return await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=timeout)
        except rex.NoScriptError:
            script.sha = await side.client.script_load(script.script)
            return await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=timeout)

    def _confirm_steps(self, r: AcquireRequest, key: str, acked: int) -> Steps:
        """With ``wait_replicas``: release and raise if too few replicas acknowledged."""
        if acked < self.wait_replicas:
            with contextlib.suppress(EngineUnavailable):
                yield ("release", _RELEASE[r.mode], key, _release_args(r.owner, r.mode), self.socket_timeout)
            raise EngineUnavailable(f"only {acked} of {self.wait_replicas} replicas acknowledged the lock "
                                    f"within {self.wait_timeout_ms} ms; released it", group=r.group, name=r.name)

    def _do(self, op: tuple[Any, ...]) -> Any:
        """Do one operation of the steps, blocking (the sync world's executor)."""
        kind = op[0]
        if kind == "acquire":
            return self._acquire_call(op[1], op[2], op[3], op[4])
        if kind == "pop":
            hub = self._hub
            if hub is not None:
                return hub.pop(op[1], op[2], op[3])
            return (self._call or self._caller())("BLPOP", op[1], op[2], timeout=op[3])
        if kind == "release":
            return self._run(op[1], op[2], op[3], op[4])
        time.sleep(op[1])          # "sleep"
        return None

    def _run(self, name: str, key: str, args: list[Any], timeout: float | None = None) -> Any:
        """EVALSHA a script with one key, loading it again if the server lost it (a
        restart, a failover, SCRIPT FLUSH)."""
        check_fork()      # a child of a fork made from C must not talk on its parent's sockets
        call = self._call or self._caller()
        script = self._scripts[name]
        try:
            return call("EVALSHA", script.sha, 1, key, *args, timeout=timeout)
        except rex.NoScriptError:
            script.sha = self.client.script_load(script.script)
            return call("EVALSHA", script.sha, 1, key, *args, timeout=timeout)

    def _caller(self) -> Any:
        """Build the client (and its scripts) on first use; return the hot path's sender."""
        self.client  # noqa: B018 - builds it
        call = self._call
        return call if call is not None else _cluster_call(self.client)   # closed meanwhile

    def _acquire_call(self, script: str, key: str, args: list[Any], timeout: float) -> tuple[Any, int]:
        """Run an acquire script; with ``wait_replicas``, WAIT on the same connection in
        the same round trip (WAIT counts the replicas that have this connection's writes)."""
        if not self.wait_replicas:
            return self._run(script, key, args, timeout), 0
        pipe = self.client.pipeline(transaction=False)
        self._scripts[script](keys=[key], args=args, client=pipe)
        pipe.wait(self.wait_replicas, self.wait_timeout_ms)
        reply, acked = pipe.execute()
        return reply, int(acked)

    def _publish_evicted(self, group: str, name: str, evicted: list[Any]) -> None:
        for owner in evicted:
            logger.info("ylock: evicted dead waiter %s from %s/%s", owner, group, name)
            events.publish(events.WAITER_EVICTED, group, name, self.scheme, None,
                           owner=owner.decode() if isinstance(owner, bytes) else owner)

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        try:
            reply = self._run(_RELEASE[mode], self._key(group, name, mode), _release_args(owner, mode),
                              self.socket_timeout)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc
        return self._released(group, name, reply)

    def _released(self, group: str, name: str, reply: Any) -> bool:
        if reply.__class__ is int:
            return bool(reply)
        self._publish_evicted(group, name, reply[1:])
        return bool(reply[0])

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        results: list[bool | None] = [None] * len(items)
        client = self.client  # builds the client and registers the scripts on first use
        # A Cluster pipeline cannot run scripts, so split the batch per node and pipeline
        # each part on that node's own connection: one round trip per node and chunk.
        by_node: dict[Any, list[int]] = {}
        for index, item in enumerate(items):
            by_node.setdefault(self._node_client(client, item), []).append(index)
        for node_client, indexes in by_node.items():
            for start in range(0, len(indexes), self.renew_chunk):
                chunk = indexes[start:start + self.renew_chunk]
                try:
                    with self._errors():
                        pipe = node_client.pipeline(transaction=False)
                        for index in chunk:
                            item = items[index]
                            self._scripts["renew"](keys=[self._key(item.group, item.name, item.mode)],
                                                   args=[item.owner, item.mode, int(item.lease * 1000)], client=pipe)
                        replies = pipe.execute(raise_on_error=False)
                    for index, reply in zip(chunk, replies):
                        results[index] = None if isinstance(reply, Exception) else bool(reply)
                except EngineUnavailable:
                    logger.warning("ylock: Redis unavailable while renewing %d holds", len(chunk))
        return results

    def _node_client(self, client: Any, item: RenewItem) -> Any:
        if self.kind != "redis+cluster":
            return client
        slot = client.keyslot(self._base(item.group, item.name))
        return client.get_redis_connection(client.nodes_manager.get_node_from_slot(slot))

    # -- inspection -----------------------------------------------------------------------

    def _scan(self, pattern: str) -> Iterator[str]:
        client = self.client
        for key in client.scan_iter(match=pattern, count=1000):
            yield key.decode() if isinstance(key, bytes) else key

    def describe(self, group: str | None = None) -> list[LockInfo]:
        pattern = f"{self.prefix}:{{{_glob_escape(group)}:*" if group else f"{self.prefix}:{{*"
        infos = []
        with self._errors(group):
            # A lock whose only key is its fence is free and unqueued: skip it without a
            # round trip (fences outnumber live locks by far). A semaphore's keys sit under
            # the same {tag} followed by ":p".
            bases = set()
            for key in self._scan(pattern):
                end = key.rindex("}") + 1
                rest = key[end:]
                if rest not in (":f", ":p:f"):
                    bases.add(key[:end] + (":p" if rest.startswith(":p:") else ""))
            for base in sorted(bases):
                info = self._describe_one(base)
                if info is not None:
                    infos.append(info)
        return infos

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        base = self._key(group, name, PERMIT if kind == SEMAPHORE else WRITE)[:-2]
        with self._errors(group, name):
            return self._describe_one(base)

    def _describe_one(self, base: str) -> LockInfo | None:
        semaphore = base.endswith(":p")
        tag = base[len(self.prefix) + 2:base.rindex("}")]
        group, _, name = tag.partition(":")
        writer, writer_token, writer_ttl, shared, queue, modes, tokens, now, permits, notes = \
            self._run("describe", f"{base}:x", [])
        dec = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
        writer = dec(writer)
        if not writer and not shared and not queue:
            return None
        token_of = {dec(tokens[i]): int(tokens[i + 1]) for i in range(0, len(tokens), 2)}
        mode_of = {dec(modes[i]): dec(modes[i + 1]) for i in range(0, len(modes), 2)}
        waiters = tuple(f"{mode_of.get(dec(o), '?')}:{dec(o)}" for o in queue)
        context = {}
        for i in range(0, len(notes), 2):
            since, _, said = dec(notes[i + 1]).partition("|")
            context[dec(notes[i])] = holder_context(dec(notes[i]), int(since) / 1000 if since.isdigit() else None,
                                                    said)
        if writer:
            return LockInfo(group, name, WRITE, (writer,), waiters, max(0, writer_ttl) / 1000, int(writer_token),
                            context=context)
        kind, count = (SEMAPHORE, int(permits)) if semaphore and permits else (LOCK, None)
        if shared:
            owners = tuple(sorted(dec(shared[i]) for i in range(0, len(shared), 2)))
            ttl = (max(float(shared[i]) for i in range(1, len(shared), 2)) - now) / 1000
            token = max((token_of[o] for o in owners if o in token_of), default=None)
            return LockInfo(group, name, PERMIT if semaphore else READ, owners, waiters, ttl, token, kind, count,
                            context)
        return LockInfo(group, name, None, (), waiters, None, None, kind, count, context)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        with self._errors(group, name):
            return bool(self._run("adopt", self._key(group, name, mode), [old_owner, new_owner, mode, str(token)],
                                  self.socket_timeout))

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        with self._errors():
            self.client.set(f"{self.prefix}:stats:{process}", data, px=max(1, int(ttl * 1000)))

    def read_stats(self) -> dict[str, bytes]:
        start = len(self.prefix) + len(":stats:")
        with self._errors():
            keys = list(self._scan(f"{_glob_escape(self.prefix)}:stats:*"))
            if not keys:
                return {}
            if self.kind == "redis+cluster":
                values = [self.client.get(k) for k in keys]
            else:
                values = self.client.mget(keys)
        return {k[start:]: v for k, v in zip(keys, values) if v is not None}

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        with self._errors(group, name):
            return bool(self._run("force_release", self._key(group, name, PERMIT if kind == SEMAPHORE else WRITE), []))


#: The scripts that acquire and release in each mode, and their release arguments.
_ACQUIRE = {WRITE: "acquire", READ: "acquire", PERMIT: "sem_acquire"}
_RELEASE = {WRITE: "release", READ: "release", PERMIT: "sem_release"}


def _notify_key(key: str, owner: str) -> str:
    """The notify list of ``owner`` waiting for the lock (or semaphore) of x key ``key``."""
    return f"{key[:-2]}:n:{owner}"


def _release_args(owner: str, mode: str) -> list[str]:
    return [owner] if mode == PERMIT else [owner, mode]


class _AsyncSide:
    """One event loop's share of an engine: its asyncio client, direct calls, notify hub,
    closed with the loop (see :meth:`RedisEngine._open_side`)."""

    __slots__ = ("client", "calls", "hub", "closer", "__weakref__")

    def __init__(self, client: Any, calls: Any, hub: NotifyHub | None) -> None:
        self.client = client
        self.calls = calls
        self.hub = hub
        self.closer: Any = None     # the async generator whose closing closes this side

    async def aclose(self) -> None:
        """Close every connection of the side (in its loop)."""
        if self.hub is not None:
            await self.hub.aclose()
        pool = getattr(self.client, "connection_pool", None)
        with contextlib.suppress(Exception):
            if pool is not None:
                await pool.disconnect()      # the direct calls' connections count as in use there
            await self.client.aclose()

    def close_now(self) -> None:
        """Close the side's sockets without its loop (which is closed: nothing can run in it)."""
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None:
            connections = [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
            for conn in connections:
                _close_socket(conn)
        self.closer = None

    def close_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the side closed in ``loop`` (from any thread), or now if it is closed."""
        if loop.is_closed():
            self.close_now()
            return
        with contextlib.suppress(RuntimeError):      # closed meanwhile: its sockets go with it
            loop.call_soon_threadsafe(lambda: loop.create_task(self.aclose()))


async def _closed_with_loop(engine: RedisEngine, loop: asyncio.AbstractEventLoop,
                            side: _AsyncSide) -> AsyncGenerator[None, None]:
    """Suspended for the life of ``loop``; closed by its ``shutdown_asyncgens()``, it closes
    ``side`` (see :meth:`RedisEngine._open_side`)."""
    try:
        yield
    finally:
        if engine._async.get(loop) is side:
            del engine._async[loop]
        await side.aclose()


def _close_socket(conn: Any) -> None:
    """Close a ``redis.asyncio`` connection's socket without its (closed) event loop."""
    writer = getattr(conn, "_writer", None)
    if writer is None:
        return
    sock = writer.get_extra_info("socket")          # asyncio's TransportSocket, which has no close()
    with contextlib.suppress(OSError):
        raw = getattr(sock, "_sock", None)
        if raw is not None:
            raw.close()
        elif sock is not None:
            sock.shutdown(socket.SHUT_RDWR)         # at least the server lets go of it
    conn._reader = conn._writer = None


def _async_cluster_call(client: Any) -> Any:
    async def call(*args: Any, timeout: float | None = None) -> Any:
        return await client.execute_command(*args)
    return call


def _cluster_call(client: Any) -> Any:
    """The hot path's sender on a Cluster: redis-py's own routing (it follows MOVED and
    refreshes its slot map), whose sockets time out after the socket timeout: a call's
    budget is not passed down per operation there."""
    def call(*args: Any, timeout: float | None = None) -> Any:
        return client.execute_command(*args)
    return call


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
