"""Lock events and spans, published synchronously to in-process subscribers.

The facade publishes an :class:`Event` for every acquisition, timeout, release, renewal,
loss and waiter eviction. Publishing costs one truthiness test when nobody subscribed.
Subscribers must be quick and must not block: exporters copy the event into their own
bounded buffer and ship it from another thread. A subscriber that raises is logged and
otherwise ignored: observation never fails a lock call.

Spans ride on events: ``wait`` (on ``acquired`` and ``timed_out``: seconds from the call
to the outcome), ``hold`` (on ``released``: first acquire to final release of the
thread's hold, so reentry does not cut it) and ``release`` (on ``released``: how long the
release call took).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)

ACQUIRED = "acquired"
TIMED_OUT = "timed_out"
RELEASED = "released"
RENEWED = "renewed"
LOST = "lost"
WAITER_EVICTED = "waiter_evicted"
SUSPENDED = "suspended"    # ZooKeeper session suspended: holds are at risk
RECONNECTED = "reconnected"
DETACHED = "detached"      # a hold left its owner as a ticket (nobody renews it until adopted)
ADOPTED = "adopted"        # a ticket's hold has a new owner

KINDS = (ACQUIRED, TIMED_OUT, RELEASED, RENEWED, LOST, WAITER_EVICTED, SUSPENDED, RECONNECTED, DETACHED, ADOPTED)


class Event(NamedTuple):
    kind: str
    group: str
    name: str
    engine: str            # the engine's scheme: "redis", "zookeeper", "local"
    mode: str | None       # "write", "read" or None
    owner: str | None = None
    token: int | None = None
    wait: float | None = None
    hold: float | None = None
    release: float | None = None
    timestamp: float = 0.0  # wall clock, seconds since the epoch
    detail: str | None = None


_make = Event._make   # tuple.__new__ from one tuple: the cheapest way to build an Event
Subscriber = Callable[[Event], None]
_subscribers: tuple[Subscriber, ...] = ()


def subscribe(subscriber: Subscriber) -> Subscriber:
    """Call ``subscriber(event)`` for every event from now on; return it (usable as a decorator)."""
    global _subscribers
    if subscriber not in _subscribers:
        _subscribers = _subscribers + (subscriber,)
    return subscriber


def unsubscribe(subscriber: Subscriber) -> None:
    """Stop calling ``subscriber``; do nothing if it was not subscribed."""
    global _subscribers
    _subscribers = tuple(s for s in _subscribers if s != subscriber)


def listening() -> bool:
    """Return True if anybody subscribed (callers skip building events otherwise)."""
    return bool(_subscribers)


def publish(kind: str, group: str, name: str, engine: str, mode: str | None, owner: str | None = None,
            token: int | None = None, wait: float | None = None, hold: float | None = None,
            release: float | None = None, detail: str | None = None) -> None:
    """Build an event and hand it to every subscriber, in subscription order."""
    subscribers = _subscribers
    if not subscribers:
        return
    event = _make((kind, group, name, engine, mode, owner, token, wait, hold, release, time.time(), detail))
    for subscriber in subscribers:
        try:
            subscriber(event)
        except Exception:  # noqa: BLE001 - observation must never fail a lock call
            logger.exception("ylock event subscriber %r failed on %s", subscriber, kind)
