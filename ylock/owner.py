"""Who holds a lock: a globally unique owner id per thread, or per explicit owner scope.

Ownership is per thread, like Java's ReentrantReadWriteLock, and per task in asyncio
(the lock calls made by a running task belong to that task, whatever its thread). Code
that moves between threads on its own (a thread pool, ``sync_to_async``) opens an
:func:`owner_scope`: the id travels with the context, so the acquire and the release may
run on different threads and still be the same owner.

A forked child is a new process: it gets new owner ids, and everything of ylock that
belongs to one process (the hold table, the renewal thread, engines' connections) starts
afresh in it (:func:`after_fork`), whether the fork ran Python's fork hooks or not.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import mmap
import os
import socket
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

logger = logging.getLogger(__name__)

_scoped: ContextVar[str | None] = ContextVar("ylock_owner", default=None)
_running_loop = asyncio._get_running_loop   # the C function: None outside a running loop, and cheap
_local = threading.local()
_ids = itertools.count(1)
# Owner ids of asyncio tasks. Not a context variable: tasks copy their parent's context,
# so an id set in a parent would be shared by all its children. A dict keyed by weak
# references (what a WeakKeyDictionary keeps), read without its Python-level ``get``: the
# lookup runs twice per asyncio acquire+release pair. An entry goes with its task.
_task_owners: dict[weakref.ref[Any], str] = {}
_current_task = asyncio.current_task


def _forget_task(ref: weakref.ref[Any]) -> None:
    _task_owners.pop(ref, None)


def _new_process_id() -> str:
    host = socket.gethostname().split(".")[0][:24] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_process_id = _new_process_id()


# -- a new process -----------------------------------------------------------------------------
#
# A forked child must not go on with its parent's owner ids (the parent may hold locks under
# them: two processes would pass for one owner re-entering), nor with its hold table, its
# renewal thread (which does not exist in the child) or its connections. os.fork() runs the
# hooks of os.register_at_fork; a fork made from C does not: uWSGI forks its workers so
# (unless --lazy-apps or --py-call-osafterfork), and so may any embedding program. So every
# entry point of ylock also asks, cheaply, whether this is still the process that last
# looked: a page the kernel zeroes in every forked child (MADV_WIPEONFORK, Linux 4.14+) is
# read in ~40 ns; elsewhere os.getpid() is compared, a system call (200-450 ns on the
# machine ylock is benchmarked on, where a re-entry costs ~650 ns).

_MADV_WIPEONFORK = 18          # Linux's value; Python's mmap module does not name it


class _PidMark:
    """Where the kernel has no MADV_WIPEONFORK: reads 1 while the pid is the one it was set in."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __getitem__(self, index: int) -> int:
        return 1 if os.getpid() == self.pid else 0

    def __setitem__(self, index: int, value: int) -> None:
        self.pid = os.getpid()


def _fork_mark() -> mmap.mmap | _PidMark:
    """Return a byte that reads 1 in this process and 0 in a child forked from it (until the
    child sets it again)."""
    if sys.platform.startswith("linux"):
        try:
            page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            page.madvise(_MADV_WIPEONFORK)
        except (AttributeError, OSError, ValueError):
            pass                      # an older kernel (EINVAL), or no madvise: ask for the pid
        else:
            page[0] = 1
            return page
    return _PidMark()


_same_process = _fork_mark()
_pid = os.getpid()
_hooks: list[Callable[[], None]] = []
_resetting: dict[int, threading.Lock] = {}


def after_fork(hook: Callable[[], None]) -> None:
    """Have ``hook()`` called in every forked child before ylock is used there: at once after
    ``os.fork()`` (``os.register_at_fork``), or for a fork made from C (uWSGI's workers), by
    the first thread of the child that uses ylock, the others waiting meanwhile. Hooks run in
    the order they were added; they drop what belonged to the parent and never block."""
    _hooks.append(hook)


def check_fork() -> None:
    """Run the :func:`after_fork` hooks if this process is a child whose fork they missed."""
    if not _same_process[0]:
        _new_process()


def _new_process() -> None:
    global _pid
    pid = os.getpid()
    # A lock made in this process (never one inherited, possibly held by a thread the fork
    # left behind): the first thread resets, any other one waits for it to finish.
    with _resetting.setdefault(pid, threading.Lock()):
        if _pid == pid and _same_process[0]:
            return                    # another thread of this process did it meanwhile
        for other in [p for p in _resetting if p != pid]:
            _resetting.pop(other, None)
        for hook in _hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - one broken hook must not keep the others from running
                logger.exception("ylock: a reset after fork failed: %r", hook)
        _pid = pid
        _same_process[0] = 1          # last: other threads go on only once every hook has run


def process_id() -> str:
    """Return this process's id: host, pid and a random part (new after fork)."""
    if not _same_process[0]:
        _new_process()
    return _process_id


