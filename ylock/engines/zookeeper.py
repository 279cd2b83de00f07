"""ZooKeeperEngine: a fair read-write lock on ZooKeeper's sequential ephemeral nodes.

URL::

    zookeeper://[user:password@]host1:2181,host2:2181[/chroot][?options]

``user:password`` become kazoo ``digest`` auth. Options (query parameters or keyword
arguments): ``session_timeout`` (seconds, default 10: this is the lease: a holder whose
session expires loses its locks), ``connect_timeout`` (default 2: the longest one request
may take, and how long the first call waits for the first connection), ``root`` (the
znode under which locks live, default ``/ylock``), ``idle`` (seconds after which an
unused lock parent znode is deleted, default 2).

The protocol, on kazoo's public asynchronous API (no recipe, no kazoo internals):

* Every lock is the znode ``<root>/<group>/<name>``; an owner that asks for it creates an
  ephemeral sequential child ``w-<owner>-<seq>`` (write) or ``r-<owner>-<seq>`` (read),
  whose data says its mode. Children are served in sequence order: always fair (a
  non-fair request is served fairly too). A writer is blocked by any child before it, a
  reader by the write children before it.
* **Acquire**: the create (CREATE2: the reply carries the node's ``czxid``, the fencing
  token) and the read of the children are sent together: ZooKeeper answers a session's
  requests in order, so the children read already sees the new node: one round trip
  for an uncontended acquisition, one for its release (the delete). That read also
  leaves a child watch on the lock: the first change of the lock's children makes the
  holder watch its own node from then on, so a force-release is seen at once without a
  request of its own on the uncontended path.
* **Waiting**: a blocked owner watches the nearest child that blocks it and, in the same
  round trip, its own node. When that blocker was the only one and it is deleted, the
  waiter owns the lock without reading the children again (sequence numbers only grow, so
  nothing can get ahead of it; and ZooKeeper delivers watch events in the order of the
  changes, so had its own node been deleted before, it would have heard that first and
  queued again). Any other wake-up reads the children again.
* **Downgrade**: a writer that takes the read lock keeps one node; when it releases the
  write lock it rewrites the node's data to "read" (one request) and keeps its place, so
  readers queued behind it get in, a queued writer still waits for it, and no writer can
  slip in between (the node is never absent). A reader blocked by a write node reads that
  node's data with its watch (``get`` instead of ``exists``: same cost), so it sees a
  downgrade and is woken by one.
* **Faults**: losing the connection fires every kazoo watch with an event of type NONE:
  that is not a deletion. A waiter waits for the connection to come back (within its
  deadline) and looks again; a holder checks its node once the connection is back. Only a
  session that expires, or its node deleted, loses a hold. A request is sent only while
  connected, and each is bounded: a call ends within its timeout plus ``connect_timeout``.
  A node whose fate is unknown (a create or delete that got no answer, a waiter that gave
  up) is deleted in the background once the connection is back, so nothing leaks while
  the session lives. While the engine is disconnected calls fail within their own timeout
  (after the first connection, which may take ``connect_timeout``); kazoo reconnects in
  the background, and its repeated connection errors are logged once a minute, not per
  attempt.
* **The client**: a kazoo client with a handler of our own (kazoo's ``handler=`` option,
  :class:`_Handler`): its connection thread waits with a ``poll`` object instead of
  building an epoll selector on every wait, and runs this engine's watches itself (they
  never block) instead of handing each to kazoo's callback thread. Per uncontended
  acquire+release that is most of the client's CPU time, and one thread switch less.
* **Tidying** (the seed's LockKeeper): lock parents unused for ``idle`` seconds are
  deleted by a background thread, so fine-grained locks do not grow ZooKeeper.

Guarantees: exclusion holds while the holder's session lives; quorum writes are not lost
on failover. A session that expires (the process paused past ``session_timeout``, or cut
off) marks every hold lost (``lock.lost``, ``LockLost`` at release, a ``lost`` event); a
suspended connection publishes ``suspended``, its return ``reconnected``. Fencing token:
the node's ``czxid``; zxids increase across the ensemble, so tokens strictly increase per
lock name, also after its parent was deleted.
"""
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
from typing import Any
from urllib.parse import unquote, urlsplit

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.states import Callback, EventType
from kazoo.retry import KazooRetry

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
    Mailbox,
    Steps,
    arun_steps,
    holder_context,
    run_steps,
    settle,
)
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.holds import HOLDS

logger = logging.getLogger(__name__)

_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
                KazooTimeoutError)
#: Errors a request's result may carry that the protocol handles itself.
_ANSWERS = (NoNodeError, NodeExistsError, NotEmptyError, BadVersionError)
_LETTER = {WRITE: "w", READ: "r", PERMIT: "p"}


class _Claim:
    """One owner's node on one lock: first a request (it may wait), then a hold."""

    __slots__ = ("engine", "key", "lockpath", "prefix", "mode", "node", "token", "mailbox", "held", "lost",
                 "released", "own_watched", "recheck", "downgraded", "unsure", "context")

    def __init__(self, engine: ZooKeeperEngine, key: tuple[str, str, str, str], lockpath: str, mode: str) -> None:
        self.engine = engine
        self.key = key                          # (group, name, owner, mode)
        self.lockpath = lockpath
        self.prefix = f"{_LETTER[mode]}-{key[2]}-"
        self.mode = mode
        self.node: str | None = None           # the full path of our node, once created
        self.token = 0
        self.mailbox = Mailbox()
        self.held = False
        self.lost = False
        self.released = False
        self.own_watched = False                # an exists watch on our node is set
        self.recheck = False                    # the connection dropped: look at our node again
        self.downgraded = False                 # a read hold rides on this write node
        self.unsure = False                     # a create got no answer: our node may exist
        self.context = ""                       # what the owner said it is doing (JSON)

    def on_watch(self, event: Any) -> None:
        """Every watch of this claim calls this, in kazoo's thread: never block here."""
        if self.released:
            return
        if self.held:
            self.engine._held_event(self, event)
        elif self.own_watched and event.type == EventType.CHILD and self.mode != PERMIT:
            # A queued writer's or reader's child watch (left by its first look at the
            # children) only matters once it holds, and then only while it does not watch
            # its own node: it does already, so the change would only wake it for nothing.
            return
        else:
            self.mailbox.put(event)


