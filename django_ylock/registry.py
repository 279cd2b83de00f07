"""Named engines and locks of the project (the registry that :mod:`django_ylock.conf`
builds from ``YLOCK``), and their injection into classes and functions."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import ylock
from django_ylock import conf
from ylock.registry import Registry

F = TypeVar("F", bound=Callable[..., Any])


def registry() -> Registry:
    """Return the registry for the current settings (built once; rebuilt when they change)."""
    return conf.current().registry


def lock(name: str) -> ylock.Lock:
    """Return the named :class:`ylock.Lock` (``LOCKS[name]``, else defaults: group = name)."""
    return registry().lock(name)


def locks(name: str) -> ylock.Locks:
    """Return the named :class:`ylock.Locks` family."""
    return registry().locks(name)


def semaphore(name: str, permits: int | None = None) -> ylock.Semaphore:
    """Return the named :class:`ylock.Semaphore` (``LOCKS[name]``: its GROUP and NAME, and
    its PERMITS unless ``permits`` is given; one of the two is needed)."""
    return registry().semaphore(name, permits)


def semaphores(name: str, permits: int | None = None) -> ylock.Semaphores:
    """Return the named :class:`ylock.Semaphores` family (one semaphore per key, each with
    ``permits``, else the PERMITS of ``LOCKS[name]``)."""
    return registry().semaphores(name, permits)


def engine(alias: str = "default") -> ylock.Engine:
    """Return the named engine."""
    return registry().engine(alias)


class InjectLock:
    """A class attribute that resolves to a named :class:`ylock.Lock` when read::

        class OrderService:
            orders_lock = InjectLock("orders")

            def place(self, order):
                with self.orders_lock.write(timeout=5):
                    ...

    Resolved on every access (cheap: engines are cached), so settings changes apply.
    """

    resolve: Callable[[str], Any] = staticmethod(lock)

    def __init__(self, name: str) -> None:
        self.name = name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return type(self).resolve(self.name)


class InjectLocks(InjectLock):
    """Like :class:`InjectLock`, for a named :class:`ylock.Locks` family."""

    resolve = staticmethod(locks)


def inject(**params: str | InjectLock) -> Callable[[F], F]:
    """Pass named locks to a function's keyword parameters unless the caller did::

        @inject(orders="orders", users=InjectLocks("users"))
        def settle(order_id, orders, users): ...

    A plain string names a :class:`ylock.Lock`.
    """
    resolvers = {k: v if isinstance(v, InjectLock) else InjectLock(v) for k, v in params.items()}

    def decorate(func: F) -> F:
        parameters = inspect.signature(func).parameters
        missing = sorted(set(resolvers) - set(parameters))
        if missing:
            raise TypeError(f"{func.__qualname__} has no parameter(s) {missing} to inject locks into")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for param, resolver in resolvers.items():
                if param not in kwargs:
                    kwargs[param] = type(resolver).resolve(resolver.name)
            return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]
    return decorate
