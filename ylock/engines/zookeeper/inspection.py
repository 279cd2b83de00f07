"""What the ZooKeeper engine shows of the server: locks and their queues (describe),
published stats, and the force-release of a lock. Each is a few requests, connected,
each bounded by ``connect_timeout``, errors translated."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from kazoo.exceptions import NoNodeError

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, Listing, LockInfo, holder_context
from ylock.engines.zookeeper import ops, paths
from ylock.engines.zookeeper.ops import CHILDREN, DELETE, GET, SET, Request
from ylock.engines.zookeeper.session import Session

T = TypeVar("T")

#: ``call(kind, path, arg)``: send one request, return its result (raise its error).
Call = Callable[..., Any]


class _Node(NamedTuple):
    """One child of a lock as describe() reads it."""

    mode: str
    owner: str
    token: int


class Inspector:
    """Describe, stats and force-release for one engine's session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.root = session.settings.root
        self.connect_timeout = session.settings.connect_timeout

    def sync(self, func: Callable[[Call], T], group: str | None = None, name: str | None = None) -> T:
        """Run ``func(call)`` connected, each request bounded by ``connect_timeout``, errors
        translated; ``call(kind, path, arg)`` returns a request's result."""
        session = self.session
        try:
            session.wait_connected(session.connect_wait(None, None))
            client = session.sendable()

            def call(kind: str, path: str, arg: Any = None) -> Any:
                return ops.start(client, Request(kind, path, arg)).get(timeout=self.connect_timeout)
            return func(call)
        except Exception as exc:
            raise session.translate(exc, group, name) from exc

    def ping(self) -> None:
        """Raise EngineUnavailable unless the server answers; make sure the root znode exists."""
        self.sync(lambda call: self.session.client().ensure_path_async(self.root).get(timeout=self.connect_timeout))

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        """Return the locks and semaphores (of ``group``, if given) with a node now, the first
        ``limit`` of them in (group, name, kind) order. The lock parents are what is held,
        queued, or was lately (the keeper deletes idle ones): a listing reads their names,
        then describes them in order until it has ``limit``; the total counts the parents not
        described (about: an idle one among them is no lock)."""
        def look(call: Call) -> Listing:
            found: list[tuple[str, str, str]] = []
            for kind, top in ((LOCK, self.root), (SEMAPHORE, f"{self.root}/{paths.SEMAPHORES}")):
                try:
                    groups = [paths.escape(group)] if group else sorted(
                        g for g in call(CHILDREN, top) if not g.startswith(":"))
                except NoNodeError:
                    continue
                for g in groups:
                    try:
                        names = call(CHILDREN, f"{top}/{g}")
                    except NoNodeError:
                        continue
                    found.extend((paths.unescape(g), paths.unescape(n), kind) for n in names)
            found.sort()
            infos: list[LockInfo] = []
            for at, (g, n, kind) in enumerate(found):
                if limit is not None and len(infos) >= limit:
                    return Listing(infos, len(infos) + len(found) - at)
                info = self._describe_one(call, kind, g, n)
                if info is not None:
                    infos.append(info)
            return Listing(infos)
        return self.sync(look, group)

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        """Return one lock or semaphore, or None if nobody holds or waits for it."""
        return self.sync(lambda call: self._describe_one(call, kind, group, name), group, name)

    def _describe_one(self, call: Call, kind: str, group: str, name: str) -> LockInfo | None:
        lockpath = paths.lock_path(self.root, group, name, PERMIT if kind == SEMAPHORE else WRITE)
        try:
            children = call(CHILDREN, lockpath)
        except NoNodeError:
            return None
        nodes: list[_Node] = []
        permits = None
        context = {}
        for child in sorted(children, key=paths.sequence):
            parsed = paths.parse(child)
            if parsed is None:
                continue
            mode, owner = parsed
            try:
                data, stat = call(GET, f"{lockpath}/{child}")
            except NoNodeError:
                continue
            said = data[1:]
            if mode == PERMIT:
                count, _, said = said.partition(b"|")
                permits = int(count or 1) if permits is None else permits
            context[owner] = holder_context(owner, stat.ctime / 1000, said.decode(errors="replace"))
            # A downgraded writer's node says "read" in its data.
            nodes.append(_Node(READ if data[:1] == b"r" else mode, owner, int(stat.czxid)))
        if not nodes:
            return None
        holders: list[_Node] = []
        if kind == SEMAPHORE:
            holders = nodes[:permits or 1]
        else:
            for node in nodes:
                if node.mode == WRITE:
                    if not holders:
                        holders.append(node)
                    break
                holders.append(node)
        waiters = tuple(f"{n.mode}:{n.owner}" for n in nodes[len(holders):])
        if not holders:
            return LockInfo(group, name, None, (), waiters, None, None, kind, permits, context)
        return LockInfo(group, name, holders[0].mode, tuple(h.owner for h in holders), waiters, None,
                        max(h.token for h in holders), kind, permits, context)

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        """Publish ``process``'s stats for ``ttl`` seconds."""
        # An ephemeral node per process under ":stats" (never a group: groups hold no ":"):
        # it goes with the process's session; the ttl is kept
        # in the data (read_stats skips what is older), as ZooKeeper has no expiry of its own.
        path = f"{self.root}/{paths.STATS}/{paths.escape(process)}"
        stamped = f"{time.time() + ttl:.3f}\n".encode() + data

        def put(call: Call) -> None:
            try:
                call(SET, path, stamped)
            except NoNodeError:
                self.session.client().create_async(path, stamped, ephemeral=True, makepath=True).get(
                    timeout=self.connect_timeout)
        self.sync(put)

    def read_stats(self) -> dict[str, bytes]:
        """Return the stats every process published that have not expired, by process."""
        def look(call: Call) -> dict[str, bytes]:
            top = f"{self.root}/{paths.STATS}"
            try:
                children = call(CHILDREN, top)
            except NoNodeError:
                return {}
            out = {}
            now = time.time()
            for child in children:
                try:
                    data, _ = call(GET, f"{top}/{child}")
                except NoNodeError:
                    continue
                until, _, body = data.partition(b"\n")
                if float(until or 0) > now:
                    out[paths.unescape(child)] = body
            return out
        return self.sync(look)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        """Delete every node of a lock or semaphore; return whether there was any."""
        lockpath = paths.lock_path(self.root, group, name, PERMIT if kind == SEMAPHORE else WRITE)

        def drop(call: Call) -> bool:
            try:
                children = call(CHILDREN, lockpath)
            except NoNodeError:
                return False
            had = False
            # The waiters first, the holders last: a waiter then never sees its blocker go
            # while its own node is still there, and so never believes itself the holder.
            for child in sorted(children, key=paths.sequence, reverse=True):
                with contextlib.suppress(NoNodeError):
                    call(DELETE, f"{lockpath}/{child}")
                    had = True
            return had
        return self.sync(drop, group, name)
