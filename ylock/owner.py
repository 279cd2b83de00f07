"""Who holds a lock: a globally unique owner id per thread, or per explicit owner scope.

Ownership is per thread, like Java's ReentrantReadWriteLock, and per task in asyncio
(the lock calls made by a running task belong to that task, whatever its thread). Code
that moves between threads on its own (a thread pool, ``sync_to_async``) opens an
:func:`owner_scope`: the id travels with the context, so the acquire and the release may
run on different threads and still be the same owner.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_scoped: ContextVar[str | None] = ContextVar("ylock_owner", default=None)
_running_loop = asyncio._get_running_loop   # the C function: None outside a running loop, and cheap
_local = threading.local()
_ids = itertools.count(1)
# Owner ids of asyncio tasks. Not a context variable: tasks copy their parent's context,
# so an id set in a parent would be shared by all its children.
_task_owners: weakref.WeakKeyDictionary[asyncio.Task[object], str] = weakref.WeakKeyDictionary()


def _new_process_id() -> str:
    host = socket.gethostname().split(".")[0][:24] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_process_id = _new_process_id()


def process_id() -> str:
    """Return this process's id: host, pid and a random part (new after fork)."""
    return _process_id


def new_owner() -> str:
    """Return a fresh owner id, unique across processes and hosts."""
    return f"{_process_id}:{next(_ids)}"


def current_owner() -> str:
    """Return the owner id of the calling context: its owner scope if it has one, else the
    running asyncio task, else the thread."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    if _running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:
            owner = _task_owners.get(task)
            if owner is None:
                owner = _task_owners[task] = new_owner()
            return owner
    try:
        return _local.owner  # type: ignore[no-any-return]
    except AttributeError:
        owner = _local.owner = new_owner()
        return owner


#: The owner id of the running task (or scope, or thread): :func:`current_owner`.
task_owner = current_owner


def run_as(owner: str, func: Callable[..., object], *args: object) -> object:
    """Call ``func(*args)`` as ``owner`` (used to run blocking lock calls in a worker thread)."""
    token = _scoped.set(owner)
    try:
        return func(*args)
    finally:
        _scoped.reset(token)


@contextmanager
def owner_scope(owner: str | None = None) -> Iterator[str]:
    """Make every lock call in this context (and contexts copied from it, such as
    ``asyncio.to_thread``) act as one owner, whatever thread runs it."""
    token = _scoped.set(owner or new_owner())
    try:
        yield _scoped.get()  # type: ignore[misc]
    finally:
        _scoped.reset(token)


def _after_fork_in_child() -> None:
    # A forked child must not reuse its parent's owner ids: the parent may still hold
    # locks under them. A new process id and a fresh thread-local make every id new.
    global _process_id, _local
    _process_id = _new_process_id()
    _local = threading.local()


os.register_at_fork(after_in_child=_after_fork_in_child)
