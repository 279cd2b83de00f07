"""Django signals re-emitting ylock's core events (connected in ``AppConfig.ready()``).

Each signal is sent with ``sender`` = the lock group (a str) and ``event`` = the
:class:`ylock.events.Event` (kind, group, name, engine, mode, owner, token, wait,
hold, release, timestamp, detail). Receivers run synchronously inside lock calls: keep
them quick; exceptions in them are logged, never raised into the lock call.
"""
from __future__ import annotations

from django.dispatch import Signal

from ylock import events

#: A lock was acquired (first acquisition; reentry is not signalled). event.wait: seconds waited.
lock_acquired = Signal()
#: A lock was released (final release of a mode). event.hold: seconds held; event.release: call time.
lock_released = Signal()
#: Acquisition gave up at its timeout. event.wait: seconds waited.
lock_timed_out = Signal()
#: A hold's lease could not be renewed: another owner may have the lock. event.detail: why.
lock_lost = Signal()
#: The watchdog renewed a hold.
lock_renewed = Signal()
#: A dead waiter was evicted from a queue. event.owner: the dead waiter.
waiter_evicted = Signal()
#: A ZooKeeper session was suspended: holds are at risk until it reconnects.
engine_suspended = Signal()
#: The ZooKeeper connection came back with its session: the holds it carries are safe again.
engine_reconnected = Signal()

#: A hold left its owner as a ticket (:meth:`ylock.Lock.detach`): nobody renews it until adopted.
lock_detached = Signal()
#: A ticket's hold has a new owner (:meth:`ylock.Lock.adopt`).
lock_adopted = Signal()

#: The signal of each relayed event kind (:data:`ylock.events.RELAYED`, the core's one list).
BY_KIND = {kind: globals()[signal] for kind, signal in events.RELAYED.items()}


def relay(event: events.Event) -> None:
    """Send the Django signal matching ``event`` (subscribed to ylock.events in ready())."""
    signal = BY_KIND.get(event.kind)
    if signal is not None and signal.receivers:
        signal.send_robust(sender=event.group, event=event)