# poll() masks (0 where there is no poll(): the engine keeps kazoo's own handler there).
_WAIT_READ = getattr(select, "POLLIN", 0) | getattr(select, "POLLPRI", 0)
_HUNG = getattr(select, "POLLERR", 0) | getattr(select, "POLLHUP", 0)
_NVAL = getattr(select, "POLLNVAL", 0)


class _Handler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler (through kazoo's public extension point, ``handler=``) with
    two costs of every request taken out of kazoo's connection thread:

    * ``select``: kazoo's builds, registers and closes an epoll selector on every call (11 to
      44 µs here), about five times per request (wake up to send, wait to write, wake up
      to read, wait for the length, wait for the body: 18 calls per uncontended
      acquire+release); a ``poll`` object per call gives the same answers (a hung-up socket
      is readable and writable, as with ``select``) in about 2 µs. A closed socket goes to
      kazoo's own, so its errors stay kazoo's.
    * ``dispatch_callback``: the watches of this engine's claims never block (they set flags,
      post to a mailbox or send a request without waiting for it), so they run in the
      connection thread as the event is read, instead of waking kazoo's callback thread:
      one thread switch less per release (our own child watch fires at the delete) and per
      handoff (the waiter is woken straight from the connection thread). Every other watch
      (a user's, through ``engine.client``) goes to the callback thread as before, and so
      does the report of a loss (its subscribers are anybody's code: see ``_lose``).
    """

    def select(self, rlist: list[Any], wlist: list[Any], xlist: list[Any],
               timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
        if rlist and wlist:                  # kazoo never asks for both at once
            return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
        watched, mask = (rlist, _WAIT_READ) if rlist else (wlist, select.POLLOUT)
        poller = select.poll()
        try:
            fds = [obj if isinstance(obj, int) else obj.fileno() for obj in watched]
            for fd in fds:
                poller.register(fd, mask)
        except (ValueError, OSError):        # a closed socket: kazoo's own select raises its error
            return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
        ready = poller.poll(None if timeout is None else timeout * 1000)
        hit: list[Any] = []
        for fd, revents in ready:
            if revents & _NVAL:
                return super().select(rlist, wlist, xlist, timeout)  # type: ignore[no-any-return]
            if revents & (mask | _HUNG):
                hit.append(watched[fds.index(fd)])
        return (hit, [], []) if rlist else ([], hit, [])

    def dispatch_callback(self, callback: Callback) -> None:
        if callback.type == "watch" and isinstance(getattr(callback.func, "__self__", None), _Claim):
            try:
                callback.func(*callback.args)
            except Exception:  # noqa: BLE001 - as kazoo's callback thread: log, go on
                logger.exception("ylock: a ZooKeeper watch failed")
            return
        super().dispatch_callback(callback)


class ZooKeeperEngine(Engine):
    """ZooKeeper engine (see module docstring)."""

    scheme = "zookeeper"
    needs_renewal = False
    adopts_across_processes = False
    url_options = {"session_timeout": float, "connect_timeout": float, "root": str, "idle": float}

    def __init__(self, url: str, *, session_timeout: float = 10.0, connect_timeout: float = 2.0,
                 root: str = "/ylock", idle: float = 2.0) -> None:
        super().__init__()
        parts = urlsplit(url)
        if parts.scheme.lower() != "zookeeper":
            raise ConfigurationError(f"not a ZooKeeper URL: {url!r}", code=opt.E_ENGINE_URL)
        hosts = parts.netloc.rpartition("@")[2]
        if not hosts:
            raise ConfigurationError(f"ZooKeeper URL names no host: {url!r}", code=opt.E_ENGINE_URL)
        where = "ZooKeeper engine option"
        self.session_timeout = opt.seconds(session_timeout, f"{where} session_timeout", minimum=0.1, maximum=3600,
                                           above=None, code=opt.E_ENGINE_URL)
        self.connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600,
                                           code=opt.E_ENGINE_URL)
        self.idle = opt.seconds(idle, f"{where} idle", maximum=86400, code=opt.E_ENGINE_URL)
        if not isinstance(root, str) or not root.startswith("/") or root.endswith("/") or "//" in root:
            raise ConfigurationError(f"{where} root must be an absolute znode path, got {root!r}",
                                     code=opt.E_ENGINE_URL)
        self.url = url
        self.hosts = hosts + (parts.path.rstrip("/") if parts.path not in ("", "/") else "")
        self.auth = (unquote(parts.username or ""), unquote(parts.password or "")) if parts.username else None
        self.root = root
        self._reset_state()

    def _reset_state(self) -> None:
        self._client: KazooClient | None = None
        self._mutex = threading.RLock()
        self._connected = threading.Event()
        self._tried = False                      # a first connection was waited for already
        self._connect_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._claims: dict[tuple[str, str, str, str], _Claim] = {}   # held, by (group, name, owner, mode)
        self._live: set[str] = set()             # nodes of claims in progress or held
        self._creating: set[tuple[str, str]] = set()    # (lockpath, prefix) with a create in flight
        self._orphans: set[str] = set()          # nodes to delete once connected
        self._orphan_prefixes: set[tuple[str, str]] = set()   # (lockpath, prefix): any such node not live
        self._expiring: dict[tuple[str, str, str, str], tuple[_Claim, float]] = {}   # detached holds: until
        self._released: dict[str, float] = {}    # lock path -> when it was last released
        self._keeper: threading.Thread | None = None
        self._keeper_wake = threading.Condition(threading.Lock())

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ZooKeeperEngine:
        """Build an engine from a URL; query parameters and keyword ``options`` are engine
        options (see the module docstring)."""
        unknown = sorted(set(options) - set(cls.url_options))
        if unknown:
            raise ConfigurationError(f"unknown ZooKeeper engine option{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(unknown)}", code=opt.E_ENGINE_URL,
                                     hint=f"known: {', '.join(sorted(cls.url_options))}")
        return super().from_url(url, **options)  # type: ignore[return-value]

    def url_for_display(self) -> str:
        return f"zookeeper://{self.hosts}"

    # -- connection -------------------------------------------------------------------------

    def _kazoo(self) -> KazooClient:
        """The kazoo client, started (in the background) on first use."""
        client = self._client
        if client is None:
            with self._mutex:
                if self._client is None:
                    auth = [("digest", f"{self.auth[0]}:{self.auth[1]}")] if self.auth else None
                    kazoo_logger = logging.getLogger(f"{__name__}.kazoo")
                    if not any(isinstance(f, _OncePerMinute) for f in kazoo_logger.filters):
                        kazoo_logger.addFilter(_OncePerMinute())
                    self._client = KazooClient(hosts=self.hosts, timeout=self.session_timeout, auth_data=auth,
                                               connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
                                               logger=kazoo_logger,
                                               handler=_Handler() if hasattr(select, "poll") else None)
                    self._client.add_listener(self._on_state)
                    with warnings.catch_warnings():
                        # kazoo warns when the chroot does not exist yet; creates make it.
                        warnings.filterwarnings("ignore", "No chroot path exists")
                        self._client.start_async()
                client = self._client
        return client

    @property
    def client(self) -> KazooClient:
        """The kazoo client (started on first use; it may not be connected yet)."""
        return self._kazoo()

    def _on_state(self, state: str) -> None:
        # Runs in kazoo's event thread: never block here.
        if state == KazooState.CONNECTED:
            self._connected.set()
            with self._mutex:
                waiters, self._connect_waiters = self._connect_waiters, []
            for loop, future in waiters:
                loop.call_soon_threadsafe(settle, future, None, None)
            self._wake_keeper()
        else:
            self._connected.clear()
        if state == KazooState.LOST:
            with self._mutex:
                claims = list(self._claims.values())
            for claim in claims:
                claim.lost = True
            HOLDS.mark_lost(self, detail="ZooKeeper session lost (expired or closed)")
        else:
            # A suspended connection puts every hold at risk until it reconnects in time
            # (the session, and with it the holds, survive) or the session expires (LOST).
            kind = events.SUSPENDED if state == KazooState.SUSPENDED else events.RECONNECTED
            for h in HOLDS.holds(self):
                if not h.lost:
                    events.publish(kind, h.group, h.name, self.scheme, None, owner=h.owner, token=h.token,
                                   detail=f"ZooKeeper connection {'suspended' if state != 'CONNECTED' else 'back'}")

    def _connect_wait(self, left: float | None, deadline: float | None) -> float:
        """How long a call may wait for a connection: the first call of the engine up to
        ``connect_timeout`` (a cold start), later ones only within their own deadline (the
        client reconnects in the background)."""
        first = not self._tried
        self._tried = True
        wait = self.connect_timeout if first else \
            (self.connect_timeout if deadline is None else max(0.0, deadline - time.monotonic()))
        return wait if left is None else min(wait, left)

    def ping(self) -> None:
        """Raise EngineUnavailable unless the server answers; make sure the root znode exists."""
        self._sync(lambda call: self._kazoo().ensure_path_async(self.root).get(timeout=self.connect_timeout))

    def _after_fork(self) -> None:
        # The parent's session and threads are not ours: start over, without closing them.
        self._reset_state()

    def close(self) -> None:
        with self._mutex:
            client, self._client = self._client, None
            self._connected.clear()
            self._tried = False
        self._wake_keeper()                      # it stops with the client
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()

    # -- the executors ---------------------------------------------------------------------------

    def _start(self, client: KazooClient, req: tuple[Any, ...]) -> Any:
        kind, path = req[0], req[1]
        if kind == "create":
            return client.create_async(path, req[2], ephemeral=True, sequence=True, makepath=True,
                                       include_data=True)
        if kind == "children":
            return client.get_children_async(path, watch=req[2])
        if kind == "exists":
            return client.exists_async(path, watch=req[2])
        if kind == "get":
            return client.get_async(path, watch=req[2])
        if kind == "delete":
            return client.delete_async(path)
        if kind == "set":
            return client.set_async(path, req[2])
        raise ValueError(f"unknown request {kind!r}")

    def _sendable(self) -> KazooClient:
        client = self._kazoo()
        if not client.connected:
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected ({client.state})")
        return client

    def _do(self, op: tuple[Any, ...]) -> Any:
        """Do one operation of the steps, blocking (the sync world's executor)."""
        kind = op[0]
        if kind == "send":
            client = self._sendable()
            pending = [self._start(client, req) for req in op[1]]
            end = time.monotonic() + op[2]
            results = []
            for result in pending:
                try:
                    results.append(result.get(timeout=max(0.0, end - time.monotonic())))
                except _ANSWERS as exc:
                    results.append(exc)
            return results
        if kind == "wait":
            return op[1].wait(op[2])
        if kind == "connect":
            self._kazoo()
            if not self._connected.wait(op[1]):
                raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected after {op[1]:.3g} s")
            return None
        time.sleep(op[1])          # "sleep"
        return None

    async def _ado(self, op: tuple[Any, ...]) -> Any:
        """Do one operation of the steps, awaiting it (the asyncio world's executor): kazoo's
        asynchronous results and watches resolve asyncio futures, so no thread waits."""
        kind = op[0]
        if kind == "send":
            client = self._sendable()
            loop = asyncio.get_running_loop()
            futures = []
            for req in op[1]:
                future: asyncio.Future[Any] = loop.create_future()
                self._start(client, req).rawlink(lambda result, f=future: _resolve(loop, f, result))
                futures.append(future)
            try:
                done = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), op[2])
            except asyncio.TimeoutError:
                raise KazooTimeoutError(f"no answer within {op[2]:.3g} s") from None
            results = []
            for value in done:
                if isinstance(value, BaseException) and not isinstance(value, _ANSWERS):
                    raise value
                results.append(value)
            return results
        if kind == "wait":
            return await op[1].await_(op[2])
        if kind == "connect":
            self._kazoo()
            if not self._connected.is_set():
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                with self._mutex:
                    self._connect_waiters.append((loop, future))
                if self._connected.is_set():
                    return None
                try:
                    await asyncio.wait_for(future, op[1])
                except asyncio.TimeoutError:
                    raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected after {op[1]:.3g} s") \
                        from None
            return None
        await asyncio.sleep(op[1])
        return None

    def _translate(self, exc: Exception, group: str | None = None, name: str | None = None) -> Exception:
        """Return the ylock error for a kazoo error: the one place this engine maps them."""
        if isinstance(exc, LockError):
            return exc
        if isinstance(exc, _UNAVAILABLE):
            return EngineUnavailable(f"ZooKeeper at {self.hosts} is unavailable: {type(exc).__name__} {exc}",
                                     group=group, name=name)
        if isinstance(exc, KazooException):
            return LockError(f"ZooKeeper at {self.hosts} failed: {type(exc).__name__} {exc}", group=group, name=name)
        return exc

    # -- ownership --------------------------------------------------------------------------------

    def _lockpath(self, group: str, name: str, mode: str = WRITE) -> str:
        """The znode of a lock, or of a semaphore (mode "permit": under ``<root>/:sem``,
        which no group can name: groups hold no ":")."""
        if mode == PERMIT:
            return f"{self.root}/:sem/{_escape(group)}/{_escape(name)}"
        return f"{self.root}/{_escape(group)}/{_escape(name)}"

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        token = self._downgrade(r)
        if token is not None:
            return token
        return run_steps(self._acquire_steps(r), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._translate(exc, r.group, r.name))

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        token = self._downgrade(r)
        if token is not None:
            return token
        return await arun_steps(self._acquire_steps(r), self._ado,  # type: ignore[no-any-return]
                                lambda exc: self._translate(exc, r.group, r.name))

    def _downgrade(self, r: AcquireRequest) -> int | None:
        """A writer taking the read lock: its write node carries the read hold."""
        if r.mode != READ:
            return None
        write = self._claims.get((r.group, r.name, r.owner, WRITE))
        if write is None:
            return None
        write.downgraded = True
        self._claims[(r.group, r.name, r.owner, READ)] = write
        return write.token

    def _acquire_steps(self, r: AcquireRequest) -> Steps:
        """Create our node, then wait until no child before it blocks us (module docstring).
        Every request is bounded by what is left of the call's budget (the deadline plus
        ``connect_timeout``); waits end at the deadline."""
        lockpath = self._lockpath(r.group, r.name, r.mode)
        claim = _Claim(self, (r.group, r.name, r.owner, r.mode), lockpath, r.mode)
        # A semaphore's node carries the permit count asked for (describe() shows it), and
        # its holders and waiters keep a child watch: any node leaving may let one in.
        permit = r.mode == PERMIT
        claim.context = r.context
        data = (f"p{r.permits}|" if permit else _LETTER[r.mode]).encode() + r.context.encode()
        end = None if r.deadline is None else r.deadline + self.connect_timeout
        flight = (lockpath, claim.prefix)
        watched = False              # a children read has left its child watch
        self._creating.add(flight)
        try:
            while True:
                if not self._connected.is_set():
                    yield ("connect", self._reconnect_wait(claim, r, end))
                left = self._left(end)
                try:
                    if claim.node is None and not claim.unsure:
                        created, children = yield ("send", [("create", f"{lockpath}/{claim.prefix}", data),
                                                            ("children", lockpath, claim.on_watch)], left)
                        if isinstance(created, Exception):
                            raise created
                        self._own(claim, created[0], int(created[1].czxid))
                        if isinstance(children, NoNodeError):    # the parent was made by the create
                            continue
                        watched = True
                    else:
                        # The first successful read of the children leaves the child watch
                        # (see the module docstring); later reads need none.
                        children, = yield ("send", [("children", lockpath,
                                                     None if watched and not permit else claim.on_watch)], left)
                        if isinstance(children, NoNodeError):
                            children = []
                        else:
                            watched = True
                except EngineUnavailable:
                    if claim.node is None:
                        claim.unsure = True
                    if r.deadline is not None and time.monotonic() >= r.deadline:
                        raise
                    yield ("connect", self._reconnect_wait(claim, r, end))
                    continue
                mine = self._mine(claim, children)
                if mine is None:
                    if not claim.unsure:
                        self._forget(claim)      # deleted under us (a force-release): queue again
                    claim.unsure = False         # (or, after a create without answer: not created)
                    continue
                if not claim.token:              # ours, found after a create without answer
                    stat, = yield ("send", [("exists", claim.node, None)], self._left(end))
                    if stat is None or isinstance(stat, Exception):
                        self._forget(claim)
                        continue
                    claim.token = int(stat.czxid)
                claim.unsure = False
                # Nodes of ours but for this one were left by earlier attempts of this owner
                # whose create got no answer (kazoo sends a request queued during a
                # disconnection once it reconnects): they block nobody of ours, and go.
                for child in children:
                    if child.startswith(claim.prefix) and child != mine:
                        self._orphan(f"{lockpath}/{child}")
                blockers = _blockers([c for c in children if c == mine or not c.startswith(claim.prefix)],
                                     mine, r.mode)
                if len(blockers) < (r.permits if permit else 1):
                    return self._granted(claim)
                if r.deadline is not None and time.monotonic() >= r.deadline:
                    yield from self._give_up(claim, end)
                    return None
                if permit:
                    yield from self._wait_for_change(claim, r, end)
                    continue
                granted = yield from self._wait(claim, r, blockers, end)
                if granted:
                    return self._granted(claim)
        except GeneratorExit:
            raise
        except Abandon:
            yield from self._give_up(claim, end)
            raise
        except BaseException:
            if not claim.held:
                yield from self._give_up(claim, end)
            raise
        finally:
            self._creating.discard(flight)

    def _wait(self, claim: _Claim, r: AcquireRequest, blockers: list[str], end: float | None) -> Steps:
        """Watch the nearest blocker (and, once, our own node), then wait for an event;
        return True when the lock is ours without another look at the children."""
        target = f"{claim.lockpath}/{blockers[-1]}"
        reader = r.mode == READ
        requests: list[tuple[Any, ...]] = [("get" if reader else "exists", target, claim.on_watch)]
        if not claim.own_watched:
            requests.append(("exists", claim.node, claim.on_watch))
        try:
            answers = yield ("send", requests, self._left(end))
        except EngineUnavailable:
            if r.deadline is not None and time.monotonic() >= r.deadline:
                raise
            return False
        if len(answers) > 1:
            claim.own_watched = True
            if answers[1] is None:
                self._forget(claim)
                return False
        first = answers[0]
        if first is None or isinstance(first, NoNodeError):
            return False                         # gone already: look again
        if reader and first[0][:1] == b"r":
            return True                          # a downgraded writer: readers share with it
        only = len(blockers) == 1
        while True:
            wait = None if r.deadline is None else r.deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False                     # the caller sees the deadline and gives up
            event = yield ("wait", claim.mailbox, wait)
            if event is None:
                continue
            if event.type == EventType.NONE:
                # The connection dropped (kazoo fires every watch): not a deletion. Look
                # again once it is back; our watches must be set again too.
                claim.own_watched = False
                yield ("connect", self._reconnect_wait(claim, r, end))
                return False
            if event.path == claim.node:
                if event.type == EventType.DELETED:
                    self._forget(claim)
                    return False
                claim.own_watched = False
                return False
            if event.path == target:
                return event.type == EventType.DELETED and only
            # a stale watch from an earlier look: keep waiting

    def _wait_for_change(self, claim: _Claim, r: AcquireRequest, end: float | None) -> Steps:
        """A semaphore's waiter: wait for its child watch (any node leaving may admit it), or
        a dropped connection, or the deadline; the caller reads the children again."""
        wait = None if r.deadline is None else r.deadline - time.monotonic()
        if wait is not None and wait <= 0:
            return
        event = yield ("wait", claim.mailbox, wait)
        if event is not None and event.type == EventType.NONE:
            yield ("connect", self._reconnect_wait(claim, r, end))

    def _mine(self, claim: _Claim, children: list[str]) -> str | None:
        """Return our node among ``children`` (after a create without answer: the earliest of
        ours, the others deleted in the background), or None if it is not there."""
        if claim.node is not None:
            base = claim.node.rsplit("/", 1)[1]
            return base if base in children else None
        if not claim.unsure:
            return None
        ours = sorted((c for c in children if c.startswith(claim.prefix)), key=lambda c: c[-10:])
        if not ours:
            return None
        for extra in ours[1:]:
            self._orphan(f"{claim.lockpath}/{extra}")
        self._own(claim, f"{claim.lockpath}/{ours[0]}", 0)
        return ours[0]

    def _own(self, claim: _Claim, node: str, token: int) -> None:
        claim.node = node
        claim.token = token
        claim.own_watched = False
        self._live.add(node)

    def _forget(self, claim: _Claim) -> None:
        if claim.node is not None:
            self._live.discard(claim.node)
        claim.node = None
        claim.own_watched = False

    def _granted(self, claim: _Claim) -> int:
        claim.held = True
        with self._mutex:
            self._claims[claim.key] = claim
            self._released.pop(claim.lockpath, None)
        while (event := claim.mailbox.take()) is not None:     # watches that fired while we decided
            self._held_event(claim, event)
        return claim.token

    def _give_up(self, claim: _Claim, end: float | None) -> Steps:
        """Delete our node (a timeout, a cancellation, an error) within what is left of the
        call's budget ``end`` (at most one request's time); if there is no time left, or no
        connection, or no answer, the keeper deletes it in the background once connected."""
        node = claim.node
        claim.released = True
        self._forget(claim)
        if node is None:
            if claim.unsure:
                self._orphan_prefix(claim.lockpath, claim.prefix)
            return
        budget = self.connect_timeout if end is None else min(self.connect_timeout, end - time.monotonic())
        if budget < 0.005 or not self._connected.is_set():
            self._orphan(node)
            return
        try:
            yield ("send", [("delete", node)], budget)
        except (EngineUnavailable, LockError):
            self._orphan(node)

    def _reconnect_wait(self, claim: _Claim, r: AcquireRequest, end: float | None) -> float:
        """How long an acquisition waits for a lost connection to come back. A queued
        waiter's node keeps its place while the session lives, so it waits to the end of its
        deadline (a wait without deadline: one session timeout, after which the node is gone
        anyway); a call that has queued nothing yet waits as a new call would."""
        if claim.node is not None or claim.unsure:
            if r.deadline is None:
                return self.session_timeout
            return max(0.0, r.deadline - time.monotonic())
        return self._connect_wait(self._left(end), r.deadline)

    def _left(self, end: float | None) -> float:
        if end is None:
            return self.connect_timeout
        return max(0.001, min(self.connect_timeout, end - time.monotonic()))

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        return run_steps(self._release_steps(group, name, owner, mode), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._translate(exc, group, name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return await arun_steps(self._release_steps(group, name, owner, mode),  # type: ignore[no-any-return]
                                self._ado, lambda exc: self._translate(exc, group, name))

    def _release_steps(self, group: str, name: str, owner: str, mode: str) -> Steps:
        with self._mutex:
            claim = self._claims.pop((group, name, owner, mode), None)
        if claim is None or claim.node is None:
            return False
        other = (group, name, owner, READ if mode == WRITE else WRITE)
        if claim.downgraded and self._claims.get(other) is claim:
            if mode == WRITE and not claim.lost:
                # The write hold ends, the read hold stays on the same node: other readers
                # may share it now, writers still wait (the node keeps its place).
                try:
                    yield ("send", [("set", claim.node, b"r" + claim.context.encode())], self.connect_timeout)
                except EngineUnavailable:
                    self._claims[(group, name, owner, mode)] = claim
                    raise
            return not claim.lost
        claim.released = True
        node, claim.node = claim.node, None
        self._live.discard(node)
        # Delete our node even when the hold was reported lost: if it is still there it is
        # ours (a connection drop is not a loss), and left behind it would block everyone.
        try:
            if not self._connected.is_set():
                yield ("connect", self.connect_timeout)
            deleted, = yield ("send", [("delete", node)], self.connect_timeout)
        except EngineUnavailable as exc:
            self._orphan(node)
            raise EngineUnavailable(f"could not delete the lock node {node} ({exc}); it is deleted when the "
                                    "connection is back, or by ZooKeeper when the session expires",
                                    group=group, name=name) from exc
        with self._mutex:
            self._released[claim.lockpath] = time.monotonic()
        self._start_keeper()
        return not isinstance(deleted, NoNodeError) and not claim.lost

    # -- holds: watches and loss ---------------------------------------------------------------

    def _held_event(self, claim: _Claim, event: Any) -> None:
        """A watch of a held claim fired (in kazoo's thread)."""
        if event is None or claim.lost or claim.node is None:
            return
        if event.type == EventType.NONE:
            claim.recheck = True              # look at our node once the connection is back
            claim.own_watched = False
            self._wake_keeper()
            return
        if event.path == claim.node and event.type == EventType.DELETED:
            self._lose(claim, "its lock node was deleted")
            return
        if event.path == claim.node or not claim.own_watched:
            self._watch_own(claim)            # a child changed (or our own data): watch our node

    def _watch_own(self, claim: _Claim) -> None:
        """Watch our node (asynchronously); report the hold lost if it is gone."""
        client = self._client
        node = claim.node
        if client is None or node is None or not client.connected:
            claim.recheck = True
            return
        claim.own_watched = True

        def answered(result: Any) -> None:
            try:
                stat = result.get_nowait()
            except Exception:  # noqa: BLE001 - no answer (connection loss): checked again once back
                claim.recheck = True
                claim.own_watched = False
                return
            if stat is None:
                self._lose(claim, "its lock node was deleted")
        client.exists_async(node, watch=claim.on_watch).rawlink(answered)

    def _lose(self, claim: _Claim, why: str) -> None:
        if claim.lost or claim.released:
            return
        claim.lost = True
        group, name, owner, _ = claim.key
        report = functools.partial(HOLDS.mark_lost, self, group, name, owner, detail=why)
        client = self._client
        if client is not None and client.handler.running:
            # The "lost" event's subscribers are anybody's code, and this may run in kazoo's
            # connection thread (see _Handler): report it from the callback thread.
            client.handler.dispatch_callback(Callback("loss", report, ()))
        else:
            report()

    # -- the keeper: background deletes and tidying (the seed's LockKeeper) -----------------------

    def _orphan(self, node: str) -> None:
        with self._mutex:
            self._orphans.add(node)
        self._start_keeper(wake=True)

    def _orphan_prefix(self, lockpath: str, prefix: str) -> None:
        with self._mutex:
            self._orphan_prefixes.add((lockpath, prefix))
        self._start_keeper(wake=True)

    def _start_keeper(self, wake: bool = False) -> None:
        """Start the keeper thread unless it runs; ``wake`` it for work that cannot wait for
        its next round (a release does not: it wakes every ``idle / 2`` anyway, and a wake-up
        per release would cost the lock path a thread switch)."""
        if self._keeper is None or not self._keeper.is_alive():
            with self._mutex:
                if self._keeper is None or not self._keeper.is_alive():
                    self._keeper = threading.Thread(target=self._keep, name="ylock-zk-keeper", daemon=True)
                    self._keeper.start()
        elif wake:
            self._wake_keeper()

    def _wake_keeper(self) -> None:
        with self._keeper_wake:
            self._keeper_wake.notify()

    def _keep(self) -> None:
        while self._client is not None:
            with self._keeper_wake:
                self._keeper_wake.wait(self.idle / 2)
            if self._client is None:
                return
            try:
                self.tidy()
            except Exception:  # noqa: BLE001 - a failed round must not stop the next ones
                logger.debug("ylock: zookeeper tidying failed", exc_info=True)

    def tidy(self) -> int:
        """Delete nodes whose owners gave up on them, recheck holds after a reconnection, and
        delete lock parents unused for ``idle`` seconds; return how many parents were deleted."""
        client = self._client
        if client is None or not client.connected:
            return 0
        now = time.monotonic()
        with self._mutex:
            for key, (claim, until) in list(self._expiring.items()):
                if until <= now:           # a detached hold nobody adopted within its lease
                    del self._expiring[key]
                    if self._claims.get(key) is claim and claim.node is not None:
                        del self._claims[key]
                        claim.released = True
                        self._live.discard(claim.node)
                        self._orphans.add(claim.node)
            orphans, self._orphans = self._orphans, set()
            prefixes, self._orphan_prefixes = self._orphan_prefixes, set()
            recheck = [c for c in self._claims.values() if c.recheck and not c.lost]
        for claim in recheck:
            claim.recheck = False
            self._watch_own(claim)
        for node in orphans:
            try:
                client.delete_async(node).get(timeout=self.connect_timeout)
            except NoNodeError:
                pass
            except Exception:  # noqa: BLE001 - try again next round
                self._orphan(node)
        for lockpath, prefix in prefixes:
            if (lockpath, prefix) in self._creating:
                self._orphan_prefix(lockpath, prefix)     # a new attempt is in flight: later
                continue
            try:
                children = client.get_children_async(lockpath).get(timeout=self.connect_timeout)
            except NoNodeError:
                continue
            except Exception:  # noqa: BLE001
                self._orphan_prefix(lockpath, prefix)
                continue
            for child in children:
                node = f"{lockpath}/{child}"
                if child.startswith(prefix) and node not in self._live:
                    self._orphans.add(node)
        if self._orphans:
            self._wake_keeper()
        return self.reap()

    def reap(self, older_than: float | None = None) -> int:
        """Delete lock parents unused for ``older_than`` seconds (default: the idle period);
        return how many were deleted."""
        cutoff = time.monotonic() - (self.idle if older_than is None else older_than)
        with self._mutex:
            held = {c.lockpath for c in self._claims.values()}
            paths = [p for p, t in self._released.items() if t <= cutoff and p not in held]
            for p in paths:
                del self._released[p]
        client = self._client
        if not paths or client is None or not client.connected:
            return 0
        results = [client.delete_async(p) for p in paths]
        deleted = 0
        for result in results:
            try:
                result.get(timeout=self.connect_timeout)
                deleted += 1
            except (NotEmptyError, NoNodeError):
                pass             # someone queued again, or another process tidied it first
        for g in [client.delete_async(g) for g in {p.rsplit("/", 1)[0] for p in paths}]:
            with contextlib.suppress(NotEmptyError, NoNodeError, KazooException):
                g.get(timeout=self.connect_timeout)
        return deleted

    # -- inspection --------------------------------------------------------------------------

    def _sync(self, func: Callable[[Callable[..., Any]], Any], group: str | None = None,
              name: str | None = None) -> Any:
        """Run an inspection, connected, each request bounded by ``connect_timeout``, errors
        translated. ``func`` gets ``call(kind, path, *args)`` that returns a request's result."""
        try:
            self._do(("connect", self._connect_wait(None, None)))
            client = self._sendable()

            def call(*req: Any) -> Any:
                return self._start(client, req).get(timeout=self.connect_timeout)
            return func(call)
        except Exception as exc:
            raise self._translate(exc, group, name) from exc

    def describe(self, group: str | None = None) -> list[LockInfo]:
        def look(call: Callable[..., Any]) -> list[LockInfo]:
            infos = []
            for kind, top in ((LOCK, self.root), (SEMAPHORE, f"{self.root}/:sem")):
                try:
                    groups = [_escape(group)] if group else sorted(
                        g for g in call("children", top, None) if not g.startswith(":"))
                except NoNodeError:
                    continue
                for g in groups:
                    try:
                        names = sorted(call("children", f"{top}/{g}", None))
                    except NoNodeError:
                        continue
                    for n in names:
                        info = self._describe_one(call, kind, _unescape(g), _unescape(n))
                        if info is not None:
                            infos.append(info)
            return infos
        return self._sync(look, group)  # type: ignore[no-any-return]

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        return self._sync(lambda call: self._describe_one(call, kind, group, name), group, name)  # type: ignore[no-any-return]

    def _describe_one(self, call: Callable[..., Any], kind: str, group: str, name: str) -> LockInfo | None:
        lockpath = self._lockpath(group, name, PERMIT if kind == SEMAPHORE else WRITE)
        try:
            children = call("children", lockpath, None)
        except NoNodeError:
            return None
        nodes = []
        permits = None
        context = {}
        for child in sorted(children, key=lambda c: c[-10:]):
            parsed = _parse(child)
            if parsed is None:
                continue
            mode, owner = parsed
            try:
                data, stat = call("get", f"{lockpath}/{child}", None)
            except NoNodeError:
                continue
            said = data[1:]
            if mode == PERMIT:
                count, _, said = said.partition(b"|")
                permits = int(count or 1) if permits is None else permits
            context[owner] = holder_context(owner, stat.ctime / 1000, said.decode(errors="replace"))
            nodes.append((READ if data[:1] == b"r" else mode, owner, int(stat.czxid)))
        if not nodes:
            return None
        holders: list[tuple[str, str, int]] = []
        if kind == SEMAPHORE:
            holders = nodes[:permits or 1]
        else:
            for node in nodes:
                if node[0] == WRITE:
                    if not holders:
                        holders.append(node)
                    break
                holders.append(node)
        waiters = tuple(f"{mode}:{owner}" for mode, owner, _ in nodes[len(holders):])
        if not holders:
            return LockInfo(group, name, None, (), waiters, None, None, kind, permits, context)
        return LockInfo(group, name, holders[0][0], tuple(h[1] for h in holders), waiters, None,
                        max(h[2] for h in holders), kind, permits, context)

    def detached(self, group: str, name: str, mode: str, owner: str, lease: float) -> None:
        # The session keeps the node alive: a ticket never adopted would block for good.
        with self._mutex:
            claim = self._claims.get((group, name, owner, mode))
            if claim is not None:
                self._expiring[claim.key] = (claim, time.monotonic() + lease)
        self._start_keeper()

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Within this process only: the node stays where it is (in this engine's session) and
        changes owner here. Across processes a ZooKeeper hold cannot change hands: it lives in
        the session that created its node, and a node made anew in another session would get a
        new place in the queue (or, at the old place, mislead the waiter watching it)."""
        with self._mutex:
            claim = self._claims.get((group, name, old_owner, mode))
            if claim is None or claim.lost or claim.token != token or claim.node is None:
                return False
            del self._claims[(group, name, old_owner, mode)]
            self._expiring.pop(claim.key, None)
            claim.key = (group, name, new_owner, mode)
            self._claims[claim.key] = claim
        return True

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        # An ephemeral node per process under ":stats" (never a group: groups hold no ":"):
        # it goes with the process's session; the ttl is kept
        # in the data (read_stats skips what is older), as ZooKeeper has no expiry of its own.
        path = f"{self.root}/:stats/{_escape(process)}"
        stamped = f"{time.time() + ttl:.3f}\n".encode() + data

        def put(call: Callable[..., Any]) -> None:
            try:
                call("set", path, stamped)
            except NoNodeError:
                self._kazoo().create_async(path, stamped, ephemeral=True, makepath=True).get(
                    timeout=self.connect_timeout)
        self._sync(put)

    def read_stats(self) -> dict[str, bytes]:
        def look(call: Callable[..., Any]) -> dict[str, bytes]:
            try:
                children = call("children", f"{self.root}/:stats", None)
            except NoNodeError:
                return {}
            out = {}
            now = time.time()
            for child in children:
                try:
                    data, _ = call("get", f"{self.root}/:stats/{child}", None)
                except NoNodeError:
                    continue
                until, _, body = data.partition(b"\n")
                if float(until or 0) > now:
                    out[_unescape(child)] = body
            return out
        return self._sync(look)  # type: ignore[no-any-return]

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        lockpath = self._lockpath(group, name, PERMIT if kind == SEMAPHORE else WRITE)

        def drop(call: Callable[..., Any]) -> bool:
            try:
                children = call("children", lockpath, None)
            except NoNodeError:
                return False
            had = False
            # The waiters first, the holders last: a waiter then never sees its blocker go
            # while its own node is still there, and so never believes itself the holder.
            for child in sorted(children, key=lambda c: c[-10:], reverse=True):
                with contextlib.suppress(NoNodeError):
                    call("delete", f"{lockpath}/{child}")
                    had = True
            return had
        return self._sync(drop, group, name)  # type: ignore[no-any-return]


def _escape(text: str) -> str:
    """A group or name as a znode name: ZooKeeper refuses characters outside the BMP (Java
    sees surrogates), private use and U+FFF0-U+FFFF in paths; those and "%" are written as
    %XX of their UTF-8 bytes (names never hold "/" or control characters)."""
    if all(c != "%" and c < "\ue000" or "\uf8ff" < c < "\ufff0" for c in text):
        return text
    return "".join(c if c != "%" and (c < "\ue000" or "\uf8ff" < c < "\ufff0")
                   else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def _unescape(text: str) -> str:
    return unquote(text) if "%" in text else text


def _blockers(children: list[str], mine: str, mode: str) -> list[str]:
    """The children before ``mine`` that block it, in sequence order (the last is nearest);
    a semaphore's permit: every holder or waiter before it (it enters when fewer than the
    permits are)."""
    seq = mine[-10:]
    ahead = sorted((c for c in children if c[-10:] < seq and _parse(c) is not None), key=lambda c: c[-10:])
    if mode != READ:
        return ahead
    return [c for c in ahead if c.startswith("w-")]


def _parse(child: str) -> tuple[str, str] | None:
    """(mode, owner) of a lock node's name, or None for something else."""
    if len(child) < 13 or child[1] != "-" or child[0] not in "wrp" or not child[-10:].isdigit():
        return None
    return {"w": WRITE, "r": READ, "p": PERMIT}[child[0]], child[2:-11]


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any) -> None:
    """kazoo's thread: copy an asynchronous result into an asyncio future."""
    try:
        value = result.get_nowait()
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
        loop.call_soon_threadsafe(settle, future, None, exc)
    else:
        loop.call_soon_threadsafe(settle, future, value, None)


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

