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

import asyncio
import atexit
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ylock import events, options, sigterm
from ylock.engines.base import READ, WRITE, AcquireRequest, Engine, RenewItem, cancelling
from ylock.errors import (
    ConfigurationError,
    EngineUnavailable,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    LockUpgradeError,
)
from ylock.holds import HOLDS, LOCK, PERMIT, SEMAPHORE, Hold
from ylock.names import check_group, check_name
from ylock.owner import _doing, current_owner, describe_holder
from ylock.owner import process_id as owner_process
from ylock.waiting import DEFAULT_POLLING, Polling
from ylock.watchdog import WATCHDOG

if TYPE_CHECKING:
    from types import TracebackType

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)

#: Sentinel: "use the lock's default timeout".
DEFAULT: Any = object()

_new_request = tuple.__new__
_holds = HOLDS.by_key      # read without a lock on the re-entry path (see ylock.holds)


def _validated(engine: Engine, fair: bool, lease: float, polling: Polling | None,
               timeout: float | None) -> tuple[Engine, bool, float, Polling, float | None]:
    """Check the options that a :class:`Lock` and a :class:`Locks` family share."""
    if not isinstance(engine, Engine):
        raise options.fail("engine", f"must be a ylock engine (see ylock.engine_from_url), got {engine!r}",
                           options.E_LOCK_OPTION)
    if polling is not None and not isinstance(polling, Polling):
        raise options.fail("polling", f"must be a ylock.Polling, got {polling!r}", options.E_LOCK_OPTION)
    return (engine, options.boolean(fair, "fair"), options.lease(lease), polling or DEFAULT_POLLING,
            options.timeout(timeout))


