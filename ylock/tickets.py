"""Holds that change hands: a hold detached from its owner as a :class:`Ticket`, and adopted
by another thread or process, its token unchanged (:meth:`ylock.Lock.detach`,
:meth:`ylock.Lock.adopt`). Between the two nobody renews the hold: its lease bounds how long
a ticket that is never adopted blocks others."""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from ylock import events, options
from ylock.engines.base import WRITE, Engine, RenewItem
from ylock.errors import ConfigurationError, LockError, LockLost, LockNotOwned
from ylock.holds import HOLDS, Hold
from ylock.names import check_group, check_name
from ylock.owner import current_owner, new_owner
from ylock.owner import process_id as owner_process
from ylock.watchdog import WATCHDOG

__all__ = ["Ticket", "adopt", "detach"]


class Ticket(NamedTuple):
    """A detached hold, on its way to the owner that adopts it (:meth:`Lock.detach`,
    :meth:`Lock.adopt`). Engine-independent and small; ``as_dict()`` is JSON-ready (for a
    Celery task's headers, say), ``Ticket.from_dict()`` reads it back."""

    kind: str             # "lock" or "semaphore"
    group: str
    name: str
    mode: str             # "write", "read" or "permit"
    owner: str            # the owner id that holds it until it is adopted: the ticket's own
    token: int            # the fencing token, unchanged by the hand-over
    lease: float
    permits: int          # a semaphore's permits (0 for a lock)
    process: str          # the process that detached it

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ticket:
        """Read a ticket back; raise ConfigurationError if it is not one."""
        try:
            ticket = cls(**{field: data[field] for field in cls._fields})
        except (KeyError, TypeError) as exc:
            raise ConfigurationError(f"not a ylock ticket: {data!r} ({exc})") from exc
        check_group(ticket.group)
        check_name(ticket.name)
        return ticket


def detach(target: Any, lease: float | None) -> Ticket:
    """End the calling owner's hold of ``target`` (a lock or a semaphore) without releasing it
    on the server, and return its ticket (see :meth:`ylock.Lock.detach`)."""
    lease = target.lease if lease is None else options.lease(lease, "detach lease")
    owner = current_owner()
    hold = HOLDS.by_key.get(target._key(owner))
    if hold is None:
        raise LockNotOwned("this owner holds nothing to detach", group=target.group, name=target.name)
    if hold.lost:
        raise LockLost(f"this owner's hold was lost ({hold.lost_reason})", group=target.group, name=target.name)
    modes = hold.held_modes()
    if len(modes) != 1:
        raise LockError("this owner holds both the write and the read lock (a downgrade): release one "
                        "before detaching", group=target.group, name=target.name)
    mode = modes[0][0]
    engine = target.engine
    if engine.needs_renewal:
        # A new hold may still have its short first lease: give the ticket all of its own.
        renewed, = engine.renew([RenewItem(target.group, target.name, owner, mode, lease)])
        if renewed is False:
            HOLDS.lose(hold, "the server no longer had this hold at detach")
            raise LockLost("the hold was lost before it could be detached", group=target.group, name=target.name)
    # The hold becomes the ticket's own (an owner id nobody runs as): the detaching owner
    # asking for the lock again must wait like anyone else, not be handed the ticket's hold,
    # which its adopter would then hold too (two holders, one token).
    holder = new_owner()
    if not engine.adopt(target.group, target.name, mode, owner, holder, hold.token):
        HOLDS.lose(hold, "the server no longer had this hold at detach")
        raise LockLost("the hold was lost before it could be detached", group=target.group, name=target.name)
    HOLDS.remove(hold)
    engine.detached(target.group, target.name, mode, holder, lease)
    events.publish(events.DETACHED, target.group, target.name, engine.scheme, mode, owner=owner, token=hold.token)
    return Ticket(target.kind, target.group, target.name, mode, holder, hold.token, target.lease, target.permits,
                  owner_process())


def adopt(engine: Engine, t: Ticket, target: Any) -> None:
    """Make the calling owner hold ``t``'s hold as ``target`` (the lock or semaphore made for
    it, see :meth:`ylock.Lock.adopt`), renewed by this process's watchdog from now on; raise
    :class:`LockLost` if the hold is gone (lost, or adopted already)."""
    if not engine.adopts_across_processes and t.process != owner_process():
        raise ConfigurationError(f"{type(engine).__name__} holds live in the session of the process that took "
                                 "them: a ticket can be adopted only in the process that detached it",
                                 group=t.group, name=t.name)
    owner = current_owner()
    if not engine.adopt(t.group, t.name, t.mode, t.owner, owner, t.token):
        raise LockLost("the ticket's hold is gone: its lease ran out, it was force-released, or it was "
                       "adopted already", group=t.group, name=t.name)
    granted = first_lease = None
    if engine.needs_renewal:
        # From now on the adopter's lease, not what was left of the ticket's, counted from
        # when the renewal was sent. Unconfirmed, how long the server keeps the hold is not
        # known here (what was left of the ticket's lease): it is lost at once.
        granted = time.monotonic()
        renewed, = engine.renew([RenewItem(t.group, t.name, owner, t.mode, target.lease)])
        first_lease = target.lease if renewed else 0.0
    hold = Hold(engine, t.group, t.name, owner, target.lease, t.token, t.kind)
    if t.mode == WRITE:
        hold.writes = 1
    else:
        hold.reads = 1
    if HOLDS.add(hold, t.mode, target.lease / 3, granted, first_lease):
        WATCHDOG.ensure_running()
    events.publish(events.ADOPTED, t.group, t.name, engine.scheme, t.mode, owner=owner, token=t.token)
