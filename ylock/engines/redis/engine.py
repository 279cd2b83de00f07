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
    Listing,
    LockInfo,
    RenewItem,
    run_abandon_first,
    run_steps,
)
from ylock.engines.redis import inspection, renewal, scripts
from ylock.engines.redis.aio import AsyncSide
from ylock.engines.redis.averbs import AsyncVerbs
from ylock.engines.redis.calls import DirectCalls
from ylock.engines.redis.clients import Clients, split_url
from ylock.engines.redis.cluster import ClusterCalls, cluster_script_wait
from ylock.engines.redis.hubs import Refusals, ThreadNotifyHub
from ylock.engines.redis.keys import Keys
from ylock.engines.redis.scripts import ACQUIRE, FIRST_TRY, FIRST_TRY_HOLDERS, RELEASE, Released, release_args
from ylock.engines.redis.steps import Acquire, Pop, Release, Sleep, acquire_steps, not_run, queued_too_late
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.owner import _new_process, _same_process, check_fork

logger = logging.getLogger(__name__)


#: How many locks' key lists an engine keeps built (see ``RedisEngine._lock_keys``).
X_KEYS = 4096


class RedisEngine(AsyncVerbs, Engine):
    """Redis engine (see module docstring)."""

    scheme = "redis"
    grants_waiter_lease = True          # see acquire.lua: every grant lasts min(lease, waiter lease) first
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
        self.keys = Keys(prefix, cluster=self.kind == "redis+cluster")
        #: The keys of the locks in use (what their scripts declare), by (group, name, mode):
        #: every acquire and release needs them, and a dict look-up costs a fraction of
        #: building them (Keys.lock). Emptied when it grows past X_KEYS (names made per
        #: request must not grow it for ever).
        self._lock_keys: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self.notify = opt.boolean(notify, f"{where} notify", code=opt.E_ENGINE_URL)
        self.fence_retention_ms = int(retention * 1000)
        self.wait_timeout_ms = int(wait * 1000)
        self.barge_window_ms = int(barge * 1000)
        self.renew_chunk = renew_chunk
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._call: Any = None     # DirectCalls, or ClusterCalls on a Cluster
        self._hub: ThreadNotifyHub | None = None     # where threads wait for grants (not on Cluster)
        self._renew_calls: DirectCalls | None = None  # the watchdog's connection (see renewal.py)
        self._inspect_calls: DirectCalls | None = None    # the listings' (see inspection.py)
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
                        self._call, self._hub = ClusterCalls(client, self.socket_timeout), None
                    else:
                        self._call = DirectCalls(pool)
                        self._hub = (ThreadNotifyHub(self._call, self.keys.wake(), self._refusals)
                                     if self.notify else None)
                    self._client = client
                client = self._client
        return client

    def _fill(self, template: str) -> str:
        return scripts.fill(template, self.fence_retention_ms, self.barge_window_ms, self.keys.cluster)

    def check_options(self) -> None:
        if self._client is None:
            self.clients.check()

    def _after_fork(self) -> None:
        # The child must not use the parent's sockets; redis-py pools also check the pid,
        # but dropping the client is simpler and covers Sentinel and Cluster too.
        self._client = None
        self._call = None
        self._hub = None
        self._renew_calls = self._inspect_calls = None
        self._init_lock = threading.Lock()
        self._async = {}          # the parent's loops do not run here; their sockets are the parent's

    def close(self) -> None:
        client, self._client = self._client, None
        self._call = None
        self._renew_calls = self._inspect_calls = None
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
        if isinstance(exc, rex.TryAgainError):
            return EngineUnavailable(f"the Redis Cluster slot of this lock is being migrated (its keys are split "
                                     f"between two nodes: TRYAGAIN) past the call's time: {exc}",
                                     group=group, name=name)
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

    def cluster_redirections(self) -> dict[str, int]:
        """How many ``ASK``, ``MOVED`` and ``TRYAGAIN`` replies this process's calls met on a
        Redis Cluster (slot migrations, failovers), by kind ("ask", "moved", "tryagain", and
        the renewals' own as "renew ask"...); empty off a Cluster. Each was followed within
        its call's time (see :mod:`ylock.engines.redis.cluster`)."""
        call = self._call
        return dict(getattr(call, "redirections", {}))

    # -- ownership ------------------------------------------------------------------------

    def _keys_of(self, group: str, name: str, mode: str) -> tuple[str, ...]:
        """``self.keys.lock(group, name, mode)``, built once per lock (see :attr:`_lock_keys`)."""
        lock_keys = self._lock_keys
        if len(lock_keys) >= X_KEYS:
            lock_keys.clear()
        keys = lock_keys[group, name, mode] = self.keys.lock(group, name, mode)
        return keys

    def _request(self, r: AcquireRequest) -> tuple[tuple[str, ...], list[Any]]:
        """The acquire script's keys (the lock's, then the owner's notify list) and arguments
        for ``r``'s first try (a semaphore's script takes its permit count in the mode's place;
        the last, the notify hub the owner waits through, is the asyncio verbs' to set)."""
        mode = r.mode
        keys = self._lock_keys.get((r.group, r.name, mode)) or self._keys_of(r.group, r.name, mode)
        return ((*keys, f"{keys[0][:-2]}:n:{r.owner}"),
                [r.owner, r.permits if r.mode == PERMIT else r.mode,
                 (FIRST_TRY if r.queued is None else FIRST_TRY_HOLDERS)[r.fair], int(r.lease * 1000),
                 int(r.polling.waiter_lease * 1000), r.context, ""])

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        keys, args = self._request(r)
        reply = None
        if not self.wait_replicas and (r.deadline is None or time.monotonic() < r.deadline):
            # The first try, on its own: an uncontended write comes back as a bare token.
            try:
                reply = self._run(ACQUIRE[r.mode], keys, args, time.monotonic() + self.socket_timeout)
            except Exception as exc:
                # A try that did not run (a slot migration, a congested pool) outlasted its time:
                # the steps try again until the deadline.
                if not (not_run(exc) and (r.deadline is None or time.monotonic() < r.deadline)):
                    raise self._translate(exc, r.group, r.name) from exc
            if reply.__class__ is int:
                return reply
            if reply is not None and queued_too_late(r, reply):
                run_abandon_first(acquire_steps(self, r, keys, args, None), self._do,
                                  lambda exc: self._translate(exc, r.group, r.name))
                return None
        try:
            return run_steps(acquire_steps(self, r, keys, args, reply), self._do,  # type: ignore[no-any-return]
                             lambda exc: self._translate(exc, r.group, r.name))
        finally:
            hub = self._hub
            if hub is not None:
                hub.leave(keys[-1])

    def _do(self, op: Acquire | Pop | Release | Sleep) -> Any:
        """Do one operation of the steps, blocking (the sync world's executor)."""
        if isinstance(op, Acquire):
            return self._acquire_call(op.script, op.keys, op.args, op.end)
        if isinstance(op, Pop):
            hub = self._hub
            if hub is not None:
                return hub.pop(op.key, op.block, op.end)
            return (self._call or self._caller())("BLPOP", op.key, op.block, end=op.end)
        if isinstance(op, Release):
            return self._run(op.script, op.keys, op.args, op.end)
        time.sleep(op.seconds)
        return None

    def _run(self, name: str, keys: tuple[str, ...], args: list[Any], end: float | None = None) -> Any:
        """EVALSHA a script with its ``keys`` by ``end`` (monotonic; None: within the socket
        timeout), loading it again if the server lost it (a restart, a failover, SCRIPT FLUSH)."""
        if not _same_process[0]:      # check_fork, inline: a child of a fork made from C must
            _new_process()            # not talk on its parent's sockets
        call = self._call or self._caller()
        script = self._scripts[name]
        try:
            return call("EVALSHA", script.sha, len(keys), *keys, *args, end=end)
        except rex.NoScriptError:
            if call.__class__ is DirectCalls:
                # On the lock path's own connections: not on the client's pool, which would
                # open a connection for each thread that found the script missing at once.
                sha = call("SCRIPT", "LOAD", script.script, end=end)
                script.sha = sha.decode() if isinstance(sha, bytes) else sha
            else:
                script.sha = self.client.script_load(script.script)
            return call("EVALSHA", script.sha, len(keys), *keys, *args, end=end)

    def _caller(self) -> Any:
        """Build the client (and its scripts) on first use; return the hot path's sender."""
        self.client  # noqa: B018 - builds it
        call = self._call
        return call if call is not None else ClusterCalls(self.client, self.socket_timeout)   # closed meanwhile

    def _acquire_call(self, script: str, keys: tuple[str, ...], args: list[Any], end: float) -> tuple[Any, int]:
        """Run an acquire script by ``end``; with ``wait_replicas``, WAIT on the same
        connection in the same round trip (WAIT counts the replicas that have this
        connection's writes; redis-py's pipeline is bounded by the socket timeout)."""
        if not self.wait_replicas:
            return self._run(script, keys, args, end), 0
        client = self.client
        if self.kind == "redis+cluster":
            # A Cluster pipeline refuses scripts: pipeline on the slot owner's own client.
            return cluster_script_wait(client, self._scripts[script], keys, args, self.wait_replicas,
                                       self.wait_timeout_ms)
        pipe = client.pipeline(transaction=False)
        self._scripts[script](keys=list(keys), args=args, client=pipe)
        pipe.wait(self.wait_replicas, self.wait_timeout_ms)
        reply, acked = pipe.execute()
        return reply, int(acked)

    def _publish_evicted(self, group: str, name: str, evicted: list[Any]) -> None:
        for owner in evicted:
            logger.info("ylock: evicted dead waiter %s from %s/%s", owner, group, name)
            events.publish(events.WAITER_EVICTED, group, name, self.scheme, None,
                           owner=owner.decode() if isinstance(owner, bytes) else owner)

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        keys = self._lock_keys.get((group, name, mode)) or self._keys_of(group, name, mode)     # see _lock_keys
        try:
            reply = self._run(RELEASE[mode], keys, release_args(owner, mode), time.monotonic() + self.socket_timeout)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc
        return self._released(group, name, reply)

    def _released(self, group: str, name: str, reply: Any) -> bool:
        if reply.__class__ is int:
            return bool(reply)
        answer = Released.of(reply)
        self._publish_evicted(group, name, answer.evicted)
        return answer.held

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        return renewal.renew(self, items)

    # -- inspection -----------------------------------------------------------------------

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        with self._errors(group):
            return inspection.describe(self, group, limit)

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        with self._errors(group, name):
            return inspection.describe_lock(self, group, name, kind)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        with self._errors(group, name):
            return bool(self._run("adopt", self.keys.adopted(group, name, mode), [old_owner, new_owner, mode,
                                                                                   str(token)],
                                  time.monotonic() + self.socket_timeout))

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        with self._errors():
            inspection.publish_stats(self, process, data, ttl)

    def read_stats(self) -> dict[str, bytes]:
        with self._errors():
            return inspection.read_stats(self)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        with self._errors(group, name):
            keys = self.keys.lock(group, name, PERMIT if kind == SEMAPHORE else WRITE)
            return bool(self._run("force_release", keys, []))