def new_owner() -> str:
    """Return a fresh owner id, unique across processes and hosts."""
    # Also by the pid: a new thread's or task's first id must be right even where the kernel
    # took MADV_WIPEONFORK without doing it (an emulated kernel); ids are made rarely.
    if not _same_process[0] or _pid != os.getpid():
        _new_process()
    return f"{_process_id}:{next(_ids)}"


def current_owner() -> str:
    """Return the owner id of the calling context: its owner scope if it has one, else the
    running asyncio task, else the thread."""
    if not _same_process[0]:
        _new_process()
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    loop = _running_loop()
    if loop is not None:
        task = _current_task(loop)
        if task is not None:
            owner = _task_owners.get(weakref.ref(task))
            if owner is None:
                owner = _task_owners[weakref.ref(task, _forget_task)] = new_owner()
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


# -- what an owner is doing (shown with its holds) ---------------------------------------------

_doing: ContextVar[dict[str, object] | None] = ContextVar("ylock_context", default=None)
#: The most a hold's description may take, as JSON (the rest is dropped).
MAX_CONTEXT = 512


@contextmanager
def context(what: str | None = None, **fields: object) -> Iterator[dict[str, object]]:
    """Describe what the code in this block does, for the holds it takes (``describe()``,
    ``ylock list``, the admin page): ``what`` a short phrase ("POST /orders/{id}", "nightly
    export"), ``fields`` small values (an id you choose; never a secret, a session, a query
    string). Scopes nest; the inner one's fields win. The web plugins, the Celery plugin
    and the command lines open one for you (method and path, task name and id, command)."""
    merged = dict(_doing.get() or {})
    if what is not None:
        merged["what"] = what
    merged.update(fields)
    token = _doing.set(merged)
    try:
        yield merged
    finally:
        _doing.reset(token)


def describe_holder(extra: Mapping[str, object] | None = None) -> str:
    """The JSON description of what the calling code is doing, bounded to
    :data:`MAX_CONTEXT` bytes ("" if nothing was said)."""
    fields = _doing.get()
    if not fields and not extra:
        return ""
    out: dict[str, object] = {}
    size = 2
    said = {**(fields or {}), **(extra or {})}
    if "traceparent" in said:
        # The trace link (ylock.tracing) goes first, so that a long description loses its
        # last fields rather than the link waiters follow to this hold.
        said = {"traceparent": said.pop("traceparent"), **said}
    for key, value in said.items():
        if not isinstance(value, (str, int, float, bool)) or value is None:
            value = str(value)
        if isinstance(value, str) and len(value) > 200:
            value = value[:199] + "…"
        item = len(json.dumps({str(key)[:40]: value}))
        if size + item > MAX_CONTEXT:
            continue
        out[str(key)[:40]] = value
        size += item
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


# -- is a holder's process still there? ---------------------------------------------------------

#: A process that started this much later than a hold was taken cannot have taken it.
_REUSED_AFTER = 5.0


@functools.lru_cache(maxsize=1)
def _boot_time() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _linux_process(pid: int) -> tuple[str, float | None] | None:
    """Return (state, start time in epoch seconds or None) of ``pid`` from /proc, or None
    if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:                           # it exists, but may not be read
        return ("?", None)
    after = stat[stat.rfind(b")") + 2:].split()
    boot = _boot_time()
    if len(after) < 20 or boot is None:
        return (after[0].decode() if after else "?", None)
    return (after[0].decode(), boot + int(after[19]) / os.sysconf("SC_CLK_TCK"))    # field 22: starttime


def process_gone(pid: int, since: float | None = None) -> bool:
    """Return True if no process of this host can be the one ``pid`` that took a hold at
    ``since`` (epoch seconds): there is none, it is a zombie, or it started after ``since``
    (its pid was reused). A process that exists but belongs to another user counts as alive."""
    if pid <= 0 or pid == os.getpid():      # no such holder (0 and -1 would mean process groups), or us
        return False
    try:
        os.kill(pid, 0)                       # signal 0: only asks whether it exists
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    except OSError:
        return False
    if not sys.platform.startswith("linux"):
        return False
    found = _linux_process(pid)
    if found is None:
        return True
    state, started = found
    if state in ("Z", "X"):
        return True
    return since is not None and started is not None and started > since + _REUSED_AFTER


def holder_stale(host: object, pid: object, since: object) -> bool:
    """True if a holder said to run on this host (by its owner id's host) as ``pid`` since
    ``since`` (epoch seconds) has no process here any more: its hold lives on only until its
    lease (or session) runs out. False when that cannot be known (another host)."""
    return host == _host() and isinstance(pid, int) and process_gone(pid, since if isinstance(since, float) else None)


def _host() -> str:
    return _process_id.split(":", 1)[0]


def _new_ids() -> None:
    # A new process id and a fresh thread-local make every id new; tasks that lived in the
    # parent's event loops do not run here.
    global _process_id, _local, _task_owners
    _process_id = _new_process_id()
    _local = threading.local()
    _task_owners = {}


after_fork(_new_ids)
os.register_at_fork(after_in_child=_new_process)