class _Holding:
    """What a :class:`Lock` and a :class:`Semaphore` share: options, the owner's hold
    (reentrancy counted here, never on the server), events, and the calls to the engine,
    blocking or asyncio. Only first acquisitions and final releases reach the engine."""

    __slots__ = ("engine", "group", "name", "fair", "lease", "polling", "timeout")
    #: What this is of, for the hold table ("lock" or "semaphore").
    kind = LOCK
    #: The number of permits (a semaphore's; 0 for a lock).
    permits = 0
    #: The modes it can be held in (:meth:`guard`).
    modes: tuple[str, ...] = (WRITE, READ)

    def __init__(self, engine: Engine, group: str, name: str = "global", *, fair: bool = True,
                 lease: float = 30.0, polling: Polling | None = None, timeout: float | None = None) -> None:
        self.engine, self.fair, self.lease, self.polling, self.timeout = \
            _validated(engine, fair, lease, polling, timeout)
        self.group = check_group(group)
        self.name = check_name(name)

    def _key(self, owner: str) -> tuple[Any, ...]:
        return (self.engine, self.group, self.name, owner)

    # -- state of this thread's hold -----------------------------------------------------------

    def _hold(self) -> Hold | None:
        return _holds.get(self._key(current_owner()))

    def _what(self, mode: str) -> str:
        return f"the {mode} lock"

    @property
    def token(self) -> int | None:
        """The fencing token of this thread's hold, or None if it holds nothing."""
        hold = self._hold()
        return None if hold is None else hold.token

    def held(self, mode: str | None = None) -> bool:
        """Return True if this thread holds the lock (in ``mode``, if given)."""
        hold = self._hold()
        if hold is None:
            return False
        if mode is None:
            return True
        if mode not in (WRITE, READ):
            raise ValueError(f"mode must be 'write' or 'read', got {mode!r}")
        return bool(hold.writes if mode == WRITE else hold.reads)

    @property
    def lost(self) -> bool:
        """True once this thread's hold could not be renewed (it may be someone else's now)."""
        hold = self._hold()
        return hold is not None and hold.lost

    def guard(self, mode: str, timeout: float | None = DEFAULT, *,
              context: Mapping[str, Any] | None = None) -> Guard:
        """Return the :class:`Guard` holding this in ``mode`` (a lock: ``"write"`` or ``"read"``,
        as :meth:`Lock.write` and :meth:`Lock.read`; a semaphore: ``"permit"``, as
        :meth:`Semaphore.hold`): for code that gets the mode as data (a setting, a request's
        method), with the guard's verbs (``try_acquire``, ``release`` and their asyncio twins)."""
        if mode not in self.modes:
            raise options.fail("mode", f"must be one of {', '.join(map(repr, self.modes))} for {self!r}, "
                               f"got {mode!r}", options.E_LOCK_OPTION)
        return Guard(self, mode, self.timeout if timeout is DEFAULT else timeout, context)

    # -- the work (shared by both worlds; only the engine call differs) ---------------------------

    def _request(self, mode: str, owner: str, deadline: float | None,
                 context: Mapping[str, Any] | None = None) -> AcquireRequest:
        # tuple.__new__ straight from C: a NamedTuple's own __new__ is a Python call per acquisition.
        return _new_request(AcquireRequest, (self.group, self.name, owner, mode, self.fair, self.lease, deadline,
                                             self.polling, self.permits,
                                             # describe_holder's own first test, without the call
                                             describe_holder(context) if context or _doing.get() else ""))

    def _reenter(self, hold: Hold, mode: str) -> bool:
        """Count a re-entry of this owner's hold without a round trip; return False when the
        engine must be asked (a write holder downgrading to read)."""
        if hold.lost:
            raise LockLost(f"this owner's hold was lost ({hold.lost_reason}); release it first",
                           group=self.group, name=self.name)
        if mode == WRITE:
            if hold.writes:
                hold.writes += 1
                return True
            raise LockUpgradeError("this owner holds the read lock; upgrading to write could deadlock, "
                                   "release the read lock first", group=self.group, name=self.name)
        if hold.reads:
            hold.reads += 1
            return True
        return False

    def _downgraded(self, hold: Hold, token: int | None) -> bool:
        if token is None:
            raise LockLost("the server refused this write holder its downgrade to read: the write "
                           "hold is gone", group=self.group, name=self.name)
        hold.reads = 1
        if HOLDS.renew_from(hold, READ, self.polling.waiter_lease / 3):
            WATCHDOG.ensure_running()
        return True

    def _taken(self, mode: str, owner: str, token: int | None, started: float, timeout: float | None,
               raise_on_timeout: bool, watched: events.Acquisition | None = None) -> bool:
        """Record the engine's answer to a first acquisition (token, or None at the deadline)."""
        # Events are built only for subscribers (a module attribute read, no call otherwise).
        if token is None:
            if events._subscribers:
                events.publish(events.TIMED_OUT, self.group, self.name, self.engine.scheme, mode,
                               owner=owner, wait=time.monotonic() - started)
            if raise_on_timeout:
                raise LockTimeout(f"could not acquire {self._what(mode)} within {timeout} s",
                                  group=self.group, name=self.name)
            return False
        hold = Hold(self.engine, self.group, self.name, owner, self.lease, token, self.kind)
        if mode == WRITE:
            hold.writes = 1
        else:
            hold.reads = 1
        # The watchdog's thread is started once: looked at here before calling ensure_running
        # (its check_fork ran already: current_owner() checks for a fork on every lock call).
        if HOLDS.add(hold, mode, self.polling.waiter_lease / 3) and WATCHDOG._thread is None:
            WATCHDOG.ensure_running()
        if not sigterm.checked:
            sigterm.install(release_all, EXIT_BUDGET)   # a plain script's `kill PID` gives its holds back
        if watched is not None:
            for watcher in watched.watchers:
                watcher.held(watched, hold)
        if events._subscribers:
            events.publish(events.ACQUIRED, self.group, self.name, self.engine.scheme, mode,
                           owner=owner, token=token, wait=time.monotonic() - started)
        return True

    def _acquire(self, mode: str, timeout: Any, raise_on_timeout: bool,
                 context: Mapping[str, Any] | None = None) -> bool:
        if timeout is not None:
            timeout = options.timeout(timeout)
        owner = current_owner()
        hold = _holds.get(self._key(owner))
        if hold is not None:
            # A writer may always take the read lock too (downgrade), without waiting.
            return self._reenter(hold, mode) or self._downgraded(
                hold, self.engine.acquire(self._request(mode, owner, time.monotonic())))
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        watching = _watching() if events._watchers else ()
        if not watching:
            token = self.engine.acquire(self._request(mode, owner, deadline, context))
            return self._taken(mode, owner, token, started, timeout, raise_on_timeout)
        watched = events.Acquisition(watching, self, mode, owner, context)
        for watcher in watching:
            watcher.start(watched)
        try:
            token = self.engine.acquire(self._request(mode, owner, time.monotonic(), watched.context))
            if token is None and (deadline is None or time.monotonic() < deadline):
                # Tried once without waiting (so the watchers learn of a wait before it starts).
                for watcher in watching:
                    watcher.waiting(watched)
                token = self.engine.acquire(self._request(mode, owner, deadline, watched.context))
        except BaseException as exc:
            for watcher in watching:
                watcher.waited(watched, None, exc)
            raise
        for watcher in watching:
            watcher.waited(watched, token, None)
        return self._taken(mode, owner, token, started, timeout, raise_on_timeout, watched)

    async def _aacquire(self, mode: str, timeout: Any, raise_on_timeout: bool,
                        context: Mapping[str, Any] | None = None) -> bool:
        if timeout is not None:
            timeout = options.timeout(timeout)
        owner = current_owner()
        hold = _holds.get(self._key(owner))
        if hold is not None:
            return self._reenter(hold, mode) or self._downgraded(
                hold, await self.engine.aacquire(self._request(mode, owner, time.monotonic())))
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        watching = _watching() if events._watchers else ()
        if not watching:
            token = await self.engine.aacquire(self._request(mode, owner, deadline, context))
            return self._taken(mode, owner, token, started, timeout, raise_on_timeout)
        watched = events.Acquisition(watching, self, mode, owner, context)
        for watcher in watching:
            watcher.start(watched)
        try:
            token = await self.engine.aacquire(self._request(mode, owner, time.monotonic(), watched.context))
            if token is None and (deadline is None or time.monotonic() < deadline):
                for watcher in watching:
                    watcher.waiting(watched)
                token = await self.engine.aacquire(self._request(mode, owner, deadline, watched.context))
        except BaseException as exc:
            for watcher in watching:
                watcher.waited(watched, None, exc)
            raise
        for watcher in watching:
            watcher.waited(watched, token, None)
        return self._taken(mode, owner, token, started, timeout, raise_on_timeout, watched)

    def _count_release(self, mode: str, owner: str) -> Hold | None:
        """Count a release of this owner's hold; return the hold when this was the final
        release of ``mode`` (the engine must release it), else None."""
        hold = _holds.get(self._key(owner))
        count = 0 if hold is None else (hold.writes if mode == WRITE else hold.reads)
        if hold is None or count == 0:
            raise LockNotOwned(f"this owner does not hold {self._what(mode)}", group=self.group, name=self.name)
        if mode == WRITE:
            hold.writes -= 1
        else:
            hold.reads -= 1
        if count > 1:
            return None
        if not hold.writes and not hold.reads:
            HOLDS.remove(hold)
        else:
            HOLDS.stop_renewing(hold, mode)
        return hold

    def _released(self, hold: Hold, mode: str, started: float, still_held: bool | None) -> None:
        """Publish the release; raise LockLost if the hold had been lost meanwhile."""
        finished = not hold.writes and not hold.reads
        if events._subscribers:
            ended = time.monotonic()
            events.publish(events.RELEASED, self.group, self.name, self.engine.scheme, mode, owner=hold.owner,
                           token=hold.token, hold=(ended - hold.started) if finished else None,
                           release=ended - started)
        if still_held is not None and (hold.lost or not still_held):
            HOLDS.lose(hold, "the server no longer had this hold at release")
        if finished and events._watchers:
            for watcher in events._watchers:
                watcher.released(hold)
        if still_held is not None and hold.lost:
            raise LockLost(f"the lease of {self._what(mode)} was lost before release ({hold.lost_reason}); "
                           "another owner may have held it meanwhile", group=self.group, name=self.name)

    def _release(self, mode: str) -> None:
        owner = current_owner()
        hold = self._count_release(mode, owner)
        if hold is None:
            return
        started = time.monotonic()
        try:
            still_held = self.engine.release(self.group, self.name, owner, mode)
        except BaseException:
            self._released(hold, mode, started, None)
            raise
        if still_held and not hold.lost and not events._subscribers and not events._watchers:
            return     # all that _released would do: nothing to publish, lose, tell or raise
        self._released(hold, mode, started, still_held)

    async def _arelease(self, mode: str) -> None:
        owner = current_owner()
        hold = self._count_release(mode, owner)
        if hold is None:
            return
        started = time.monotonic()
        engine = self.engine
        if not engine.release_resendable:
            await self._arelease_shielded(engine, hold, mode, owner, started)
            return
        # An engine whose releases may be sent again (Engine.release_resendable): awaited in
        # this task, no task of its own. Once started, a release completes even if this task
        # is cancelled meanwhile: sent again in a task of its own (whether the first one
        # reached the server is unknown, so the answer says nothing about a lost hold). A
        # cancellation that a layer below swallowed (Python < 3.12, see arun_steps) is
        # raised after the release.
        task = asyncio.current_task()
        cancels = cancelling(task)
        try:
            still_held = await engine.arelease(self.group, self.name, owner, mode)
        except asyncio.CancelledError:
            resent = asyncio.ensure_future(engine.arelease(self.group, self.name, owner, mode))
            _resent.add(resent)

            def resent_done(done: asyncio.Future[bool]) -> None:
                _resent.discard(done)
                _result(done)           # its error is retrieved, not logged as never retrieved
                _quietly(self._released, hold, mode, started, None)
            resent.add_done_callback(resent_done)
            raise
        except BaseException:
            self._released(hold, mode, started, None)
            raise
        if cancelling(task) > cancels:
            _quietly(self._released, hold, mode, started, still_held)
            raise asyncio.CancelledError
        self._released(hold, mode, started, still_held)

    async def _arelease_shielded(self, engine: Engine, hold: Hold, mode: str, owner: str, started: float) -> None:
        """The release of any other engine: in a task of its own, shielded, so that once
        started it completes even if this task is cancelled meanwhile."""
        release = asyncio.ensure_future(engine.arelease(self.group, self.name, owner, mode))
        still_held: bool | None = None
        try:
            still_held = await asyncio.shield(release)
        except asyncio.CancelledError:
            release.add_done_callback(lambda done: _quietly(self._released, hold, mode, started, _result(done)))
            raise
        finally:
            if release.done() and not release.cancelled():
                self._released(hold, mode, started, still_held)


    # -- holds that change hands ----------------------------------------------------------------

    def detach(self, lease: float | None = None) -> Ticket:
        """End this owner's hold here without releasing it on the server, and return a
        :class:`Ticket` with which another thread or process takes it over
        (:meth:`adopt`). Nobody renews the hold between the two: its lease bounds how long a
        ticket that is never adopted blocks others. ``lease``: seconds the hold is to last
        unadopted from now (a ticket that waits in a task queue needs longer than the
        lock's own lease; default: the lock's)."""
        lease = self.lease if lease is None else options.lease(lease, "detach lease")
        owner = current_owner()
        hold = _holds.get(self._key(owner))
        if hold is None:
            raise LockNotOwned("this owner holds nothing to detach", group=self.group, name=self.name)
        if hold.lost:
            raise LockLost(f"this owner's hold was lost ({hold.lost_reason})", group=self.group, name=self.name)
        modes = hold.held_modes()
        if len(modes) != 1:
            raise LockError("this owner holds both the write and the read lock (a downgrade): release one "
                            "before detaching", group=self.group, name=self.name)
        mode = modes[0][0]
        if self.engine.needs_renewal:
            # A new hold may still have its short first lease: give the ticket all of its own.
            renewed, = self.engine.renew([RenewItem(self.group, self.name, owner, mode, lease)])
            if renewed is False:
                HOLDS.lose(hold, "the server no longer had this hold at detach")
                raise LockLost("the hold was lost before it could be detached", group=self.group, name=self.name)
        HOLDS.remove(hold)
        self.engine.detached(self.group, self.name, mode, owner, lease)
        events.publish(events.DETACHED, self.group, self.name, self.engine.scheme, mode, owner=owner,
                       token=hold.token)
        return Ticket(self.kind, self.group, self.name, mode, owner, hold.token, self.lease, self.permits,
                      owner_process())

    @classmethod
    def adopt(cls, engine: Engine, ticket: Ticket | Mapping[str, Any], **lock_options: Any) -> Any:
        """Take over the hold that ``ticket`` (from :meth:`detach`, or its :meth:`Ticket.as_dict`)
        describes, as the calling thread or task, and return the lock (or semaphore: the
        ticket says which) holding it: the token is unchanged, and this process's watchdog
        renews it from now on, with the lock's lease (``lease=`` among ``lock_options``, else the
        detached lock's) from the adoption on. Raise :class:`LockLost` if the hold is gone
        (lost, or adopted already)."""
        t = ticket if isinstance(ticket, Ticket) else Ticket.from_dict(ticket)
        lock_options.setdefault("lease", t.lease)
        target: Lock | Semaphore = Semaphore(engine, t.group, t.name, permits=t.permits, **lock_options) \
            if t.kind == SEMAPHORE else Lock(engine, t.group, t.name, **lock_options)
        if not engine.adopts_across_processes and t.process != owner_process():
            raise ConfigurationError(f"{type(engine).__name__} holds live in the session of the process that took "
                                     "them: a ticket can be adopted only in the process that detached it",
                                     group=t.group, name=t.name)
        owner = current_owner()
        if not engine.adopt(t.group, t.name, t.mode, t.owner, owner, t.token):
            raise LockLost("the ticket's hold is gone: its lease ran out, it was force-released, or it was "
                           "adopted already", group=t.group, name=t.name)
        if engine.needs_renewal:
            # From now on the adopter's lease, not what was left of the ticket's.
            engine.renew([RenewItem(t.group, t.name, owner, t.mode, target.lease)])
        hold = Hold(engine, t.group, t.name, owner, target.lease, t.token, t.kind)
        if t.mode == WRITE:
            hold.writes = 1
        else:
            hold.reads = 1
        if HOLDS.add(hold, t.mode, target.lease / 3):
            WATCHDOG.ensure_running()
        events.publish(events.ADOPTED, t.group, t.name, engine.scheme, t.mode, owner=owner, token=t.token)
        return target


