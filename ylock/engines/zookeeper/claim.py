"""One owner's node on one ZooKeeper lock: first a request (it may wait), then a hold."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from kazoo.protocol.states import EventType

from ylock.engines.base import PERMIT, Mailbox
from ylock.engines.zookeeper.paths import node_prefix


class ClaimKey(NamedTuple):
    """Which hold a claim is: the keeper's table is keyed by it."""

    group: str
    name: str
    owner: str
    mode: str


class Claim:
    """One owner's node on one lock: first a request (it may wait), then a hold.

    Its watches (:meth:`on_watch`) run in kazoo's connection thread (see
    :class:`ylock.engines.zookeeper.handler.Handler`): they set flags, post to the mailbox of
    the waiting acquisition or hand a held claim's event to the keeper, and never block.
    """

    __slots__ = ("on_held_event", "key", "lockpath", "prefix", "mode", "node", "token", "mailbox", "held", "lost",
                 "released", "own_watched", "recheck", "downgraded", "unsure", "context")

    def __init__(self, on_held_event: Callable[[Claim, Any], None], key: ClaimKey, lockpath: str) -> None:
        self.on_held_event = on_held_event      # the keeper's: what a held claim's watch means
        self.key = key
        self.lockpath = lockpath
        self.prefix = node_prefix(key.mode, key.owner)
        self.mode = key.mode
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
            self.on_held_event(self, event)
        elif self.own_watched and event.type == EventType.CHILD and self.mode != PERMIT:
            # A queued writer's or reader's child watch (left by its first look at the
            # children) only matters once it holds, and then only while it does not watch
            # its own node: it does already, so the change would only wake it for nothing.
            return
        else:
            self.mailbox.put(event)
