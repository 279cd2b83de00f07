"""The LockKeeper of the ZooKeeper engine: the table of this process's claims (held, in
progress, detached), the watches that tell a held claim it was lost, and a background
thread that deletes what nobody owns any more (nodes whose fate was unknown, lock parents
unused for ``idle`` seconds), so fine-grained locks do not grow ZooKeeper."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, NamedTuple

from kazoo.exceptions import KazooException, NoNodeError, NotEmptyError
from kazoo.protocol.states import EventType

from ylock.engines.zookeeper.claim import Claim, ClaimKey
from ylock.engines.zookeeper.session import Session
from ylock.threads import start_thread

logger = logging.getLogger(__name__)


class _Expiry(NamedTuple):
    """A detached hold, and when it goes unless adopted (``time.monotonic()``)."""

    claim: Claim
    until: float


class LockKeeper:
    """This process's claims on one engine, and the thread that tidies after them.

    The protocol steps (:mod:`ylock.engines.zookeeper.engine`) record here which nodes are
    theirs (:meth:`own`, :meth:`forget`), which holds they were granted (:meth:`grant`) or
    gave back (:meth:`take`, :meth:`released`), and which nodes they could not delete
    themselves (:meth:`orphan`, :meth:`orphan_prefix`): the keeper deletes those once
    connected, rechecks holds after a reconnection and deletes idle lock parents
    (:meth:`tidy`, :meth:`reap`).
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.idle = session.settings.idle
        self.connect_timeout = session.settings.connect_timeout
        self.mutex = threading.RLock()
        self.claims: dict[ClaimKey, Claim] = {}    # held
        self.live: set[str] = set()              # nodes of claims in progress or held
        self.creating: set[tuple[str, str]] = set()    # (lockpath, prefix) with a create in flight
        self._orphans: set[str] = set()          # nodes to delete once connected
        self._orphan_prefixes: set[tuple[str, str]] = set()   # (lockpath, prefix): any such node not live
        self._expiring: dict[ClaimKey, _Expiry] = {}   # detached holds
        self._released: dict[str, float] = {}    # lock path -> when it was last released
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition(threading.Lock())

    # -- the claims ---------------------------------------------------------------------------------

    def own(self, claim: Claim, node: str, token: int) -> None:
        """Record ``node`` as ``claim``'s (a create answered, or found after none did)."""
        claim.node = node
        claim.token = token
        claim.own_watched = False
        self.live.add(node)

    def forget(self, claim: Claim) -> None:
        """Record that ``claim`` has no node (deleted under it, or given up)."""
        if claim.node is not None:
            self.live.discard(claim.node)
        claim.node = None
        claim.own_watched = False

    def grant(self, claim: Claim) -> int:
        """Record ``claim`` as held; return its token."""
        claim.held = True
        with self.mutex:
            self.claims[claim.key] = claim
            self._released.pop(claim.lockpath, None)
        while (event := claim.mailbox.take()) is not None:     # watches that fired while we decided
            self.held_event(claim, event)
        self.session.guard.arm()
        return claim.token

    def take(self, key: ClaimKey) -> Claim | None:
        """Remove and return the held claim ``key`` (a release), or None."""
        with self.mutex:
            return self.claims.pop(key, None)

    def released(self, lockpath: str) -> None:
        """Record that a node of ``lockpath`` was deleted now (it may become idle), and make
        sure the keeper runs."""
        with self.mutex:
            self._released[lockpath] = time.monotonic()
        self.start()

    def mark_all_lost(self) -> None:
        """Mark every held claim lost (the session is gone)."""
        with self.mutex:
            claims = list(self.claims.values())
        for claim in claims:
            claim.lost = True

    def abandon_all(self) -> None:
        """Mark every held claim lost and delete its node once connected: the session may
        have expired on the quorum (the guard), though it may as well live on; a hold told
        lost must not go on holding, nor block others, if it does."""
        with self.mutex:
            for claim in self.claims.values():
                if not claim.lost and not claim.released:
                    claim.lost = True
                    if claim.node is not None:
                        self._orphans.add(claim.node)
        self.start(wake=True)

    def expire(self, key: ClaimKey, lease: float) -> None:
        """Release the detached hold ``key`` unless it is adopted within ``lease`` seconds."""
        with self.mutex:
            claim = self.claims.get(key)
            if claim is not None:
                self._expiring[claim.key] = _Expiry(claim, time.monotonic() + lease)
        self.start()

    def adopt(self, old: ClaimKey, new: ClaimKey, token: int) -> bool:
        """Hand the held claim ``old`` to ``new``'s owner if it is still held with ``token``."""
        with self.mutex:
            claim = self.claims.get(old)
            if claim is None or claim.lost or claim.token != token or claim.node is None:
                return False
            del self.claims[old]
            self._expiring.pop(claim.key, None)
            claim.key = new
            self.claims[new] = claim
        return True

    # -- holds: watches and loss -------------------------------------------------------------------

    def held_event(self, claim: Claim, event: Any) -> None:
        """A watch of a held claim fired (in kazoo's thread)."""
        if event is None or claim.lost or claim.node is None:
            return
        if event.type == EventType.NONE:
            claim.recheck = True              # look at our node once the connection is back
            claim.own_watched = False
            self.wake()
            return
        if event.path == claim.node and event.type == EventType.DELETED:
            self.lose(claim, "its lock node was deleted")
            return
        if event.path == claim.node or not claim.own_watched:
            self.watch_own(claim)             # a child changed (or our own data): watch our node

    def watch_own(self, claim: Claim) -> None:
        """Watch our node (asynchronously); report the hold lost if it is gone."""
        client = self.session.started
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
                self.lose(claim, "its lock node was deleted")
        client.exists_async(node, watch=claim.on_watch).rawlink(answered)

    def lose(self, claim: Claim, why: str) -> None:
        """Mark a held claim lost, once, and report it."""
        if claim.lost or claim.released:
            return
        claim.lost = True
        self.session.report_lost(claim.key.group, claim.key.name, claim.key.owner, why)

    # -- background deletes and tidying -----------------------------------------------------------

    def orphan(self, node: str) -> None:
        """Delete ``node`` in the background, once connected."""
        with self.mutex:
            self._orphans.add(node)
        self.start(wake=True)

    def orphan_prefix(self, lockpath: str, prefix: str) -> None:
        """Delete, in the background, any child of ``lockpath`` named ``prefix...`` that no
        claim of ours owns (a create that got no answer may have made one)."""
        with self.mutex:
            self._orphan_prefixes.add((lockpath, prefix))
        self.start(wake=True)

    def start(self, wake: bool = False) -> None:
        """Start the keeper thread unless it runs; ``wake`` it for work that cannot wait for
        its next round (a release does not: it wakes every ``idle / 2`` anyway, and a wake-up
        per release would cost the lock path a thread switch)."""
        if self._thread is None or not self._thread.is_alive():
            with self.mutex:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = start_thread(self._keep, "ylock-zk-keeper")
        elif wake:
            self.wake()

    def wake(self) -> None:
        """Wake the keeper thread for a round now (it stops if the client is closed)."""
        with self._wake:
            self._wake.notify()

    def _keep(self) -> None:
        while self.session.started is not None:
            with self._wake:
                self._wake.wait(self.idle / 2)
            if self.session.started is None:
                return
            try:
                self.tidy()
            except Exception:  # noqa: BLE001 - a failed round must not stop the next ones
                logger.debug("ylock: zookeeper tidying failed", exc_info=True)

    def tidy(self) -> int:
        """Delete nodes whose owners gave up on them, recheck holds after a reconnection, and
        delete lock parents unused for ``idle`` seconds; return how many parents were deleted."""
        client = self.session.started
        if client is None or not client.connected:
            return 0
        now = time.monotonic()
        with self.mutex:
            for key, (claim, until) in list(self._expiring.items()):
                if until <= now:           # a detached hold nobody adopted within its lease
                    del self._expiring[key]
                    if self.claims.get(key) is claim and claim.node is not None:
                        del self.claims[key]
                        claim.released = True
                        self.live.discard(claim.node)
                        self._orphans.add(claim.node)
            orphans, self._orphans = self._orphans, set()
            prefixes, self._orphan_prefixes = self._orphan_prefixes, set()
            recheck = [c for c in self.claims.values() if c.recheck and not c.lost]
        for claim in recheck:
            claim.recheck = False
            self.watch_own(claim)
        for node in orphans:
            try:
                client.delete_async(node).get(timeout=self.connect_timeout)
            except NoNodeError:
                pass
            except Exception:  # noqa: BLE001 - try again next round
                self.orphan(node)
        for lockpath, prefix in prefixes:
            if (lockpath, prefix) in self.creating:
                self.orphan_prefix(lockpath, prefix)     # a new attempt is in flight: later
                continue
            try:
                children = client.get_children_async(lockpath).get(timeout=self.connect_timeout)
            except NoNodeError:
                continue
            except Exception:  # noqa: BLE001
                self.orphan_prefix(lockpath, prefix)
                continue
            for child in children:
                node = f"{lockpath}/{child}"
                if child.startswith(prefix) and node not in self.live:
                    self._orphans.add(node)
        if self._orphans:
            self.wake()
        return self.reap()

    def reap(self, older_than: float | None = None) -> int:
        """Delete lock parents unused for ``older_than`` seconds (default: the idle period);
        return how many were deleted."""
        cutoff = time.monotonic() - (self.idle if older_than is None else older_than)
        with self.mutex:
            held = {c.lockpath for c in self.claims.values()}
            paths = [p for p, t in self._released.items() if t <= cutoff and p not in held]
            for p in paths:
                del self._released[p]
        client = self.session.started
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
