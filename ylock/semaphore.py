"""Distributed semaphores: :class:`Semaphore` (at most ``permits`` owners at once) and
:class:`Semaphores` (a family of them in one group, one per name)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ylock import options
from ylock.engines.base import Engine
from ylock.guard import DEFAULT, Guard
from ylock.holding import Holding, validated
from ylock.holds import PERMIT, SEMAPHORE
from ylock.names import check_group, check_name
from ylock.tickets import Ticket
from ylock.waiting import Polling

__all__ = ["Semaphore", "Semaphores"]


class Semaphore(Holding):
    """A distributed semaphore: at most ``permits`` owners (threads, asyncio tasks, owner
    scopes) hold a permit at once, across processes and machines.

    Like the lock: an owner that holds a permit re-enters without taking another (counted
    locally); ``fair`` serves waiters FIFO, and a release hands the permit to the head
    waiter directly; each permit has its own ``lease``, renewed by the watchdog, so a dead
    holder's permit frees after its lease and a holder paused past it is told it lost it
    (``lost``, :class:`LockLost` at release); fencing tokens strictly increase per
    semaphore name. The permit count may change between deployments: a larger one admits
    waiters at once, a smaller one admits no one new until the holders drop below it.
    A semaphore and a lock of the same group and name are unrelated.
    """

    __slots__ = ("permits",)
    kind = SEMAPHORE
    modes = (PERMIT,)

    def __init__(self, engine: Engine, group: str, name: str = "global", *, permits: int, fair: bool = True,
                 lease: float = 30.0, polling: Polling | None = None, timeout: float | None = None) -> None:
        super().__init__(engine, group, name, fair=fair, lease=lease, polling=polling, timeout=timeout)
        self.permits = options.number(permits, "permits", minimum=1, maximum=1_000_000, integer=True)

    @classmethod
    def _checked(cls, engine: Engine, group: str, name: str, permits: int, fair: bool, lease: float,
                 polling: Polling, timeout: float | None) -> Semaphore:
        sem = cls.__new__(cls)
        sem.engine, sem.group, sem.name, sem.permits = engine, group, check_name(name), permits
        sem.fair, sem.lease, sem.polling, sem.timeout = fair, lease, polling, timeout
        return sem

    @classmethod
    def _for_ticket(cls, engine: Engine, ticket: Ticket, lock_options: dict[str, Any]) -> Semaphore:
        return cls(engine, ticket.group, ticket.name, permits=ticket.permits, **lock_options)

    def __repr__(self) -> str:
        return f"<ylock.Semaphore {self.group}/{self.name} ({self.permits} permits) on {self.engine!r}>"

    def _key(self, owner: str) -> tuple[Any, ...]:
        return (self.engine, self.group, self.name, owner, SEMAPHORE)

    def _what(self, mode: str) -> str:
        return "a permit"

    def acquire(self, timeout: float | None = DEFAULT) -> None:
        """Take a permit, waiting up to ``timeout`` seconds (None: forever); raise
        :class:`LockTimeout` if none could be had in time."""
        self._acquire(PERMIT, timeout, True)

    def try_acquire(self, timeout: float | None = 0.0) -> bool:
        """Take a permit if one can be had within ``timeout``; return whether it was."""
        return self._acquire(PERMIT, timeout, False)

    def release(self) -> None:
        """Give back one level of this owner's permit: :class:`LockNotOwned` if it holds none,
        :class:`LockLost` if its lease was lost meanwhile."""
        self._release(PERMIT)

    async def aacquire(self, timeout: float | None = DEFAULT) -> None:
        """:meth:`acquire` from an asyncio task (no thread waits; a cancelled wait holds nothing)."""
        await self._aacquire(PERMIT, timeout, True)

    async def atry_acquire(self, timeout: float | None = 0.0) -> bool:
        """:meth:`try_acquire` from an asyncio task."""
        return await self._aacquire(PERMIT, timeout, False)

    async def arelease(self) -> None:
        """:meth:`release` from an asyncio task (completes even if the task is cancelled)."""
        await self._arelease(PERMIT)

    def hold(self, timeout: float | None = DEFAULT, *, context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager (and decorator, sync or async) holding a permit."""
        return Guard(self, PERMIT, self.timeout_for(timeout), context)

    def held(self, mode: str | None = None) -> bool:
        """Return True if this owner holds a permit."""
        return self._hold() is not None

    def __enter__(self) -> Semaphore:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Semaphore:
        await self.aacquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.arelease()


class Semaphores:
    """A family of semaphores in one group, one per name (e.g. one per tenant), all with
    the same number of permits: ``sems["tenant-7"]`` is the :class:`Semaphore` for that name."""

    __slots__ = ("engine", "group", "permits", "fair", "lease", "polling", "timeout")

    def __init__(self, engine: Engine, group: str, *, permits: int, fair: bool = True, lease: float = 30.0,
                 polling: Polling | None = None, timeout: float | None = None) -> None:
        self.engine, self.fair, self.lease, self.polling, self.timeout = \
            validated(engine, fair, lease, polling, timeout)
        self.group = check_group(group)
        self.permits = options.number(permits, "permits", minimum=1, maximum=1_000_000, integer=True)

    def __repr__(self) -> str:
        return f"<ylock.Semaphores {self.group}/* ({self.permits} permits) on {self.engine!r}>"

    def __getitem__(self, name: str) -> Semaphore:
        return Semaphore._checked(self.engine, self.group, name, self.permits, self.fair, self.lease,
                                  self.polling, self.timeout)
