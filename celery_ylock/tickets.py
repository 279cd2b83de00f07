"""Enqueue-scope tasks: the ticket of a hold detached by the sender travels in the message's
headers (:data:`TICKET_HEADER`), is extended for its time in the queue, and is given back by
a worker that drops the task unrun (``task_revoked``)."""
from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from celery_ylock import conf
from celery_ylock.spec import ENQUEUE, LockSpec
from ylock.engines.base import Engine, RenewItem
from ylock.errors import EngineUnavailable, LockError, LockLost
from ylock.lock import Lock
from ylock.owner import owner_scope
from ylock.tickets import Ticket

__all__ = ["TICKET_HEADER", "extend", "give_back", "on_task_revoked", "seconds_until", "ticket_of"]

logger = logging.getLogger("celery_ylock.task")

#: The message header that carries an enqueue-scope task's ticket to its worker.
TICKET_HEADER = "ylock_ticket"


def ticket_of(request: Any) -> Mapping[str, Any] | None:
    """The ticket an enqueue-scope task was sent with (its message header), or None."""
    value = getattr(request, TICKET_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(TICKET_HEADER)
    return value if isinstance(value, Mapping) else None


def extend(engine: Engine, ticket: Ticket, seconds: float) -> None:
    """Make the server keep a detached hold ``seconds`` from now: its time in the queue,
    known only once the message's countdown, eta and expiry are (after the detach)."""
    if not engine.needs_renewal:
        return
    result = engine.renew([RenewItem(ticket.group, ticket.name, ticket.owner, ticket.mode, seconds)])[0]
    if result is False:
        raise LockLost("the lock was lost before its task could be sent", group=ticket.group, name=ticket.name)
    if result is None:
        raise EngineUnavailable("could not extend the lock for the queue: the engine did not answer",
                                group=ticket.group, name=ticket.name)


def give_back(engine: Engine, ticket: Ticket, why: str) -> bool:
    """Adopt ``ticket`` and release it at once; return whether there was anything to release."""
    try:
        with owner_scope():
            Lock.adopt(engine, ticket).guard(ticket.mode).release()
        logger.info("celery_ylock: released %s/%s (%s)", ticket.group, ticket.name, why)
        return True
    except LockLost:
        return False            # adopted by a run already, or expired: nothing of ours to release
    except LockError as exc:
        logger.warning("celery_ylock: could not release %s/%s (%s); its queue lease frees it: %s",
                       ticket.group, ticket.name, why, exc)
        return False


def seconds_until(value: Any) -> float:
    """Seconds from now until ``value`` (a number of seconds, a datetime or an ISO string)."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.0, float(value))
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return 0.0
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:            # naive: UTC, as Celery reads it
            value = value.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, float((value - datetime.datetime.now(datetime.timezone.utc)).total_seconds()))
    return 0.0


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked`` receiver (connected by :func:`install`): a worker
    drops an enqueue-scope task that never ran (revoked, expired): release the lock it was
    sent with. (A terminated task's run adopted the ticket already; nothing is released then.)"""
    spec: LockSpec | None = getattr(type(sender), "ylock_spec", None)
    data = None if spec is None or spec.scope != ENQUEUE else ticket_of(request)
    if spec is None or data is None:
        return
    try:
        ticket = Ticket.from_dict(data)
        registry = conf.state(sender._get_app()).registry
        engine = registry.engine(registry.lock_options(spec.name).engine)
    except LockError as exc:
        logger.warning("celery_ylock: cannot release the lock of revoked task %s: %s", getattr(request, "id", "?"),
                       exc)
        return
    give_back(engine, ticket, f"task {getattr(request, 'id', '?')} revoked")
