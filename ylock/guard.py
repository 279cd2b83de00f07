"""A :class:`Guard`: a lock held in one mode (or a semaphore's permit) for a ``with`` block,
around every call of a function, or for as long as its verbs say."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ylock import options

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["DEFAULT", "Guard"]

F = TypeVar("F", bound=Callable[..., Any])

#: Sentinel: "use the lock's (or the guard's) default timeout".
DEFAULT: Any = object()


class Guard:
    """Holds a lock in one mode (or a semaphore's permit) for a ``with`` block, or around
    every call of a function; or, by its verbs, for as long as the caller says.

    As a decorator it works on plain functions and on coroutine functions. In a coroutine
    (and with ``async with``) the owner is the asyncio task, so two tasks exclude each
    other and one task may re-enter; the lock's asyncio verbs wait without a thread, and a
    task cancelled while it waits (or inside the block) leaves nothing held.

    Its verbs take and give back one level of the hold in the guard's mode, whatever that
    mode is: ``acquire``, ``try_acquire``, ``release`` and the asyncio ``aacquire``,
    ``atry_acquire``, ``arelease``, as a :class:`Semaphore`'s (a ``timeout`` not given is
    the guard's).
    """

    __slots__ = ("_lock", "_mode", "_timeout", "_context")

    def __init__(self, lock: Any, mode: str, timeout: float | None,
                 context: Mapping[str, Any] | None = None) -> None:
        self._lock = lock
        self._mode = mode
        self._timeout = options.timeout(timeout)
        self._context = context

    def __repr__(self) -> str:
        return f"<ylock.Guard {self._mode} of {self._lock!r}>"

    @property
    def target(self) -> Any:
        """The :class:`Lock` or :class:`Semaphore` it holds."""
        return self._lock

    @property
    def mode(self) -> str:
        """The mode it holds the target in: ``"write"``, ``"read"`` or ``"permit"``."""
        return self._mode

    @property
    def timeout(self) -> float | None:
        """Seconds its acquisitions wait (None: forever)."""
        return self._timeout

    @property
    def description(self) -> str:
        """What it holds, for messages: ``"the write lock"``, ``"a permit"``."""
        return str(self._lock._what(self._mode))

    def _wait(self, timeout: float | None) -> float | None:
        """The guard's own ``timeout`` for :data:`DEFAULT`, anything else as given (the
        lock's :meth:`~ylock.holding.Holding.timeout_for` checks it)."""
        return self._timeout if timeout is DEFAULT else timeout

    def acquire(self, timeout: float | None = DEFAULT) -> None:
        """Take the hold, waiting up to ``timeout`` seconds; raise :class:`LockTimeout` if it
        could not be had in time."""
        self._lock._acquire(self._mode, self._wait(timeout), True, self._context)

    def try_acquire(self, timeout: float | None = DEFAULT) -> bool:
        """Take the hold if it can be had within ``timeout``; return whether it was."""
        return bool(self._lock._acquire(self._mode, self._wait(timeout), False, self._context))

    def release(self) -> None:
        """Give back one level of the hold (:class:`LockNotOwned` if there is none,
        :class:`LockLost` if it was lost meanwhile)."""
        self._lock._release(self._mode)

    async def aacquire(self, timeout: float | None = DEFAULT) -> None:
        """:meth:`acquire` from an asyncio task."""
        await self._lock._aacquire(self._mode, self._wait(timeout), True, self._context)

    async def atry_acquire(self, timeout: float | None = DEFAULT) -> bool:
        """:meth:`try_acquire` from an asyncio task."""
        return bool(await self._lock._aacquire(self._mode, self._wait(timeout), False, self._context))

    async def arelease(self) -> None:
        """:meth:`release` from an asyncio task (completes even if the task is cancelled)."""
        await self._lock._arelease(self._mode)

    def __enter__(self) -> Any:
        self._lock._acquire(self._mode, self._timeout, True, self._context)
        return self._lock

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._lock._release(self._mode)

    async def __aenter__(self) -> Any:
        await self._lock._aacquire(self._mode, self._timeout, True, self._context)
        return self._lock

    async def __aexit__(self, *exc: object) -> None:
        await self._lock._arelease(self._mode)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self:
                    return await func(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]