class Ticket(NamedTuple):
    """A detached hold, on its way to the owner that adopts it (:meth:`Lock.detach`,
    :meth:`Lock.adopt`). Engine-independent and small; ``as_dict()`` is JSON-ready (for a
    Celery task's headers, say), ``Ticket.from_dict()`` reads it back."""

    kind: str             # "lock" or "semaphore"
    group: str
    name: str
    mode: str             # "write", "read" or "permit"
    owner: str            # the owner id that held it
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


class Lock(_Holding):
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
        self._acquire(WRITE, self.timeout if timeout is DEFAULT else timeout, True)

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
        self._acquire(READ, self.timeout if timeout is DEFAULT else timeout, True)

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
        return Guard(self, WRITE, self.timeout if timeout is DEFAULT else timeout, context)

    def read(self, timeout: float | None = DEFAULT, *, context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager (and decorator) holding the read lock."""
        return Guard(self, READ, self.timeout if timeout is DEFAULT else timeout, context)

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
        await self._aacquire(WRITE, self.timeout if timeout is DEFAULT else timeout, True)

    async def atry_lock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the write lock if it can be had within ``timeout``; return whether it was."""
        return await self._aacquire(WRITE, timeout, False)

    async def aunlock(self) -> None:
        """Release one level of this task's write hold (see :meth:`unlock`); once started, the
        release completes even if the task is cancelled."""
        await self._arelease(WRITE)

    async def arlock(self, timeout: float | None = DEFAULT) -> None:
        """Acquire the read lock from an asyncio task (see :meth:`alock`)."""
        await self._aacquire(READ, self.timeout if timeout is DEFAULT else timeout, True)

    async def atry_rlock(self, timeout: float | None = 0.0) -> bool:
        """Acquire the read lock if it can be had within ``timeout``; return whether it was."""
        return await self._aacquire(READ, timeout, False)

    async def arunlock(self) -> None:
        """Release one level of this task's read hold."""
        await self._arelease(READ)

#: Seconds the interpreter's exit may spend releasing what this process still holds.
EXIT_BUDGET = 3.0


def release_all(budget: float = EXIT_BUDGET) -> int:
    """Release every hold this process still has (all its owners, every mode), within
    ``budget`` seconds; return how many engine releases were made. Run at interpreter exit,
    so that a worker that exits normally (gunicorn's ``max_requests``, ``sys.exit``, the end
    of a management command) frees its locks at once instead of after their lease. A crash
    (SIGKILL) still costs the lease."""
    deadline = time.monotonic() + budget
    released = 0
    down: dict[int, int] = {}       # engines found unavailable: how many holds were left to their lease
    for hold in HOLDS.holds():
        HOLDS.remove(hold)
        for mode, _ in hold.held_modes():
            if time.monotonic() >= deadline:
                break
            if mode == WRITE:
                hold.writes = 0
            else:
                hold.reads = 0
            if id(hold.engine) in down:     # each would wait its connect timeout again: leave it
                down[id(hold.engine)] += 1
                continue
            try:
                hold.engine.release(hold.group, hold.name, hold.owner, mode)
                released += 1
            except EngineUnavailable as exc:
                down[id(hold.engine)] = 0
                logger.warning("ylock: could not release %s/%s at exit: %s", hold.group, hold.name, exc)
            except Exception as exc:  # noqa: BLE001 - at exit: its lease frees it
                logger.warning("ylock: could not release %s/%s at exit: %s", hold.group, hold.name, exc)
    skipped = sum(down.values())
    if skipped:
        logger.warning("ylock: %d more holds left to their lease at exit: their engine was unavailable", skipped)
    return released


atexit.register(release_all)


def _watching() -> tuple[events.Watcher, ...]:
    """The watchers that watch this acquisition (none: the plain path)."""
    watchers = events.watchers()
    return tuple(w for w in watchers if w.on()) if watchers else ()


#: Releases sent again after a cancelled one (see ``_arelease_direct``), referenced until done:
#: the event loop keeps only weak references to its tasks.
_resent: set[asyncio.Future[bool]] = set()


def _result(task: asyncio.Future[bool]) -> bool | None:
    return None if task.cancelled() or task.exception() is not None else task.result()


def _quietly(func: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(LockLost):
        func(*args)


class Semaphore(_Holding):
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

    def __repr__(self) -> str:
        return f"<ylock.Semaphore {self.group}/{self.name} ({self.permits} permits) on {self.engine!r}>"

    def _key(self, owner: str) -> tuple[Any, ...]:
        return (self.engine, self.group, self.name, owner, SEMAPHORE)

    def _what(self, mode: str) -> str:
        return "a permit"

    def acquire(self, timeout: float | None = DEFAULT) -> None:
        """Take a permit, waiting up to ``timeout`` seconds (None: forever); raise
        :class:`LockTimeout` if none could be had in time."""
        self._acquire(PERMIT, self.timeout if timeout is DEFAULT else timeout, True)

    def try_acquire(self, timeout: float | None = 0.0) -> bool:
        """Take a permit if one can be had within ``timeout``; return whether it was."""
        return self._acquire(PERMIT, timeout, False)

    def release(self) -> None:
        """Give back one level of this owner's permit: :class:`LockNotOwned` if it holds none,
        :class:`LockLost` if its lease was lost meanwhile."""
        self._release(PERMIT)

    async def aacquire(self, timeout: float | None = DEFAULT) -> None:
        """:meth:`acquire` from an asyncio task (no thread waits; a cancelled wait holds nothing)."""
        await self._aacquire(PERMIT, self.timeout if timeout is DEFAULT else timeout, True)

    async def atry_acquire(self, timeout: float | None = 0.0) -> bool:
        """:meth:`try_acquire` from an asyncio task."""
        return await self._aacquire(PERMIT, timeout, False)

    async def arelease(self) -> None:
        """:meth:`release` from an asyncio task (completes even if the task is cancelled)."""
        await self._arelease(PERMIT)

    def hold(self, timeout: float | None = DEFAULT, *, context: Mapping[str, Any] | None = None) -> Guard:
        """Return a context manager (and decorator, sync or async) holding a permit."""
        return Guard(self, PERMIT, self.timeout if timeout is DEFAULT else timeout, context)

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
            _validated(engine, fair, lease, polling, timeout)
        self.group = check_group(group)
        self.permits = options.number(permits, "permits", minimum=1, maximum=1_000_000, integer=True)

    def __repr__(self) -> str:
        return f"<ylock.Semaphores {self.group}/* ({self.permits} permits) on {self.engine!r}>"

    def __getitem__(self, name: str) -> Semaphore:
        return Semaphore._checked(self.engine, self.group, name, self.permits, self.fair, self.lease,
                                  self.polling, self.timeout)


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


class Locks:
    """A family of locks in one group, one per name (e.g. one per user); the verbs take
    the name first. ``locks["user-42"]`` is the :class:`Lock` for that name."""

    __slots__ = ("engine", "group", "fair", "lease", "polling", "timeout")

    def __init__(self, engine: Engine, group: str, *, fair: bool = True, lease: float = 30.0,
                 polling: Polling | None = None, timeout: float | None = None) -> None:
        self.engine, self.fair, self.lease, self.polling, self.timeout = \
            _validated(engine, fair, lease, polling, timeout)
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
