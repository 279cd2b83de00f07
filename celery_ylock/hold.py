"""The hold of one task run (:class:`TaskHold`, ``self.request.ylock``), told when its lease is
lost, and :func:`current_lock`, the typed way to reach it from a task's body."""
from __future__ import annotations

import logging
import threading
from typing import Any

from ylock import events
from ylock.errors import EngineUnavailable, LockError, LockLost
from ylock.lock import Lock
from ylock.owner import owner_scope, run_as
from ylock.tickets import Ticket

__all__ = ["TaskHold", "current_lock", "unwatch", "watch"]

logger = logging.getLogger("celery_ylock.task")


class TaskHold:
    """The lock that one task run holds: ``self.request.ylock`` in a bound task's body.

    ``token`` is the fencing token (strictly increasing per lock; unchanged when the
    run adopted its sender's ticket): pass it to the storage the task writes, so that it
    can refuse a stale holder. ``lost`` turns True once the lease could not be renewed
    (another worker may hold the lock now); ``lost_event`` is set at that moment (wait on
    it from a helper thread); ``check()`` raises :class:`ylock.LockLost` then.
    """

    __slots__ = ("lock", "mode", "owner", "token", "scope", "adopted", "lost_event", "handed_over")

    def __init__(self, lock: Lock, mode: str, owner: str, scope: str, adopted: bool) -> None:
        self.lock = lock
        self.mode = mode
        self.owner = owner
        self.scope = scope
        self.adopted = adopted            # taken over from the sender's ticket (scope "enqueue")
        self.lost_event = threading.Event()
        self.handed_over = False          # detached into a retry's message
        with owner_scope(owner):
            self.token: int | None = lock.token

    def __repr__(self) -> str:
        return f"<TaskHold {self.lock.group}/{self.lock.name} {self.mode} token={self.token}>"

    @property
    def lost(self) -> bool:
        """True once this run's hold was lost (it may be another worker's now)."""
        if self.lost_event.is_set():
            return True
        with owner_scope(self.owner):
            return self.lock.lost

    def check(self) -> None:
        """Raise :class:`ylock.LockLost` if this run's hold was lost: call it between the
        steps of long work, so that nothing more is done unprotected."""
        if self.lost:
            raise LockLost("this task's lock was lost (its lease could not be renewed): stop; another worker "
                           "may hold it now", group=self.lock.group, name=self.lock.name)

    def holds(self, lock: Lock) -> bool:
        return (lock.engine, lock.group, lock.name) == (self.lock.engine, self.lock.group, self.lock.name)

    def hand_over(self) -> Ticket:
        """Detach this run's hold into a ticket for the message that retries the task."""
        ticket: Ticket = run_as(self.owner, self.lock.detach)  # type: ignore[assignment]
        self.handed_over = True
        unwatch(self)
        return ticket

    def take_back(self, ticket: Ticket) -> None:
        """Adopt ``ticket`` again (the retry could not be sent): the run releases it as usual."""
        self.lock = run_as(self.owner, Lock.adopt, self.lock.engine, ticket)  # type: ignore[assignment]
        self.handed_over = False
        watch(self)

    def release(self) -> None:
        """Release the run's hold (unless it went on to a retry); a lost lease or an
        unreachable engine is logged: the task's outcome stands."""
        if self.handed_over:
            return
        unwatch(self)
        try:
            with owner_scope(self.owner):
                self.lock.guard(self.mode).release()
        except LockLost as exc:
            logger.error("celery_ylock: %s", exc)
        except EngineUnavailable as exc:
            logger.error("celery_ylock: could not release %s/%s (its lease frees it): %s",
                         self.lock.group, self.lock.name, exc)
        except LockError as exc:            # e.g. the task body released it itself
            logger.error("celery_ylock: releasing %s/%s: %s", self.lock.group, self.lock.name, exc)


_watched: dict[tuple[str, str, str], TaskHold] = {}


def _on_lock_event(event: events.Event) -> None:
    if event.kind == events.LOST and event.owner is not None:
        hold = _watched.get((event.group, event.name, event.owner))
        if hold is not None:
            hold.lost_event.set()


def watch(hold: TaskHold) -> None:
    events.subscribe(_on_lock_event)        # once per process (subscribe ignores repeats)
    _watched[(hold.lock.group, hold.lock.name, hold.owner)] = hold


def unwatch(hold: TaskHold) -> None:
    _watched.pop((hold.lock.group, hold.lock.name, hold.owner), None)


def current_lock(task: Any) -> TaskHold:
    """Return the hold of the run of ``task`` (a bound task's ``self``) that is executing:
    ``self.request.ylock``, typed (``current_lock(self).token``). Raise :class:`LookupError`
    if the run holds no lock (its task has no ``lock`` option, it is not running in a worker
    or eagerly, or the lock's key was None for these arguments)."""
    hold = getattr(getattr(task, "request", None), "ylock", None)
    if not isinstance(hold, TaskHold):
        name = getattr(task, "name", task)
        raise LookupError(f"task {name} holds no ylock lock in this run: give it a lock= option (base=LockedTask) "
                          "and call current_lock(self) from its body while it runs")
    return hold
