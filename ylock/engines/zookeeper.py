"""ZooKeeperEngine: kazoo's read/write lock recipes, made reentrant, kept tidy and fenced.

URL::

    zookeeper://[user:password@]host1:2181,host2:2181[/chroot][?options]

``user:password`` become kazoo ``digest`` auth. Options (query parameters or keyword
arguments): ``session_timeout`` (seconds, default 10: this is the lease: a holder whose
session expires loses its locks), ``connect_timeout`` (default 5), ``root`` (the znode
under which locks live, default ``/ylock``), ``idle`` (seconds after which an unused lock
parent znode is deleted and a cached recipe dropped, default 2).

How it works (the seed's LockKeeper): every lock is the znode ``<root>/<group>/<name>``;
kazoo's ``WriteLock``/``ReadLock`` put sequential ephemeral children under it, so waiters
are served in creation order (fair, always: a non-fair request is served fairly too). The
engine caches one recipe instance per lock, owner and mode, so a thread that takes the
same lock again skips kazoo's ``ensure_path``; reentrancy is counted by the facade. A
background reaper deletes lock parents that stayed empty for ``idle`` seconds and drops
idle recipes, so fine-grained locks (one name per user) do not grow ZooKeeper without
bound (kazoo leaves the parents behind).

Fencing token: the lock node's ``czxid``, read from the create reply (CREATE2: no extra
round trip). zxids increase across the whole ensemble, so tokens strictly increase per
lock name, also after its parent was deleted.

Guarantees: exclusion holds while the holder's session lives; quorum writes are not lost
on failover. A session that expires (the process paused past ``session_timeout``, or cut
off) marks every hold lost (``lock.lost``, ``LockLost`` at release, a ``lost`` event); a
suspended connection publishes a ``suspended`` event. A force-released hold is detected
through the child watch that the recipe's own "am I first?" read leaves on the lock
parent (no request of its own): when the lock's nodes change, the engine checks, once,
that the holder's node is still there, and watches it from then on. Requests per
uncontended acquire+release: 3 (create, get_children, delete; kazoo's own recipe, reused,
makes 4). Downgrade: a writer may take the read lock, but on ZooKeeper
its hold stays exclusive until it releases the read lock too (creating a read node while
writers queue behind the write node would let one of them in early).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    CancelledError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.exceptions import LockTimeout as KazooLockTimeout
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType
from kazoo.recipe.lock import ReadLock, WriteLock
from kazoo.retry import KazooRetry, RetryFailedError

from ylock import events
from ylock import options as opt
from ylock.engines.base import READ, WRITE, AcquireRequest, Engine, LockInfo
from ylock.errors import ConfigurationError, EngineUnavailable, LockError
from ylock.holds import HOLDS

logger = logging.getLogger(__name__)

_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
                KazooTimeoutError, RetryFailedError)


class _RecordingClient:
    """The KazooClient as a recipe sees it, except that

    - ``create`` also fetches the new node's stat in the same round trip (CREATE2) and
      keeps it: its czxid is the token;
    - ``get_children`` (the recipe's "am I first?" read) also leaves a child watch on the
      lock parent: every change of the lock's nodes then calls :attr:`on_change`, which
      checks that the holder's node is still there. So a force-release is seen without
      a request of its own on the uncontended path.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self.stat: Any = None
        self.changed = False                       # a child watch fired since the last read
        self.on_change: Callable[[], None] | None = None
        self.arm = False     # our node was created: the recipe's reads now set the watch
        self.last_children: list[str] = []    # what the recipe's last children read found

    def create(self, path: str, value: bytes = b"", **kwargs: Any) -> str:
        created, self.stat = self._client.create(path, value, include_data=True, **kwargs)
        self.arm = True
        return created  # type: ignore[no-any-return]

    def get_children(self, path: str, watch: Any = None, **kwargs: Any) -> Any:
        if watch is None and self.arm:
            self.changed = False
            watch = self._children_changed
        children = self._client.get_children(path, watch=watch, **kwargs)
        self.last_children = children
        return children

    def _children_changed(self, event: Any) -> None:
        self.changed = True
        on_change = self.on_change
        if on_change is not None:
            on_change()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Handoff:
    """kazoo's lock recipe with one read less per contended handoff.

    A waiter reads the lock's children, watches the nearest node ahead of it that blocks
    it, and when that watch fires reads the children again to see whether it is first
    now. If that node was the only one blocking it, its deletion already answers that:
    sequence numbers only grow, so no node can appear ahead of ours. The waiter then
    takes the lock without the second read (a ZooKeeper round trip of the handoff).
    Any other wake-up (a waiter ahead that gave up while others remain, a session event)
    reads the children as kazoo does.
    """

    client: Any
    prefix: str
    _contenders_re: Any
    _only_blocker: tuple[str, str] | None = None   # (our node, the single node ahead blocking it)
    _unblocked: str | None = None                   # our node, once that single blocker was deleted

    def _get_predecessor(self, node: str) -> str | None:
        # Keyed by our node: for that node the answer stays true (nothing can get ahead
        # of it), so a deletion seen after a timed-out attempt misleads no other node.
        if self._unblocked == node:
            return None
        predecessor: str | None = super()._get_predecessor(node)  # type: ignore[misc]
        self._only_blocker = None
        if predecessor is not None:
            mine = node[len(self.prefix):]
            ahead = 0
            for child in self.client.last_children:
                match = self._contenders_re.search(child)
                if match is not None and match.group(1) < mine:
                    ahead += 1
            if ahead == 1:
                self._only_blocker = (node, predecessor)
        return predecessor

    def _watch_predecessor(self, event: Any) -> None:
        only = self._only_blocker
        if (only is not None and event.type == EventType.DELETED
                and event.path.rsplit("/", 1)[-1] == only[1]):
            self._unblocked = only[0]
        super()._watch_predecessor(event)  # type: ignore[misc]


class _WriteLock(_Handoff, WriteLock):  # type: ignore[misc]
    pass


class _ReadLock(_Handoff, ReadLock):  # type: ignore[misc]
    pass


class _Acquirers:
    """Daemon threads that run kazoo's blocking acquire for calls with a finite timeout,
    so the caller never waits past it: reused rather than started per call, one more
    started whenever none is idle (a busy pool never times a caller out), and daemons, so
    an acquire hung on a lost quorum never holds up the interpreter's exit."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = \
            queue.SimpleQueue()
        self._mutex = threading.Lock()
        self._idle = 0

    def submit(self, func: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._mutex:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._work, name="ylock-zk-acquire", daemon=True).start()
        self._tasks.put((func, future))
        return future

    def _work(self) -> None:
        while True:
            func, future = self._tasks.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(func())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
            with self._mutex:
                self._idle += 1


_pool: _Acquirers | None = None
_pool_mutex = threading.Lock()


def _acquirers() -> _Acquirers:
    global _pool
    if _pool is None:
        with _pool_mutex:
            if _pool is None:
                _pool = _Acquirers()
    return _pool


def _forget_pool_after_fork() -> None:
    global _pool, _pool_mutex
    _pool, _pool_mutex = None, threading.Lock()   # the parent's threads do not exist here


os.register_at_fork(after_in_child=_forget_pool_after_fork)


class _Hold:
    __slots__ = ("recipe", "proxy", "node", "token", "downgraded", "lost", "watched")

    def __init__(self, recipe: Any, proxy: _RecordingClient, token: int) -> None:
        self.recipe = recipe
        self.proxy = proxy
        self.node = f"{recipe.path}/{recipe.node}"
        self.token = token
        self.downgraded = False    # a read hold riding on this write node
        self.lost = False
        self.watched = False       # an exists watch on the node is set


class ZooKeeperEngine(Engine):
    """ZooKeeper engine (see module docstring)."""

    scheme = "zookeeper"
    needs_renewal = False
    downgrade_shares = False

    def __init__(self, url: str, *, session_timeout: float = 10.0, connect_timeout: float = 5.0,
                 root: str = "/ylock", idle: float = 2.0) -> None:
        super().__init__()
        parts = urlsplit(url)
        if parts.scheme.lower() != "zookeeper":
            raise ConfigurationError(f"not a ZooKeeper URL: {url!r}", code=opt.E_ENGINE_URL)
        hosts = parts.netloc.rpartition("@")[2]
        if not hosts:
            raise ConfigurationError(f"ZooKeeper URL names no host: {url!r}", code=opt.E_ENGINE_URL)
        where = "ZooKeeper engine option"
        session_timeout = opt.seconds(session_timeout, f"{where} session_timeout", minimum=0.1, maximum=3600,
                                      above=None, code=opt.E_ENGINE_URL)
        connect_timeout = opt.seconds(connect_timeout, f"{where} connect_timeout", maximum=3600,
                                      code=opt.E_ENGINE_URL)
        idle = opt.seconds(idle, f"{where} idle", maximum=86400, code=opt.E_ENGINE_URL)
        if not isinstance(root, str) or not root.startswith("/") or root.endswith("/") or "//" in root:
            raise ConfigurationError(f"{where} root must be an absolute znode path, got {root!r}",
                                     code=opt.E_ENGINE_URL)
        self.url = url
        self.hosts = hosts + (parts.path.rstrip("/") if parts.path not in ("", "/") else "")
        self.auth = (unquote(parts.username or ""), unquote(parts.password or "")) if parts.username else None
        self.session_timeout = float(session_timeout)
        self.connect_timeout = float(connect_timeout)
        self.root = root
        self.idle = float(idle)
        self._client: KazooClient | None = None
        self._mutex = threading.RLock()
        self._holds: dict[tuple[str, str, str, str], _Hold] = {}
        self._recipes: dict[tuple[str, str, str, str], tuple[Any, _RecordingClient, float]] = {}
        self._released: dict[str, float] = {}   # lock path -> when it was last released
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()
        self._connected = threading.Event()

    url_options = {"session_timeout": float, "connect_timeout": float, "root": str, "idle": float}

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

    @contextlib.contextmanager
    def _errors(self, group: str | None = None, name: str | None = None) -> Iterator[None]:
        """Translate kazoo errors into ylock's: the one place this engine does it."""
        try:
            yield
        except LockError:
            raise
        except _UNAVAILABLE as exc:
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is unavailable: {type(exc).__name__} {exc}",
                                    group=group, name=name) from exc
        except KazooException as exc:
            raise LockError(f"ZooKeeper at {self.hosts} failed: {type(exc).__name__} {exc}",
                            group=group, name=name) from exc

    @property
    def client(self) -> KazooClient:
        """The started kazoo client (connects on first use; EngineUnavailable if it cannot)."""
        return self._connected_client(self.connect_timeout)

    def _connected_client(self, wait: float) -> KazooClient:
        """Return the client once connected, waiting up to ``wait`` seconds for a
        (re)connection, e.g. the new session kazoo opens after one expired."""
        client = self._client
        if client is not None and client.connected:
            return client
        with self._mutex:
            if self._client is None:
                auth = [("digest", f"{self.auth[0]}:{self.auth[1]}")] if self.auth else None
                self._client = KazooClient(
                    hosts=self.hosts, timeout=self.session_timeout, auth_data=auth,
                    connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
                    command_retry=KazooRetry(max_tries=3, max_delay=0.5, deadline=self.connect_timeout))
                self._client.add_listener(self._on_state)
                try:
                    with warnings.catch_warnings():
                        # kazoo warns when the chroot does not exist yet; we create it below.
                        warnings.filterwarnings("ignore", "No chroot path exists")
                        self._client.start(timeout=self.connect_timeout)
                    self._client.ensure_path(self.root)
                except KazooTimeoutError as exc:
                    self._client.stop()
                    self._client.close()
                    self._client = None
                    raise EngineUnavailable(f"ZooKeeper at {self.hosts} did not answer within "
                                            f"{self.connect_timeout} s") from exc
            client = self._client
        if not client.connected and not self._connected.wait(wait):
            raise EngineUnavailable(f"ZooKeeper at {self.hosts} is not connected ({client.state}) "
                                    f"after {wait:.3g} s")
        return client

    def _on_state(self, state: str) -> None:
        # Runs in kazoo's event thread: never block here.
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if state == KazooState.LOST:
            with self._mutex:
                holds = list(self._holds.values())
                self._recipes.clear()
            for hold in holds:
                hold.lost = True
            HOLDS.mark_lost(self, detail="ZooKeeper session lost (expired or closed)")
        elif state in (KazooState.SUSPENDED, KazooState.CONNECTED):
            # A suspended connection puts every hold at risk until it reconnects in time
            # (the session, and with it the holds, survive) or the session expires (LOST).
            kind = events.SUSPENDED if state == KazooState.SUSPENDED else events.RECONNECTED
            for h in HOLDS.holds(self):
                if h.lost:
                    continue
                events.publish(kind, h.group, h.name, self.scheme, None, owner=h.owner, token=h.token,
                               detail=f"ZooKeeper connection {'suspended' if kind == events.SUSPENDED else 'back'}")

    def ping(self) -> None:
        with self._errors():
            self.client.exists("/")

    def _after_fork(self) -> None:
        # The parent's session and threads are not ours: start over, without closing them.
        self._client = None
        self._mutex = threading.RLock()
        self._holds = {}
        self._recipes = {}
        self._released = {}
        self._reaper = None
        self._connected = threading.Event()

    def close(self) -> None:
        self._closed.set()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()

    # -- ownership --------------------------------------------------------------------------------

    def _path(self, group: str, name: str) -> str:
        return f"{self.root}/{group}/{name}"

    def _recipe(self, client: KazooClient, key: tuple[str, str, str, str]) -> tuple[Any, _RecordingClient]:
        cached = self._recipes.pop(key, None)
        if cached is not None and cached[0].client._client is client:
            return cached[0], cached[1]
        group, name, owner, mode = key
        proxy = _RecordingClient(client)
        cls = _WriteLock if mode == WRITE else _ReadLock
        return cls(proxy, self._path(group, name), identifier=f"{mode}:{owner}"), proxy

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        key = (r.group, r.name, r.owner, r.mode)
        if r.mode == READ:
            write = self._holds.get((r.group, r.name, r.owner, WRITE))
            if write is not None:      # downgrade: the write node carries the read hold
                write.downgraded = True
                self._holds[key] = write
                return write.token
        with self._errors(r.group, r.name):
            wait = self.connect_timeout if r.deadline is None else \
                min(self.connect_timeout, max(0.0, r.deadline - time.monotonic()))
            client = self._connected_client(wait)
            recipe, proxy = self._recipe(client, key)
            for _attempt in range(5):
                timeout = None if r.deadline is None else max(0.0, r.deadline - time.monotonic())
                try:
                    got = self._acquire_bounded(recipe, timeout)
                except NoNodeError:
                    # The reaper deleted the parent between kazoo's ensure_path and its
                    # create: make sure of the path again and retry.
                    recipe.assured_path = False
                    recipe.create_tried = False
                    continue
                break
            else:
                got = False
        if not got:
            self._keep_recipe(key, recipe, proxy)
            return None
        token = int(proxy.stat.czxid)
        hold = _Hold(recipe, proxy, token)
        with self._mutex:
            self._holds[key] = hold
            self._released.pop(recipe.path, None)
        # The recipe's get_children left a child watch on the lock parent: when the lock's
        # nodes change, check (once) that ours is still there and watch it from then on.
        proxy.on_change = lambda k=key, h=hold: self._check_node(client, k, h)
        proxy.arm = False           # the watch is set; the next acquisition sets it anew
        if proxy.changed:           # it fired before on_change was set
            self._check_node(client, key, hold)
        return token

    def _check_node(self, client: KazooClient, key: tuple[str, str, str, str], hold: _Hold) -> None:
        """Watch ``hold``'s node (asynchronously); report it lost if it is gone."""
        if hold.watched or self._holds.get(key) is not hold:
            return
        hold.watched = True

        def answered(result: Any) -> None:
            try:
                stat = result.get_nowait()
            except Exception:  # noqa: BLE001 - no answer (connection loss): the session events decide
                return
            if stat is None:
                self._node_gone(key, hold)
        client.exists_async(hold.node, watch=lambda event: self._node_gone(key, hold)).rawlink(answered)

    def _acquire_bounded(self, recipe: Any, timeout: float | None) -> bool:
        """Run kazoo's acquire; with a timeout, never block the caller past it (kazoo's
        own acquire can hang on connection retries when the ensemble lost quorum)."""
        if timeout is None:
            try:
                return bool(recipe.acquire(blocking=True))
            except CancelledError:
                return False
        if timeout == 0:
            return bool(recipe.acquire(blocking=False))
        def run() -> bool:
            try:
                return bool(recipe.acquire(blocking=True, timeout=timeout))
            except (KazooLockTimeout, CancelledError):
                return False
        future = _acquirers().submit(run)
        try:
            return bool(future.result(timeout + min(1.0, self.session_timeout / 4)))
        except concurrent.futures.TimeoutError:
            recipe.cancel()
            try:
                return bool(future.result(0.5))
            except concurrent.futures.TimeoutError:
                future.add_done_callback(lambda f: self._release_if_acquired(recipe))
                raise OperationTimeoutError(f"no answer within the {timeout:.3g} s timeout") from None

    @staticmethod
    def _release_if_acquired(recipe: Any) -> None:
        """A hung acquire that we gave up on finally got the lock: give it back."""
        if recipe.is_acquired:
            with contextlib.suppress(Exception):
                recipe.release()

    def _node_gone(self, key: tuple[str, str, str, str], hold: _Hold) -> None:
        if self._holds.get(key) is hold and not hold.lost:
            hold.lost = True
            HOLDS.mark_lost(self, key[0], key[1], key[2], detail="its lock node was deleted")

    def _keep_recipe(self, key: tuple[str, str, str, str], recipe: Any, proxy: _RecordingClient) -> None:
        with self._mutex:
            self._recipes[key] = (recipe, proxy, time.monotonic())
            self._released[recipe.path] = time.monotonic()
        self._start_reaper()

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        key = (group, name, owner, mode)
        with self._mutex:
            hold = self._holds.pop(key, None)
        if hold is None:
            return False
        other = (group, name, owner, READ if mode == WRITE else WRITE)
        if hold.downgraded and self._holds.get(other) is hold:
            return not hold.lost        # the other mode still rides on this node
        if hold.lost:
            return False
        with self._errors(group, name):
            try:
                still_there = hold.recipe.release()
            except NoNodeError:
                still_there = False
        if still_there:
            # Our node is gone for sure: the recipe's next acquire need not look for a
            # node left by an earlier attempt (kazoo would read the children for it).
            hold.recipe.create_tried = False
        self._keep_recipe((group, name, owner, WRITE if isinstance(hold.recipe, WriteLock) else READ),
                          hold.recipe, hold.proxy)
        return bool(still_there) and not hold.lost

    # -- tidying (the LockKeeper) --------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            with self._mutex:
                if self._reaper is None or not self._reaper.is_alive():
                    self._reaper = threading.Thread(target=self._reap_loop, name="ylock-zk-reaper", daemon=True)
                    self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._closed.wait(self.idle / 2):
            try:
                self.reap()
            except Exception:  # noqa: BLE001 - a reaper failure must not stop future reaps
                logger.debug("ylock: zookeeper reap failed", exc_info=True)

    def reap(self, older_than: float | None = None) -> int:
        """Delete lock parents (and drop cached recipes) unused for ``older_than`` seconds
        (default: the idle period); return how many parents were deleted."""
        cutoff = time.monotonic() - (self.idle if older_than is None else older_than)
        with self._mutex:
            held = {h.recipe.path for h in self._holds.values()}
            paths = [p for p, t in self._released.items() if t <= cutoff and p not in held]
            for p in paths:
                del self._released[p]
            for key in [k for k, v in self._recipes.items() if v[2] <= cutoff]:
                del self._recipes[key]
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
        groups = {p.rsplit("/", 1)[0] for p in paths}
        for g in [client.delete_async(g) for g in groups]:
            with contextlib.suppress(NotEmptyError, NoNodeError, KazooException):
                g.get(timeout=self.connect_timeout)
        return deleted

    # -- inspection --------------------------------------------------------------------------

    def describe(self, group: str | None = None) -> list[LockInfo]:
        infos = []
        with self._errors(group):
            client = self.client
            try:
                groups = [group] if group else sorted(client.get_children(self.root))
            except NoNodeError:
                return []
            for g in groups:
                try:
                    names = sorted(client.get_children(f"{self.root}/{g}"))
                except NoNodeError:
                    continue
                for n in names:
                    info = self._describe_one(client, g, n)
                    if info is not None:
                        infos.append(info)
        return infos

    def _describe_one(self, client: KazooClient, group: str, name: str) -> LockInfo | None:
        path = self._path(group, name)
        try:
            children = client.get_children(path)
        except NoNodeError:
            return None
        nodes = []
        for child in children:
            kind = "write" if "__lock__" in child else "read" if "__rlock__" in child else None
            if kind is None:
                continue
            try:
                data, stat = client.get(f"{path}/{child}")
            except NoNodeError:
                continue
            owner = data.decode(errors="replace").partition(":")[2] or "?"
            nodes.append((child[-10:], kind, owner, int(stat.czxid)))
        if not nodes:
            return None
        nodes.sort()
        holders: list[tuple[str, str, str, int]] = []
        for seq, kind, owner, czxid in nodes:
            if kind == "write":
                if not holders:
                    holders.append((seq, kind, owner, czxid))
                break
            holders.append((seq, kind, owner, czxid))
        waiters = tuple(f"{kind}:{owner}" for _, kind, owner, _ in nodes[len(holders):])
        if not holders:
            return LockInfo(group, name, None, (), waiters, None, None)
        mode = holders[0][1]
        return LockInfo(group, name, mode, tuple(h[2] for h in holders), waiters, None, max(h[3] for h in holders))

    def force_release(self, group: str, name: str) -> bool:
        path = self._path(group, name)
        had = False
        with self._errors(group, name):
            client = self.client
            try:
                children = client.get_children(path)
            except NoNodeError:
                return False
            for child in children:
                with contextlib.suppress(NoNodeError):
                    client.delete(f"{path}/{child}")
                    had = True
        return had
