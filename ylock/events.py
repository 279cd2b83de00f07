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

Watchers (:class:`Watcher`, :func:`watch`) observe the same path in more detail, for
tracing (:mod:`ylock.tracing` is one): each first acquisition and each final release of a
hold, with the lock and the :class:`~ylock.holds.Hold` themselves. With a watcher on, a
first acquisition tries once without waiting before it waits, so that the watcher learns
that it is about to wait (and whom for) before it does. The facade calls watchers
directly, never the other way round: a watcher uses public names only.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

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

#: The event kinds that every plugin re-emits as a signal of its framework (Django's,
#: Flask's blinker, Celery's), with the signal's name in the plugin's ``signals`` module:
#: one list for all three, so that a new kind reaches every framework.
RELAYED = {ACQUIRED: "lock_acquired", RELEASED: "lock_released", TIMED_OUT: "lock_timed_out", LOST: "lock_lost",
           RENEWED: "lock_renewed", WAITER_EVICTED: "waiter_evicted", SUSPENDED: "engine_suspended",
           RECONNECTED: "engine_reconnected", DETACHED: "lock_detached", ADOPTED: "lock_adopted"}


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


class Acquisition:
    """One watched first acquisition, handed to each hook of its watchers: ``target`` (the
    :class:`~ylock.Lock` or :class:`~ylock.Semaphore`), ``mode``, ``owner``, ``started_ns``
    (``time.time_ns()`` at the call), ``context`` (what the hold will say about its owner:
    a watcher's :meth:`Watcher.start` may add fields), ``notes``, where each watcher
    keeps what it carries from one hook to the next (by itself as the key), and ``holders``,
    who held it when it started to wait, if the engine said (see :meth:`queued`)."""

    __slots__ = ("watchers", "target", "mode", "owner", "started_ns", "context", "notes", "holders")

    def __init__(self, watchers: tuple[Watcher, ...], target: Any, mode: str, owner: str,
                 context: Mapping[str, Any] | None) -> None:
        self.watchers, self.target, self.mode, self.owner = watchers, target, mode, owner
        self.started_ns = time.time_ns()
        self.context = context
        self.notes: dict[Any, Any] = {}
        #: Who holds what the acquisition waits for, as the engine told when it queued
        #: (owner -> what it said, as :attr:`ylock.LockInfo.context`); None: not told.
        self.holders: Mapping[str, Mapping[str, Any]] | None = None

    def queued(self, holders: Mapping[str, Mapping[str, Any]] | None) -> None:
        """The engine says the acquisition has to wait (its first try did not get it), and who
        holds it if it knows: each watcher's :meth:`Watcher.waiting` hears it (the engine
        calls this once)."""
        self.holders = holders
        for watcher in self.watchers:
            watcher.waiting(self)


class Watcher(Protocol):
    """What a watcher of the lock path implements (see the module docstring). Like
    subscribers, watchers must be quick; unlike them, what they raise is not caught (a
    watcher is part of the call it watches)."""

    def on(self) -> bool:
        """Return True if this acquisition is to be watched (asked once per first acquisition)."""

    def start(self, acquisition: Acquisition) -> None:
        """A watched first acquisition begins (before any request; ``acquisition.context`` may
        be extended here)."""

    def waiting(self, acquisition: Acquisition) -> None:
        """The first try failed: the acquisition is about to wait (the engine says so, from
        inside the acquisition: no request of its own)."""

    def waited(self, acquisition: Acquisition, token: int | None, error: BaseException | None) -> None:
        """The acquisition ended: a token, None (timed out) or ``error`` (raised after this)."""

    def held(self, acquisition: Acquisition, hold: Any) -> None:
        """The acquisition made ``hold`` (a :class:`~ylock.holds.Hold`, where a watcher may keep
        what lasts as long as the hold, e.g. ``hold.span``)."""

    def released(self, hold: Any) -> None:
        """The final release of ``hold`` (``hold.lost`` says whether it was lost meanwhile);
        called for every hold, watched or not."""


_watchers: tuple[Watcher, ...] = ()


def watch(watcher: Watcher) -> Watcher:
    """Call ``watcher`` on the lock path from now on (see :class:`Watcher`); return it."""
    global _watchers
    if watcher not in _watchers:
        _watchers = _watchers + (watcher,)
    return watcher


def unwatch(watcher: Watcher) -> None:
    """Stop calling ``watcher``; do nothing if it was not watching."""
    global _watchers
    _watchers = tuple(w for w in _watchers if w is not watcher)


def watchers() -> tuple[Watcher, ...]:
    """Return the watchers, in the order they started watching (empty: the lock path skips them)."""
    return _watchers
