"""``all_of``: take several locks and semaphores together, all or nothing, without deadlock.

Two callers that take the same locks in different orders can deadlock; the usual cure is
a global order, written by hand at every call site. ``all_of`` applies one: it sorts the
guards by engine (its URL), kind, group, name and mode (write before read of the same
lock), takes them in that order within one timeout, and releases them in reverse. If one
cannot be had in time it gives back what it took and raises :class:`~ylock.LockTimeout`
naming that one. Guards may come from different engines.
"""
from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from ylock import options
from ylock.errors import LockTimeout
from ylock.guard import DEFAULT, Guard
from ylock.holds import WRITE


class AllOf:
    """The context manager :func:`all_of` returns (``with`` and ``async with``)."""

    __slots__ = ("guards", "timeout", "_taken")

    def __init__(self, guards: tuple[Guard, ...], timeout: float | None) -> None:
        for guard in guards:
            if not isinstance(guard, Guard):
                raise options.fail("all_of", f"takes guards such as lock.write(), lock.read() or sem.hold(), "
                                   f"got {guard!r}", options.E_LOCK_OPTION)
        self.guards = sorted(guards, key=_order)
        self.timeout = options.timeout(timeout)
        self._taken: list[Guard] = []

    def _time_left(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _refused(self, guard: Guard) -> LockTimeout:
        target = guard.target
        return LockTimeout(f"all_of could not take {guard.description} within {self.timeout} s; "
                           f"released the {len(self._taken)} taken before it", group=target.group, name=target.name)

    def __enter__(self) -> AllOf:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            for guard in self.guards:
                if not guard.try_acquire(self._time_left(deadline)):
                    raise self._refused(guard)
                self._taken.append(guard)
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._release()

    def _release(self) -> None:
        errors: list[BaseException] = []
        while self._taken:
            guard = self._taken.pop()
            try:
                guard.release()
            except Exception as error:  # noqa: BLE001 - release the others first, then report
                errors.append(error)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> AllOf:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            for guard in self.guards:
                if not await guard.atry_acquire(self._time_left(deadline)):
                    raise self._refused(guard)
                self._taken.append(guard)
        except BaseException:
            await self._arelease()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._arelease()

    async def _arelease(self) -> None:
        errors: list[BaseException] = []
        while self._taken:
            guard = self._taken.pop()
            try:
                await guard.arelease()
            except Exception as error:  # noqa: BLE001
                errors.append(error)
        if errors:
            raise errors[0]


def all_of(*guards: Guard, timeout: float | None = DEFAULT) -> AllOf:
    """Return a context manager holding every guard (``lock.write()``, ``lock.read()``,
    ``sem.hold()``), taken in one canonical order within ``timeout`` seconds (None: wait
    forever; the default: the guards' own timeouts are ignored, and so is this: give one),
    all or nothing (see the module docstring)."""
    if timeout is DEFAULT:
        raise options.fail("all_of", "needs timeout= (seconds for all of them together, or None: forever)",
                           options.E_LOCK_OPTION)
    return AllOf(guards, timeout)


def _order(guard: Guard) -> tuple[Any, ...]:
    target = guard.target
    return (target.engine.url_for_display(), target.kind, target.group, target.name, guard.mode != WRITE)
