"""RedisEngine: an AQS-like fair read-write lock on Redis, in Lua.

URLs and connection options: :mod:`ylock.engines.redis.clients`. ylock's options (query
parameters or keyword arguments): ``prefix`` (key prefix, default ``ylock``),
``socket_timeout`` (seconds, default 2: the longest a frozen server can stall one call),
``connect_timeout`` (default 1), ``notify`` (default true: releases push the lock to the
next waiter; false: polling only), ``fence_retention`` (seconds a lock's fence key
outlives its last token, default 300: tokens are floored at the server clock in µs, so the
fence only guards against a clock stepping back and more than one token per µs),
``wait_replicas`` (default 0: after acquiring, ``WAIT`` for that many replicas to
acknowledge, else release and raise EngineUnavailable)
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
A loop's connections close when it shuts down (see :func:`ylock.engines.redis.aio.open_side`).

Guarantees: exclusion holds while the Redis primary that holds the keys keeps them.
Leases are Redis-time (PEXPIRE/TIME in scripts), renewed by the process watchdog; a
holder paused past its lease loses the lock (``lock.lost``, ``LockLost`` at release), so
protect resources with the fencing token. Asynchronous replication means a failover can
lose a recent acquisition; ``wait_replicas`` narrows that window. Tokens stay unique and
rising across a failover (each is at least the server clock in µs) while the servers'
clocks agree within the failover time; see ``lua/common.lua``.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import redis.exceptions as rex

from ylock import events
from ylock import options as opt
from ylock.engines.base import (
    LOCK,
    PERMIT,
    SEMAPHORE,
    WRITE,
    AcquireRequest,
    Engine,
    LockInfo,
    RenewItem,
    abandon_first,
    arun_steps,
    cancelling,
    run_abandon_first,
    run_steps,
)
from ylock.engines.redis import inspection, scripts
from ylock.engines.redis.aio import AsyncSide, open_side
from ylock.engines.redis.clients import Clients, split_url
from ylock.engines.redis.direct import (
    BLPOP_REFUSED,
    AsyncDirectCalls,
    DirectCalls,
    Refusals,
    ThreadNotifyHub,
    acluster_script_wait,
    cluster_call,
    cluster_script_wait,
    refused,
)
from ylock.engines.redis.keys import Keys
from ylock.engines.redis.scripts import ACQUIRE, FIRST_TRY, RELEASE, release_args
from ylock.engines.redis.steps import Acquire, Pop, Release, Sleep, acquire_steps
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.owner import _new_process, _same_process, check_fork

logger = logging.getLogger(__name__)


#: How many x keys an engine keeps built (see ``RedisEngine._x_keys``).
X_KEYS = 4096


class RedisEngine(Engine):
    """Redis engine (see module docstring)."""

    scheme = "redis"
    release_resendable = True       # the release scripts check the owner: a second one finds nothing

    def __init__(self, url: str, *, prefix: str = "ylock", socket_timeout: float = 2.0,
                 connect_timeout: float = 1.0, notify: bool = True, fence_retention: float = 300.0,
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
        self.keys = Keys(prefix)
        #: The x keys of the locks in use, by (group, name, mode): every acquire and release
        #: needs one, and a dict look-up costs a fraction of building it (Keys.x). Emptied
        #: when it grows past X_KEYS (names made per request must not grow it for ever).
        self._x_keys: dict[tuple[str, str, str], str] = {}
        self.notify = opt.boolean(notify, f"{where} notify", code=opt.E_ENGINE_URL)
        self.fence_retention_ms = int(retention * 1000)
        self.wait_timeout_ms = int(wait * 1000)
        self.barge_window_ms = int(barge * 1000)
        self.renew_chunk = renew_chunk
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._call: Any = None     # DirectCalls, or the client's execute_command on Cluster
        self._hub: ThreadNotifyHub | None = None     # where threads wait for grants (not on Cluster)
        self._refusals = Refusals()      # commands the server refused us (an ACL), logged once
        self._init_lock = threading.Lock()
        self._async: dict[asyncio.AbstractEventLoop, AsyncSide] = {}

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
                    self._scripts = {name: client.register_script(self._fill(src))
                                     for name, src in scripts.SOURCES.items()}
                    pool = getattr(client, "connection_pool", None)
                    if pool is None:
                        self._call, self._hub = cluster_call(client), None
                    else:
                        self._call = DirectCalls(pool)
                        self._hub = (ThreadNotifyHub(self._call, self.keys.wake(), self._refusals)
                                     if self.notify else None)
                    self._client = client
                client = self._client
        return client

    def _fill(self, template: str) -> str:
        return scripts.fill(template, self.fence_retention_ms, self.barge_window_ms)

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
            text = str(exc)
            # NOREPLICAS: a master with min-replicas-to-write that lost its replicas refuses writes.
            if "CLUSTERDOWN" in text or "READONLY" in text or "MASTERDOWN" in text or "NOREPLICAS" in text:
                return EngineUnavailable(f"Redis at {self.url_for_display()} is unavailable: {exc}",
                                         group=group, name=name)
            return LockError(f"Redis at {self.url_for_display()} failed: {exc}", group=group, name=name)
        return exc

    def ping(self) -> None:
        with self._errors():
            self.client.ping()

    # -- ownership ------------------------------------------------------------------------

    def _x(self, group: str, name: str, mode: str) -> str:
        """``self.keys.x(group, name, mode)``, built once per lock (see :attr:`_x_keys`)."""
        x_keys = self._x_keys
        if len(x_keys) >= X_KEYS:
            x_keys.clear()
        key = x_keys[group, name, mode] = self.keys.x(group, name, mode)
        return key

    def _request(self, r: AcquireRequest) -> tuple[str, list[Any]]:
        """The acquire script's key and arguments for ``r``'s first try (a semaphore's
        script takes its permit count in the mode's place)."""
        mode = r.mode
        return (self._x_keys.get((r.group, r.name, mode)) or self._x(r.group, r.name, mode),
                [r.owner, r.permits if r.mode == PERMIT else r.mode,
                 FIRST_TRY[r.fair], int(r.lease * 1000),
                 int(r.polling.waiter_lease * 1000), r.context])

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        key, args = self._request(r)
        reply = None
        if not self.wait_replicas and (r.deadline is None or time.monotonic() < r.deadline):
            # The first try, on its own: an uncontended write comes back as a bare token.
            try:
                reply = self._run(ACQUIRE[r.mode], key, args, self.socket_timeout)
            except Exception as exc:
                raise self._translate(exc, r.group, r.name) from exc
            if reply.__class__ is int:
                return reply
            if _queued_too_late(r, reply):
                run_abandon_first(acquire_steps(self, r, key, args, None), self._do,
                                  lambda exc: self._translate(exc, r.group, r.name))
                return None
        try:
            return run_steps(acquire_steps(self, r, key, args, reply), self._do,  # type: ignore[no-any-return]
                             lambda exc: self._translate(exc, r.group, r.name))
        finally:
            hub = self._hub
            if hub is not None:
                hub.leave(Keys.notify(key, r.owner))

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        key, args = self._request(r)
        loop = asyncio.get_running_loop()
        side = self._async.get(loop) or await open_side(self)
        reply = None
        if not self.wait_replicas and (r.deadline is None or time.monotonic() < r.deadline):
            # The first try awaited here, as :meth:`acquire` does it: an uncontended lock costs
            # no steps and no executor. A cancellation meanwhile (also one a layer below
            # swallowed, see arun_steps) gives back what the try may have got, as the steps do.
            task = asyncio.current_task(loop)
            cancels = cancelling(task)
            script = self._scripts[ACQUIRE[r.mode]]
            try:
                try:        # _arun's call, in this coroutine (one coroutine less per acquisition)
                    reply = await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=self.socket_timeout)
                except rex.NoScriptError:
                    reply = await self._areload(side, ACQUIRE[r.mode], key, args, self.socket_timeout)
            except asyncio.CancelledError:
                await self._abandon_first(side, r, key, args)
                raise
            except Exception as exc:
                raise self._translate(exc, r.group, r.name) from exc
            if cancelling(task) > cancels:
                await self._abandon_first(side, r, key, args)
                raise asyncio.CancelledError
            if reply.__class__ is int:
                return reply
            if _queued_too_late(r, reply):
                await self._abandon_first(side, r, key, args)
                return None
        return await arun_steps(acquire_steps(self, r, key, args, reply),  # type: ignore[no-any-return]
                                functools.partial(self._ado, side), lambda exc: self._translate(exc, r.group, r.name))

    async def _abandon_first(self, side: AsyncSide, r: AcquireRequest, key: str, args: list[Any]) -> None:
        """Leave the queue and give back a grant after a first try whose task was cancelled
        (the steps' own clean-up: see :func:`abandon_first`)."""
        await abandon_first(acquire_steps(self, r, key, args, None), functools.partial(self._ado, side),
                            lambda exc: self._translate(exc, r.group, r.name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        side = self._async.get(asyncio.get_running_loop()) or await open_side(self)
        key = self._x_keys.get((group, name, mode)) or self._x(group, name, mode)     # see _x_keys
        args = release_args(owner, mode)
        script = self._scripts[RELEASE[mode]]
        try:
            try:            # _arun's call, in this coroutine (see aacquire)
                reply = await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=self.socket_timeout)
            except rex.NoScriptError:
                reply = await self._areload(side, RELEASE[mode], key, args, self.socket_timeout)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc
        return self._released(group, name, reply)

    async def _ado(self, side: AsyncSide, op: Acquire | Pop | Release | Sleep) -> Any:
        """Do one operation of the steps, awaiting it (the asyncio world's executor)."""
        if isinstance(op, Acquire):
            if not self.wait_replicas:
                return await self._arun(side, op.script, op.key, op.args, op.timeout), 0
            if self.kind == "redis+cluster":
                return await acluster_script_wait(side.client, self._scripts[op.script], op.key, op.args,
                                                  self.wait_replicas, self.wait_timeout_ms)
            pipe = side.client.pipeline(transaction=False)
            pipe.evalsha(self._scripts[op.script].sha, 1, op.key, *op.args)
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
            reply, acked = await pipe.execute()
            return reply, int(acked)
        if isinstance(op, Pop):
            if side.hub is not None:
                return await side.hub.wait(op.key, op.wait)
            if side.pops <= 0 or "BLPOP" in self._refusals.commands:
                await asyncio.sleep(op.wait)       # polling: the next try reads the lock's keys
                return None
            # A Cluster: this task blocks on its own notify key (routed to its slot's owner),
            # as a Cluster thread does, so a grant reaches it at once rather than at its next
            # poll (up to 0.5 s later; 8 tasks taking turns did ~5 acquisitions a second).
            side.pops -= 1
            try:
                return await side.calls("BLPOP", op.key, op.wait, timeout=op.timeout)
            except rex.ResponseError as exc:
                if not refused(exc):
                    raise
                self._refusals.note("BLPOP", exc, *BLPOP_REFUSED)
                await asyncio.sleep(op.wait)
                return None
            finally:
                side.pops += 1
        if isinstance(op, Release):
            return await self._arun(side, op.script, op.key, op.args, op.timeout)
        await asyncio.sleep(op.seconds)
        return None

    async def _arun(self, side: AsyncSide, name: str, key: str, args: list[Any], timeout: float | None) -> Any:
        script = self._scripts[name]
        try:
            return await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=timeout)
        except rex.NoScriptError:
            return await self._areload(side, name, key, args, timeout)

    async def _areload(self, side: AsyncSide, name: str, key: str, args: list[Any], timeout: float | None) -> Any:
        """Load a script the server answered ``NOSCRIPT`` for (a restart, a failover, SCRIPT
        FLUSH) and run it again."""
        script = self._scripts[name]
        if side.calls.__class__ is AsyncDirectCalls:     # see _run
            sha = await side.calls("SCRIPT", "LOAD", script.script, timeout=timeout)
            script.sha = sha.decode() if isinstance(sha, bytes) else sha
        else:
            script.sha = await side.client.script_load(script.script)
        return await side.calls("EVALSHA", script.sha, 1, key, *args, timeout=timeout)

    def _do(self, op: Acquire | Pop | Release | Sleep) -> Any:
        """Do one operation of the steps, blocking (the sync world's executor)."""
        if isinstance(op, Acquire):
            return self._acquire_call(op.script, op.key, op.args, op.timeout)
        if isinstance(op, Pop):
            hub = self._hub
            if hub is not None:
                return hub.pop(op.key, op.wait, op.timeout)
            return (self._call or self._caller())("BLPOP", op.key, op.wait, timeout=op.timeout)
        if isinstance(op, Release):
            return self._run(op.script, op.key, op.args, op.timeout)
        time.sleep(op.seconds)
        return None

    def _run(self, name: str, key: str, args: list[Any], timeout: float | None = None) -> Any:
        """EVALSHA a script with one key, loading it again if the server lost it (a
        restart, a failover, SCRIPT FLUSH)."""
        if not _same_process[0]:      # check_fork, inline: a child of a fork made from C must
            _new_process()            # not talk on its parent's sockets
        call = self._call or self._caller()
        script = self._scripts[name]
        try:
            return call("EVALSHA", script.sha, 1, key, *args, timeout=timeout)
        except rex.NoScriptError:
            if call.__class__ is DirectCalls:
                # On the lock path's own connections: not on the client's pool, which would
                # open a connection for each thread that found the script missing at once.
                sha = call("SCRIPT", "LOAD", script.script, timeout=timeout)
                script.sha = sha.decode() if isinstance(sha, bytes) else sha
            else:
                script.sha = self.client.script_load(script.script)
            return call("EVALSHA", script.sha, 1, key, *args, timeout=timeout)

    def _caller(self) -> Any:
        """Build the client (and its scripts) on first use; return the hot path's sender."""
        self.client  # noqa: B018 - builds it
        call = self._call
        return call if call is not None else cluster_call(self.client)   # closed meanwhile

    def _acquire_call(self, script: str, key: str, args: list[Any], timeout: float) -> tuple[Any, int]:
        """Run an acquire script; with ``wait_replicas``, WAIT on the same connection in
        the same round trip (WAIT counts the replicas that have this connection's writes)."""
        if not self.wait_replicas:
            return self._run(script, key, args, timeout), 0
        client = self.client
        if self.kind == "redis+cluster":
            # A Cluster pipeline refuses scripts: pipeline on the slot owner's own client.
            return cluster_script_wait(client, self._scripts[script], key, args, self.wait_replicas,
                                       self.wait_timeout_ms)
        pipe = client.pipeline(transaction=False)
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
        key = self._x_keys.get((group, name, mode)) or self._x(group, name, mode)     # see _x_keys
        try:
            reply = self._run(RELEASE[mode], key, release_args(owner, mode), self.socket_timeout)
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
                            self._scripts["renew"](keys=[self.keys.x(item.group, item.name, item.mode)],
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
        slot = client.keyslot(self.keys.base(item.group, item.name))
        return client.get_redis_connection(client.nodes_manager.get_node_from_slot(slot))

    # -- inspection -----------------------------------------------------------------------

    def describe(self, group: str | None = None) -> list[LockInfo]:
        with self._errors(group):
            return inspection.describe(self, group)

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        base = Keys.described(self.keys.x(group, name, PERMIT if kind == SEMAPHORE else WRITE))
        with self._errors(group, name):
            return inspection.describe_base(self, base)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        with self._errors(group, name):
            return bool(self._run("adopt", self.keys.x(group, name, mode), [old_owner, new_owner, mode, str(token)],
                                  self.socket_timeout))

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        with self._errors():
            inspection.publish_stats(self, process, data, ttl)

    def read_stats(self) -> dict[str, bytes]:
        with self._errors():
            return inspection.read_stats(self)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        with self._errors(group, name):
            key = self.keys.x(group, name, PERMIT if kind == SEMAPHORE else WRITE)
            return bool(self._run("force_release", key, []))



def _queued_too_late(r: AcquireRequest, reply: Any) -> bool:
    """Whether a first try queued the owner (it asks to stay) but answered after the
    deadline: the steps, which take such an answer as the last try's, would return without
    leaving the queue, so the caller leaves it (and gives back a grant) and times out."""
    return r.deadline is not None and reply[0] != 1 and time.monotonic() >= r.deadline
