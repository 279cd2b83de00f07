"""ZooKeeperEngine: the lock protocol on ZooKeeper's sequential ephemeral nodes (URL,
options and guarantees: :mod:`ylock.engines.zookeeper`).

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
  :class:`~ylock.engines.zookeeper.handler.Handler`): its connection thread waits with a
  ``poll`` object instead of building an epoll selector on every wait, and runs this
  engine's watches itself (they never block) instead of handing each to kazoo's callback
  thread. Per uncontended
  acquire+release that is most of the client's CPU time, and one thread switch less.
* **Tidying** (:class:`~ylock.engines.zookeeper.keeper.LockKeeper`): lock parents unused for
  ``idle`` seconds are deleted by a background thread, so fine-grained locks do not grow
  ZooKeeper.

This module holds the protocol's steps only; the connection and its state are
:mod:`~ylock.engines.zookeeper.session`'s, the table of claims and the background
deletes :mod:`~ylock.engines.zookeeper.keeper`'s, the node names
:mod:`~ylock.engines.zookeeper.paths`', describe/stats/force-release
:mod:`~ylock.engines.zookeeper.inspection`'s.
"""
from __future__ import annotations

import functools
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType

from ylock.engines.base import (
    LOCK,
    PERMIT,
    READ,
    WRITE,
    Abandon,
    AcquireRequest,
    Engine,
    Listing,
    LockInfo,
    Steps,
    arun_steps,
    check_limit,
    run_steps,
)
from ylock.engines.zookeeper import ops, paths
from ylock.engines.zookeeper.claim import Claim, ClaimKey
from ylock.engines.zookeeper.inspection import Inspector
from ylock.engines.zookeeper.keeper import LockKeeper
from ylock.engines.zookeeper.ops import CHILDREN, CREATE, DELETE, EXISTS, GET, SET, Connect, Request, Send, Wait
from ylock.engines.zookeeper.session import Session
from ylock.engines.zookeeper.url import URL_OPTIONS, check_option_names, parse_url
from ylock.errors import EngineUnavailable, LockError


