"""The facade: :class:`Lock` (one named lock) and :class:`Locks` (a family of fine-grained
locks in one group), with Go ``RWMutex``-like verbs.

Reentrancy lives here, not on the server: a thread that already holds a lock in a mode
counts the re-entry locally and makes no network call. Only the first acquisition and
the final release of a mode reach the engine. Timeline of one thread::

    lock.lock()     -> engine.acquire(write)      token 17, watchdog starts renewing
    lock.lock()     -> writes=2, no round trip
    lock.rlock()    -> engine.acquire(read)       downgrade: granted at once
    lock.unlock()   -> writes=1
    lock.unlock()   -> engine.release(write)      still a reader; token stays 17
    lock.runlock()  -> engine.release(read)       hold span ends, event "released"

A reader that asks for the write lock gets :class:`LockUpgradeError` at once: two readers
doing that would wait for each other forever.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ylock.engines.base import READ, WRITE, Engine
from ylock.guard import DEFAULT, Guard
from ylock.holding import Holding, validated
from ylock.names import check_group, check_name
from ylock.waiting import Polling

__all__ = ["Lock", "Locks"]


class Lock(Holding):
    """A named distributed reentrant read-write lock.

    ``fair`` queues waiters FIFO (a reader never barges past a queued writer);
    ``lease`` is how long a hold survives its process without renewal; ``polling`` spaces
    a waiter's polls; ``timeout`` is the default for ``lock()``/``rlock()``/``with lock``
    (None: wait forever).
    """

    __slots__ = ()

    @classmethod
    def _checked(cls, engine: Engine, group: str, name: str, fair: bool, lease: float, polling: Polling,
                 timeout: float | None) -> Lock:
        """Build a lock from options validated already (a :class:`Locks` family's): only the
        name is checked, so a family hands out a lock per request cheaply."""
        lock = cls.__new__(cls)
        lock.engine, lock.group, lock.name = engine, group, check_name(name)
        lock.fair, lock.lease, lock.polling, lock.timeout = fair, lease, polling, timeout
        return lock

    def __repr__(self) -> str:
        return f"<ylock.Lock {self.group}/{self.name} on {self.engine!r}>"

    # -- exclusive -------------------------------------------------------------------

    def lock(self, timeout: float | None = DEFAULT) -> None:
        """Acquire the write lock, waiting up to ``timeout`` seconds (None: forever).

        Raise :class:`LockTimeout` if it could not be had in time.
        """
        self._acquire(WRITE, timeout, True)

    def try_lock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the write lock if it can be had within ``timeout``; return whether it was."""
        return self._acquire(WRITE, timeout, False)

    def unlock(self) -> None:
        """Release one level of this thread's write hold.

        Raise :class:`LockNotOwned` if it holds none, :class:`LockLost` if this was the
        final release and the lease had been lost meanwhile.
        """
        self._release(WRITE)

    # -- shared ------------------------------------------------------------------------

    def rlock(self, timeout: float | None = DEFAULT) -> None:
        """Acquire the read lock, waiting up to ``timeout`` seconds (None: forever)."""
        self._acquire(READ, timeout, True)

    def try_rlock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the read lock if it can be had within ``timeout``; return whether it was."""
        return self._acquire(READ, timeout, False)

    def runlock(self) -> None:
        """Release one level of this thread's read hold (see :meth:`unlock`)."""
        self._release(READ)

    # -- context managers and decorators --------------------------------------------------

    def write(self, timeout: float | None = DEFAULT, *, context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager (and decorator) holding the write lock; ``context``:
        fields added to what the hold says its owner is doing (see :func:`ylock.context`)."""
        return Guard(self, WRITE, self.timeout_for(timeout), context)

    def read(self, timeout: float | None = DEFAULT, *, context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager (and decorator) holding the read lock."""
        return Guard(self, READ, self.timeout_for(timeout), context)

    def __enter__(self) -> Lock:
        self.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlock()

    async def __aenter__(self) -> Lock:
        await self.alock()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aunlock()

    # -- asyncio twins (the task is the owner) -------------------------------------------------

    async def alock(self, timeout: float | None = DEFAULT) -> None:
        """Acquire the write lock from an asyncio task (see :meth:`lock`); waiting costs no
        thread, and a cancelled wait leaves the queue and holds nothing afterwards."""
        await self._aacquire(WRITE, timeout, True)

    async def atry_lock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the write lock if it can be had within ``timeout``; return whether it was."""
        return await self._aacquire(WRITE, timeout, False)

    async def aunlock(self) -> None:
        """Release one level of this task's write hold (see :meth:`unlock`); once started, the
        release completes even if the task is cancelled."""
        await self._arelease(WRITE)

    async def arlock(self, timeout: float | None = DEFAULT) -> None:
        """Acquire the read lock from an asyncio task (see :meth:`alock`)."""
        await self._aacquire(READ, timeout, True)

    async def atry_rlock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the read lock if it can be had within ``timeout``; return whether it was."""
        return await self._aacquire(READ, timeout, False)

    async def arunlock(self) -> None:
        """Release one level of this task's read hold."""
        await self._arelease(READ)


class Locks:
    """A family of locks in one group, one per name (e.g. one per user); the verbs take
    the name first. ``locks["user-42"]`` is the :class:`Lock` for that name."""

    __slots__ = ("engine", "group", "fair", "lease", "polling", "timeout")

    def __init__(self, engine: Engine, group: str, *, fair: bool = True, lease: float = 30.0,
                 polling: Polling | None = None, timeout: float | None = None) -> None:
        self.engine, self.fair, self.lease, self.polling, self.timeout = \
            validated(engine, fair, lease, polling, timeout)
        self.group = check_group(group)

    def __repr__(self) -> str:
        return f"<ylock.Locks {self.group}/* on {self.engine!r}>"

    def __getitem__(self, name: str) -> Lock:
        return Lock._checked(self.engine, self.group, name, self.fair, self.lease, self.polling, self.timeout)

    def lock(self, name: str, timeout: float | None = DEFAULT) -> None:
        """Acquire the write lock of ``name`` (see :meth:`Lock.lock`)."""
        self[name].lock(timeout)

    def try_lock(self, name: str, timeout: float | None = 0.0) -> bool:
        """Try the write lock of ``name`` (see :meth:`Lock.try_lock`)."""
        return self[name].try_lock(timeout)

    def unlock(self, name: str) -> None:
        """Release the write lock of ``name`` (see :meth:`Lock.unlock`)."""
        self[name].unlock()

    def rlock(self, name: str, timeout: float | None = DEFAULT) -> None:
        """Acquire the read lock of ``name``."""
        self[name].rlock(timeout)

    def try_rlock(self, name: str, timeout: float | None = 0.0) -> bool:
        """Try the read lock of ``name``."""
        return self[name].try_rlock(timeout)

    def runlock(self, name: str) -> None:
        """Release the read lock of ``name``."""
        self[name].runlock()

    def write(self, name: str, timeout: float | None = DEFAULT, *,
              context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager holding the write lock of ``name``."""
        return self[name].write(timeout, context=context)

    def read(self, name: str, timeout: float | None = DEFAULT, *,
             context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager holding the read lock of ``name``."""
        return self[name].read(timeout, context=context)

    async def alock(self, name: str, timeout: float | None = DEFAULT) -> None:
        """Acquire the write lock of ``name`` from an asyncio task (see :meth:`Lock.alock`)."""
        await self[name].alock(timeout)

    async def atry_lock(self, name: str, timeout: float | None = 0.0) -> bool:
        """Try the write lock of ``name`` from an asyncio task."""
        return await self[name].atry_lock(timeout)

    async def aunlock(self, name: str) -> None:
        """Release the write lock of ``name`` from an asyncio task."""
        await self[name].aunlock()

    async def arlock(self, name: str, timeout: float | None = DEFAULT) -> None:
        """Acquire the read lock of ``name`` from an asyncio task."""
        await self[name].arlock(timeout)

    async def atry_rlock(self, name: str, timeout: float | None = 0.0) -> bool:
        """Try the read lock of ``name`` from an asyncio task."""
        return await self[name].atry_rlock(timeout)

    async def arunlock(self, name: str) -> None:
        """Release the read lock of ``name`` from an asyncio task."""
        await self[name].arunlock()

    def held(self, name: str, mode: str | None = None) -> bool:
        """Return True if this thread holds the lock of ``name``."""
        return self[name].held(mode)

    def token(self, name: str) -> int | None:
        """Return this thread's fencing token for ``name``, or None."""
        return self[name].token
