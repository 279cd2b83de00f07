"""Blinker signals re-emitting ylock's core events (:mod:`ylock.events`), for observation.

Every signal is sent with the current Flask app as sender (``None`` outside an app
context, e.g. the watchdog thread's renewals) and one keyword argument, ``event``: the
:class:`ylock.events.Event` (kind, group, name, engine, mode, owner, token, wait, hold,
release, timestamp, detail). Receivers run synchronously inside lock calls: keep them
quick, and never take a lock in one. A receiver that raises is logged, never raised.

    from flask_ylock import signals

    @signals.lock_timed_out.connect
    def on_timeout(app, event):
        app.logger.warning("lock %s/%s: gave up after %.3f s", event.group, event.name, event.wait)
"""
from __future__ import annotations

from blinker import Namespace

from ylock import events

_signals = Namespace()

#: A lock was acquired (first acquisition). ``event.wait``: seconds it waited; ``event.token``.
lock_acquired = _signals.signal("ylock-lock-acquired")
#: A lock call gave up after its timeout. ``event.wait``: seconds it waited.
lock_timed_out = _signals.signal("ylock-lock-timed-out")
#: A hold was released. ``event.hold``: seconds held (first acquire to final release), ``event.release``.
lock_released = _signals.signal("ylock-lock-released")
#: The watchdog renewed a hold's lease. ``event.token``.
lock_renewed = _signals.signal("ylock-lock-renewed")
#: A hold's lease could not be renewed: another owner may have the lock. ``event.detail``: why.
lock_lost = _signals.signal("ylock-lock-lost")
#: A dead waiter was removed from a lock's queue. ``event.detail``: the evicted waiter.
waiter_evicted = _signals.signal("ylock-waiter-evicted")
#: The engine's session was suspended (ZooKeeper): holds are at risk.
engine_suspended = _signals.signal("ylock-engine-suspended")
#: The engine's session came back (ZooKeeper).
engine_reconnected = _signals.signal("ylock-engine-reconnected")

#: A hold left its owner as a ticket (:meth:`ylock.Lock.detach`): nobody renews it until adopted.
lock_detached = _signals.signal("ylock-lock-detached")
#: A ticket's hold has a new owner (:meth:`ylock.Lock.adopt`).
lock_adopted = _signals.signal("ylock-lock-adopted")

#: The signal of each relayed event kind (:data:`ylock.events.RELAYED`, the core's one list).
BY_KIND = {kind: globals()[signal] for kind, signal in events.RELAYED.items()}


def relay(event: events.Event) -> None:
    """Send the signal of ``event.kind`` (subscribed to :mod:`ylock.events` by ``init_app``)."""
    signal = BY_KIND.get(event.kind)
    if signal is None or not signal.receivers:
        return
    from flask import current_app, has_app_context

    sender = current_app._get_current_object() if has_app_context() else None  # type: ignore[attr-defined]
    signal.send(sender, event=event)