class ZooKeeperEngine(Engine):
    """A fair read-write lock and semaphore on ZooKeeper (see :mod:`ylock.engines.zookeeper`
    for its URL and guarantees, this module's docstring for the protocol)."""

    scheme = "zookeeper"
    needs_renewal = False
    adopts_across_processes = False
    url_options = URL_OPTIONS

    def __init__(self, url: str, *, session_timeout: float = 10.0, connect_timeout: float = 2.0,
                 root: str = "/ylock", idle: float = 2.0, suspended: str = "guard",
                 lost_after: float = 0.5, acl: str | None = None, tls: bool | None = None, ca: str | None = None,
                 certfile: str | None = None, keyfile: str | None = None, verify_certs: bool = True,
                 check_hostname: bool | None = None) -> None:
        super().__init__()
        self.settings = settings = parse_url(url, session_timeout=session_timeout, connect_timeout=connect_timeout,
                                             root=root, idle=idle, suspended=suspended, lost_after=lost_after,
                                             acl=acl, tls=tls, ca=ca, certfile=certfile, keyfile=keyfile,
                                             verify_certs=verify_certs, check_hostname=check_hostname)
        self.url = settings.url
        self.hosts = settings.hosts
        self.auth = settings.auth
        self.root = settings.root
        self.session_timeout = settings.session_timeout
        self.connect_timeout = settings.connect_timeout
        self.idle = settings.idle
        self._reset_state()

    def _reset_state(self) -> None:
        self._session = Session(self, self.settings, on_connected=lambda: self._keeper.wake(),
                                on_lost=lambda: self._keeper.mark_all_lost(),
                                on_abandon=lambda: self._keeper.abandon_all(),
                                has_holds=lambda: bool(self._keeper.claims))
        self._keeper = LockKeeper(self._session)
        self._inspector = Inspector(self._session)
        self._do = functools.partial(ops.do, self._session)
        self._ado = functools.partial(ops.ado, self._session)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ZooKeeperEngine:
        """Build an engine from a URL; query parameters and keyword ``options`` are engine
        options (see :mod:`ylock.engines.zookeeper`)."""
        check_option_names(options)
        return super().from_url(url, **options)  # type: ignore[return-value]

    def url_for_display(self) -> str:
        return f"zookeeper://{self.hosts}"

    # -- connection ---------------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client (started on first use; it may not be connected yet)."""
        return self._session.client()

    @property
    def negotiated_session_timeout(self) -> float | None:
        """The session timeout the server granted at the last connection, in seconds (it may
        lower or raise ``session_timeout`` into its own bounds), or None before the first
        connection or with ``suspended=wait``. The quorum guard reckons with it."""
        return self._session.guard.negotiated_timeout

    def ping(self) -> None:
        """Raise EngineUnavailable unless the server answers; make sure the root znode exists."""
        self._inspector.ping()

    def _after_fork(self) -> None:
        # The parent's session and threads are not ours: start over, without closing them.
        self._reset_state()

    def close(self) -> None:
        self._session.close()
        self._keeper.wake()                      # it stops with the client

    # -- ownership --------------------------------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> int | None:
        r = request
        token = self._downgrade(r)
        if token is not None:
            return token
        return run_steps(self._acquire_steps(r), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._session.translate(exc, r.group, r.name))

    async def aacquire(self, request: AcquireRequest) -> int | None:
        r = request
        token = self._downgrade(r)
        if token is not None:
            return token
        return await arun_steps(self._acquire_steps(r), self._ado,  # type: ignore[no-any-return]
                                lambda exc: self._session.translate(exc, r.group, r.name))

    def _downgrade(self, r: AcquireRequest) -> int | None:
        """A writer taking the read lock: its write node carries the read hold."""
        if r.mode != READ:
            return None
        claims = self._keeper.claims
        write = claims.get(ClaimKey(r.group, r.name, r.owner, WRITE))
        if write is None:
            return None
        write.downgraded = True
        claims[ClaimKey(r.group, r.name, r.owner, READ)] = write
        return write.token

    def _acquire_steps(self, r: AcquireRequest) -> Steps:
        """Create our node, then wait until no child before it blocks us (module docstring).
        Three times, three names: ``r.deadline`` ends the waits (the caller's budget); ``bound``,
        the deadline plus ``connect_timeout``, bounds the whole call; each request's ``end`` is
        at most one ``connect_timeout`` away and never past the bound. ``r.queued`` hears of
        the first wait."""
        lockpath = paths.lock_path(self.root, r.group, r.name, r.mode)
        claim = Claim(self._keeper.held_event, ClaimKey(r.group, r.name, r.owner, r.mode), lockpath)
        # A semaphore's node carries the permit count asked for (describe() shows it), and
        # its holders and waiters keep a child watch: any node leaving may let one in.
        permit = r.mode == PERMIT
        claim.context = r.context
        data = (f"p{r.permits}|" if permit else paths.LETTER[r.mode]).encode() + r.context.encode()
        end = None if r.deadline is None else r.deadline + self.connect_timeout
        flight = (lockpath, claim.prefix)
        queued = r.queued                # told once, at the first wait
        watched = False              # a children read has left its child watch
        keeper = self._keeper
        keeper.creating.add(flight)
        try:
            while True:
                if not self._session.connected.is_set():
                    yield Connect(self._reconnect_wait(claim, r, end))
                bound = self._bound(end)
                try:
                    if claim.node is None and not claim.unsure:
                        # Until its answer is read, the create may have made our node: a
                        # give-up meanwhile (an asyncio cancellation lands here) looks for it.
                        claim.unsure = True
                        try:
                            created, children = yield Send([Request(CREATE, f"{lockpath}/{claim.prefix}", data),
                                                            Request(CHILDREN, lockpath, claim.on_watch)], bound)
                        except LockError as exc:    # a refusal (an ACL) made nothing; no answer may have
                            claim.unsure = isinstance(exc, EngineUnavailable)
                            raise
                        claim.unsure = False
                        if isinstance(created, NoNodeError):
                            # kazoo made the parent, then the reaper took it (idle a moment
                            # before this create reached it): make it and create again.
                            continue
                        if isinstance(created, Exception):
                            raise created
                        node, stat = created
                        keeper.own(claim, node, int(stat.czxid))
                        if isinstance(children, NoNodeError):    # the parent was made by the create
                            continue
                        watched = True
                    else:
                        # The first successful read of the children leaves the child watch
                        # (see the module docstring); later reads need none.
                        children, = yield Send([Request(CHILDREN, lockpath,
                                                        None if watched and not permit else claim.on_watch)], bound)
                        if isinstance(children, NoNodeError):
                            children = []
                        else:
                            watched = True
                except EngineUnavailable:
                    if claim.node is None:
                        claim.unsure = True
                    if r.deadline is not None and time.monotonic() >= r.deadline:
                        raise
                    yield Connect(self._reconnect_wait(claim, r, end))
                    continue
                mine = self._mine(claim, children)
                if mine is None:
                    if not claim.unsure:
                        keeper.forget(claim)      # deleted under us (a force-release): queue again
                    claim.unsure = False         # (or, after a create without answer: not created)
                    continue
                if not claim.token:              # ours, found after a create without answer
                    stat, = yield Send([Request(EXISTS, f"{lockpath}/{mine}")], self._bound(end))
                    if stat is None or isinstance(stat, Exception):
                        keeper.forget(claim)
                        continue
                    claim.token = int(stat.czxid)
                claim.unsure = False
                # Nodes of ours but for this one were left by earlier attempts of this owner
                # whose create got no answer (kazoo sends a request queued during a
                # disconnection once it reconnects): they block nobody of ours, and go. A
                # live one is not ours any more: a hold this owner detached, now a ticket's
                # (or its adopter's), which blocks us as anyone's would.
                live = keeper.live
                for child in children:
                    if child.startswith(claim.prefix) and child != mine and f"{lockpath}/{child}" not in live:
                        keeper.orphan(f"{lockpath}/{child}")
                blockers = paths.blockers([c for c in children if c == mine or not c.startswith(claim.prefix)
                                           or f"{lockpath}/{c}" in live], mine, r.mode)
                if len(blockers) < (r.permits if permit else 1):
                    return keeper.grant(claim)
                if r.deadline is not None and time.monotonic() >= r.deadline:
                    yield from self._give_up(claim, end)
                    return None
                if queued is not None:
                    queued(None)                 # the watchers read the holders' nodes if they need them
                    queued = None
                if permit:
                    yield from self._wait_for_change(claim, r, end)
                    continue
                granted = yield from self._wait(claim, r, blockers, end)
                if granted:
                    return keeper.grant(claim)
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
            keeper.creating.discard(flight)

    def _wait(self, claim: Claim, r: AcquireRequest, blockers: list[str], end: float | None) -> Steps:
        """Watch the nearest blocker (and, once, our own node), then wait for an event;
        return True when the lock is ours without another look at the children."""
        target = f"{claim.lockpath}/{blockers[-1]}"
        reader = r.mode == READ
        requests = [Request(GET if reader else EXISTS, target, claim.on_watch)]
        if not claim.own_watched:
            assert claim.node is not None        # the caller found it among the children
            requests.append(Request(EXISTS, claim.node, claim.on_watch))
        try:
            answers = yield Send(requests, self._bound(end))
        except EngineUnavailable:
            if r.deadline is not None and time.monotonic() >= r.deadline:
                raise
            return False
        if len(answers) > 1:
            claim.own_watched = True
            if answers[1] is None:
                self._keeper.forget(claim)
                return False
        first = answers[0]
        if first is None or isinstance(first, NoNodeError):
            return False                         # gone already: look again
        if reader and first[0][:1] == b"r":      # (data, stat) of a get
            return True                          # a downgraded writer: readers share with it
        only = len(blockers) == 1
        while True:
            if r.deadline is not None and time.monotonic() >= r.deadline:
                return False                     # the caller sees the deadline and gives up
            event = yield Wait(claim.mailbox, r.deadline)
            if event is None:
                continue
            if event.type == EventType.NONE:
                # The connection dropped (kazoo fires every watch): not a deletion. Look
                # again once it is back; our watches must be set again too.
                claim.own_watched = False
                yield Connect(self._reconnect_wait(claim, r, end))
                return False
            if event.path == claim.node:
                if event.type == EventType.DELETED:
                    self._keeper.forget(claim)
                    return False
                claim.own_watched = False
                return False
            if event.path == target:
                return event.type == EventType.DELETED and only
            # a stale watch from an earlier look: keep waiting

    def _wait_for_change(self, claim: Claim, r: AcquireRequest, end: float | None) -> Steps:
        """A semaphore's waiter: wait for its child watch (any node leaving may admit it), or
        a dropped connection, or the deadline; the caller reads the children again."""
        if r.deadline is not None and time.monotonic() >= r.deadline:
            return
        event = yield Wait(claim.mailbox, r.deadline)
        if event is not None and event.type == EventType.NONE:
            yield Connect(self._reconnect_wait(claim, r, end))

    def _mine(self, claim: Claim, children: list[str]) -> str | None:
        """Return our node among ``children`` (after a create without answer: the earliest of
        ours, the others deleted in the background), or None if it is not there."""
        if claim.node is not None:
            base = claim.node.rsplit("/", 1)[1]
            return base if base in children else None
        if not claim.unsure:
            return None
        live = self._keeper.live          # a live node of this prefix is a detached hold's: not ours
        ours = sorted((c for c in children if c.startswith(claim.prefix) and f"{claim.lockpath}/{c}" not in live),
                      key=paths.sequence)
        if not ours:
            return None
        for extra in ours[1:]:
            self._keeper.orphan(f"{claim.lockpath}/{extra}")
        self._keeper.own(claim, f"{claim.lockpath}/{ours[0]}", 0)
        return ours[0]

    def _give_up(self, claim: Claim, end: float | None) -> Steps:
        """Delete our node (a timeout, a cancellation, an error) within what is left of the
        call's budget ``end`` (at most one request's time); if there is no time left, or no
        connection, or no answer, the keeper deletes it in the background once connected."""
        node = claim.node
        claim.released = True
        self._keeper.forget(claim)
        if node is None and not claim.unsure:
            return
        now = time.monotonic()
        bound = now + self.connect_timeout if end is None else min(now + self.connect_timeout, end)
        if bound - now < 0.005 or not self._session.connected.is_set():
            if node is None:
                self._keeper.orphan_prefix(claim.lockpath, claim.prefix)
            else:
                self._keeper.orphan(node)
            return
        if node is None:
            yield from self._give_up_unanswered(claim, bound)
            return
        try:
            yield Send([Request(DELETE, node)], bound)
        except (EngineUnavailable, LockError):
            self._keeper.orphan(node)

    def _give_up_unanswered(self, claim: Claim, bound: float) -> Steps:
        """Give up after a create whose answer never came (lost with the connection, or the
        call cancelled while it was on its way): read the children (ZooKeeper answers a
        session's requests in order, so the read sees what the create made) and delete ours;
        what cannot be done now the keeper does once connected."""
        lockpath, prefix = claim.lockpath, claim.prefix
        try:
            children, = yield Send([Request(CHILDREN, lockpath)], bound)
            if isinstance(children, Exception):
                if not isinstance(children, NoNodeError):
                    self._keeper.orphan_prefix(lockpath, prefix)
                return
            live = self._keeper.live
            ours = [f"{lockpath}/{c}" for c in children if c.startswith(prefix) and f"{lockpath}/{c}" not in live]
            if ours:
                yield Send([Request(DELETE, node) for node in ours], bound)
        except (EngineUnavailable, LockError):
            self._keeper.orphan_prefix(lockpath, prefix)

    def _reconnect_wait(self, claim: Claim, r: AcquireRequest, end: float | None) -> float:
        """Until when an acquisition waits for a lost connection to come back. A queued
        waiter's node keeps its place while the session lives, so it waits to the end of its
        deadline (a wait without deadline: one session timeout, after which the node is gone
        anyway); a call that has queued nothing yet waits as a new call would."""
        now = time.monotonic()
        if claim.node is not None or claim.unsure:
            return now + self.session_timeout if r.deadline is None else r.deadline
        return now + self._session.connect_wait(self._bound(end) - now, r.deadline)

    def _bound(self, end: float | None) -> float:
        """The ``end`` of one request: one ``connect_timeout`` from now, never past the call's
        ``end`` (but a millisecond at least: a request is sent, or the call is over)."""
        now = time.monotonic()
        if end is None:
            return now + self.connect_timeout
        return max(now + 0.001, min(now + self.connect_timeout, end))

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        return run_steps(self._release_steps(group, name, owner, mode), self._do,  # type: ignore[no-any-return]
                         lambda exc: self._session.translate(exc, group, name))

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return await arun_steps(self._release_steps(group, name, owner, mode),  # type: ignore[no-any-return]
                                self._ado, lambda exc: self._session.translate(exc, group, name))

    def _release_steps(self, group: str, name: str, owner: str, mode: str) -> Steps:
        keeper = self._keeper
        key = ClaimKey(group, name, owner, mode)
        claim = keeper.take(key)
        if claim is None or claim.node is None:
            return False
        other = ClaimKey(group, name, owner, READ if mode == WRITE else WRITE)
        if claim.downgraded and keeper.claims.get(other) is claim:
            if mode == WRITE and not claim.lost:
                # The write hold ends, the read hold stays on the same node: other readers
                # may share it now, writers still wait (the node keeps its place).
                try:
                    yield Send([Request(SET, claim.node, b"r" + claim.context.encode())],
                               time.monotonic() + self.connect_timeout)
                except EngineUnavailable:
                    keeper.claims[key] = claim
                    raise
            return not claim.lost
        claim.released = True
        node, claim.node = claim.node, None
        keeper.live.discard(node)
        # Delete our node even when the hold was reported lost: if it is still there it is
        # ours (a connection drop is not a loss), and left behind it would block everyone.
        try:
            if not self._session.connected.is_set():
                yield Connect(time.monotonic() + self.connect_timeout)
            deleted, = yield Send([Request(DELETE, node)], time.monotonic() + self.connect_timeout)
        except EngineUnavailable as exc:
            self._keeper.orphan(node)
            raise EngineUnavailable(f"could not delete the lock node {node} ({exc}); it is deleted when the "
                                    "connection is back, or by ZooKeeper when the session expires",
                                    group=group, name=name) from exc
        keeper.released(claim.lockpath)
        return not isinstance(deleted, NoNodeError) and not claim.lost


    # -- detach and adopt -------------------------------------------------------------------------

    def detached(self, group: str, name: str, mode: str, owner: str, lease: float) -> None:
        # The session keeps the node alive: a ticket never adopted would block for good.
        self._keeper.expire(ClaimKey(group, name, owner, mode), lease)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Within this process only: the node stays where it is (in this engine's session) and
        changes owner here. Across processes a ZooKeeper hold cannot change hands: it lives in
        the session that created its node, and a node made anew in another session would get a
        new place in the queue (or, at the old place, mislead the waiter watching it)."""
        return self._keeper.adopt(ClaimKey(group, name, old_owner, mode), ClaimKey(group, name, new_owner, mode),
                                  token)

    # -- the keeper and inspection --------------------------------------------------------------

    def tidy(self) -> int:
        """Delete nodes whose owners gave up on them, recheck holds after a reconnection, and
        delete lock parents unused for ``idle`` seconds; return how many parents were deleted."""
        return self._keeper.tidy()

    def reap(self, older_than: float | None = None) -> int:
        """Delete lock parents unused for ``older_than`` seconds (default: the idle period);
        return how many were deleted."""
        return self._keeper.reap(older_than)

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        return self._inspector.describe(group, check_limit(limit))

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        return self._inspector.describe_lock(group, name, kind)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        return self._inspector.force_release(group, name, kind)

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        self._inspector.publish_stats(process, data, ttl)

    def read_stats(self) -> dict[str, bytes]:
        return self._inspector.read_stats()

