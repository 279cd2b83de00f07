"""The quorum guard of the ZooKeeper engine: a holder cut off from the quorum is told it lost
its locks before the quorum can expire its session and grant them to someone else.

Why: kazoo reports ``LOST`` only once it reaches a server again and learns that the session
expired; a holder partitioned from the quorum would meanwhile believe it still holds its
locks while another client is granted them (Curator's "session expiration simulation" is the
same answer to the same problem).

The rule (``suspended=guard``, the default): while this engine has holds, it asks the quorum
for a ``sync`` every ``T / 6`` (``T``: the session timeout the server negotiated). A sync
is answered only after the leader has seen it (a server cut off from the leader keeps
answering pings and reads for up to ``syncLimit * tickTime``, but not syncs), so an
answered sync sent at ``s`` proves the leader heard from this session's server at or after
``s``. Once no sync sent in the last ``lost_after * T`` seconds has been answered (default
``lost_after = 0.5``), every hold of the session is marked lost (``lock.lost``, the ``lost``
event, ``LockLost`` at release) and its node is deleted once the connection is back, should
the session have survived (so a lost hold never silently continues, nor blocks others).

Why 1/2 is safe: the leader expires a session ``T`` after the last touch it received, and
a follower reports its sessions' touches on each leader ping (every ``tickTime / 2``). The
leader heard from our server at or after ``s``, so it had received every touch up to about
``s - tickTime / 2``; this session touched the server at least every ``T / 6`` (the syncs),
so the leader's last touch is at least ``s - tickTime / 2 - T / 6``, and the session cannot
expire before ``s + T - tickTime / 2 - T / 6``. The server negotiates ``T >= 2 * tickTime``,
so that is at least ``s + 7T/12``: ``s + T/2`` comes first, by ``T / 12`` or more (the
leader also rounds expiry up to the next tick, and a waiter's grant needs a round trip more).
A new leader gives every session a fresh ``T``, so an election only adds margin. A leader
cut off from its followers answers syncs itself until it steps down (``syncLimit *
tickTime`` after the cut, when its followers notice too): the holder is told that much
later, but the others must first elect a new leader, whose fresh ``T`` starts after that.

The negotiated ``T`` is read from kazoo at each connection (:func:`observe_negotiation`); a
connection established to the session (a reconnection the quorum validated) counts as
answered too, so a reconnection in time disarms the guard. ``suspended=lost`` marks holds
lost as soon as the connection is suspended; ``suspended=wait`` is the old behaviour (lost
only on kazoo's ``LOST``: right for a standalone server whose restarts keep sessions, unsafe
for an ensemble that can be partitioned).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ylock.threads import start_thread

logger = logging.getLogger(__name__)

#: What a suspended connection means for the holds (the ``suspended`` URL option).
GUARD, LOST, WAIT = "guard", "lost", "wait"
SUSPENDED_MODES = (GUARD, LOST, WAIT)

#: How often the guard asks the quorum for a sync, as a fraction of the session timeout.
SYNC_EVERY = 1 / 6


class QuorumGuard:
    """Marks the session's holds lost when the quorum has not answered for ``fraction * T``.

    ``has_holds`` says whether the engine holds anything (syncs are sent only then);
    ``expired(silent_for, timeout)`` marks every hold lost (called from the guard's thread,
    once per silence). A guard not ``enabled`` (``suspended=wait``) does nothing.
    :meth:`arm` is called on every grant and costs one attribute read
    when the guard runs already.
    """

    def __init__(self, fraction: float, requested_timeout: float, *, client: Callable[[], Any],
                 has_holds: Callable[[], bool], expired: Callable[[float, float], None],
                 enabled: bool = True) -> None:
        self.fraction = fraction
        self.timeout = requested_timeout        # the negotiated one once connected
        self.negotiated_timeout: float | None = None
        self._client = client                   # the kazoo client if started, else None
        self._has_holds = has_holds
        self._expired = expired
        self.confirmed = float("-inf")          # send time of the last sync the quorum answered
        self._fired = False                     # the holds were marked lost since `confirmed`
        self._armed = not enabled              # a disabled guard is never armed: arm() returns at once
        self._stopped = False
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    # -- what the connection tells it -----------------------------------------------------------

    def negotiated(self, timeout: float, started: float) -> None:
        """A connection to the session was established (the attempt began at ``started``) with
        the negotiated session ``timeout``: the quorum knows the session is alive."""
        self.timeout = self.negotiated_timeout = timeout
        self.confirm(started)

    def confirm(self, sent: float) -> None:
        """The quorum answered a request sent at ``sent`` (monotonic)."""
        with self._cond:
            if sent > self.confirmed:
                self.confirmed = sent
                self._fired = False
                self._cond.notify()

    def deadline(self) -> float:
        """When the holds are marked lost unless the quorum answers meanwhile."""
        return self.confirmed + self.fraction * self.timeout

    # -- the thread ---------------------------------------------------------------------------------

    def arm(self) -> None:
        """A hold was granted: make sure the guard watches (the grant's own replies count as
        one sync interval old, the bound a sync gives)."""
        if self._armed:
            return
        with self._cond:
            if self._armed or self._stopped:
                return
            self._armed = True
            self.confirmed = max(self.confirmed, time.monotonic() - SYNC_EVERY * self.timeout)
            self._fired = False
            if self._thread is None:
                self._thread = start_thread(self._run, "ylock-zk-guard")
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread (the client is closed)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        next_sync = 0.0
        idle_since: float | None = None
        while True:
            fire = None
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                if self._has_holds():
                    idle_since = None
                else:
                    # Nothing to guard. Keep syncing for one session timeout (a process that
                    # locks again soon then pays nothing at its grant), then sleep until a
                    # grant arms the guard again.
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= self.timeout:
                        self._armed = False
                        self._cond.wait_for(lambda: self._armed or self._stopped)
                        next_sync, idle_since = 0.0, None
                        continue
                if idle_since is None and now >= self.deadline() and not self._fired:
                    self._fired = True
                    fire = now - self.confirmed, self.timeout
            if fire is not None:
                try:
                    self._expired(*fire)
                except Exception:  # noqa: BLE001 - a failed report must not stop the guard
                    logger.exception("ylock: marking ZooKeeper holds lost failed")
            now = time.monotonic()
            if now >= next_sync:
                self._sync(now)
                next_sync = now + SYNC_EVERY * self.timeout
            with self._cond:
                wake = next_sync if self._fired or idle_since is not None else min(next_sync, self.deadline())
                self._cond.wait(max(0.005, wake - time.monotonic()))

    def _sync(self, sent: float) -> None:
        client = self._client()
        if client is None or not client.connected:
            return

        def answered(result: Any) -> None:
            if result.successful():
                self.confirm(sent)
        try:
            client.sync_async("/").rawlink(answered)
        except Exception:  # noqa: BLE001 - not connected after all: the next round tries again
            logger.debug("ylock: zookeeper guard sync not sent", exc_info=True)


def observe_negotiation(client: Any, guard: QuorumGuard) -> bool:
    """Tell ``guard`` the session timeout each connection of ``client`` negotiates; return
    False if this kazoo does not let us (the guard then keeps the requested timeout).

    kazoo computes the negotiated timeout in ``ConnectionHandler._connect`` and keeps it
    nowhere public; that method returns ``(read_timeout, connect_timeout)`` in ms with
    ``read_timeout = negotiated * 2 / 3`` (kazoo 2.x). This wraps that one method of this
    client's own connection handler (not the class): the one place ylock relies on a kazoo
    internal, checked by a test against the server's own ``cons`` report.
    """
    connection: Any = getattr(client, "_connection", None)
    connect = getattr(connection, "_connect", None)
    if connection is None or connect is None:
        return False

    def connect_observed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = connect(*args, **kwargs)
        try:
            guard.negotiated(float(result[0]) * 1.5 / 1000.0, started)
        except (TypeError, ValueError, IndexError):
            logger.warning("ylock: cannot read the negotiated ZooKeeper session timeout from kazoo")
        return result

    connection._connect = connect_observed
    return True
