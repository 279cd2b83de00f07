"""Celery signals of celery_ylock, for observation (the lock path never depends on them).

``task_skipped`` is celery_ylock's own. The others re-emit ylock's core events
(:mod:`ylock.events`) as Celery signals, like django_ylock's and flask_ylock's: ``sender``
is the lock group (a str) and ``event`` the :class:`ylock.events.Event` (kind, group,
name, engine, mode, owner, token, wait, hold, release, timestamp, detail). They are
relayed from the first locked task run or send in a process on. Receivers run
synchronously inside lock calls (``lock_renewed`` and ``lock_lost`` in the watchdog
thread): keep them quick; what they raise is logged by Celery, never raised::

    from celery_ylock import signals

    @signals.task_skipped.connect
    def count_skips(sender, task_id, lock, scope, **kwargs):
        statsd.incr(f"tasks.skipped.{sender.name}")
"""
from __future__ import annotations

from celery.utils.dispatch import Signal

from ylock import events

#: A task did not run (scope "run": its worker skipped it) or was not sent (scope
#: "enqueue") because its lock was busy and ``on_busy="skip"``. ``sender``: the task;
#: ``task_id``, ``lock`` ("group/name"), ``scope``, ``args``, ``kwargs``.
task_skipped = Signal(name="task_skipped", providing_args=["task_id", "lock", "scope", "args", "kwargs"])

#: This beat process began leading its schedule (``celery_ylock.beat:LeaderScheduler``).
#: ``sender``: the beat lock ("group/name"); ``lock`` (the same), ``token`` (the term's fencing
#: token), ``since`` (epoch seconds), ``previous`` ("host:pid (token N)" of the term before,
#: or None), ``terms`` (how many terms the deployment has begun, this one included).
beat_elected = Signal(name="beat_elected", providing_args=["lock", "token", "since", "previous", "terms"])
#: This beat process stopped leading: ``lock``, ``token``, ``reason`` (shutting down, the hold
#: was lost, a newer term fenced the schedule state, the engine did not answer).
beat_stepped_down = Signal(name="beat_stepped_down", providing_args=["lock", "token", "reason"])

#: A lock was acquired (first acquisition). ``event.wait``: seconds waited; ``event.token``.
lock_acquired = Signal(name="lock_acquired", providing_args=["event"])
#: A lock was released. ``event.hold``: seconds held; ``event.release``: the call's time.
lock_released = Signal(name="lock_released", providing_args=["event"])
#: A lock call gave up at its timeout. ``event.wait``: seconds waited.
lock_timed_out = Signal(name="lock_timed_out", providing_args=["event"])
#: A hold's lease could not be renewed: another owner may have the lock. ``event.detail``: why.
lock_lost = Signal(name="lock_lost", providing_args=["event"])
#: The watchdog renewed a hold's lease.
lock_renewed = Signal(name="lock_renewed", providing_args=["event"])
#: A dead waiter was removed from a lock's queue.
waiter_evicted = Signal(name="waiter_evicted", providing_args=["event"])
#: A hold left its owner as a ticket (an enqueue-scope task being sent).
lock_detached = Signal(name="lock_detached", providing_args=["event"])
#: A ticket's hold has a new owner (the run of an enqueue-scope task, or a revoked task's release).
lock_adopted = Signal(name="lock_adopted", providing_args=["event"])

#: The engine's session was suspended (ZooKeeper): holds are at risk.
engine_suspended = Signal(name="engine_suspended", providing_args=["event"])
#: The engine's session came back (ZooKeeper): the holds it carries are safe again.
engine_reconnected = Signal(name="engine_reconnected", providing_args=["event"])

#: The signal of each relayed event kind (:data:`ylock.events.RELAYED`, the core's one list).
BY_KIND = {kind: globals()[signal] for kind, signal in events.RELAYED.items()}


def relay(event: events.Event) -> None:
    """Send the signal of ``event.kind`` (subscribed to :mod:`ylock.events` on first use)."""
    signal = BY_KIND.get(event.kind)
    if signal is not None and signal.receivers:
        signal.send(sender=event.group, event=event)
