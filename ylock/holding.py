"""What a :class:`~ylock.Lock` and a :class:`~ylock.Semaphore` share: their options, the owner's
hold (reentrancy counted here, never on the server), the calls to the engine, blocking or
asyncio, and what the watchers and subscribers of :mod:`ylock.events` hear of them.

Only first acquisitions and final releases reach the engine. A verb's ``timeout`` is
resolved once, by :meth:`Holding.timeout_for` (:data:`DEFAULT`: the lock's own). A watched
acquisition (tracing) is asked of the engine once: the engine calls back when it first has
to wait (:attr:`ylock.engines.base.AcquireRequest.queued`), and the watchers hear it then.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ylock import events, exiting, options, sigterm, tickets
from ylock.engines.base import READ, WRITE, AcquireRequest, Engine, cancelling
from ylock.errors import LockLost, LockNotOwned, LockTimeout, LockUpgradeError
from ylock.guard import DEFAULT, Guard
from ylock.holds import HOLDS, LOCK, Grant, Hold
from ylock.names import check_group, check_name
from ylock.owner import _doing, current_owner, describe_holder
from ylock.tickets import Ticket
from ylock.waiting import DEFAULT_POLLING, Polling
from ylock.watchdog import WATCHDOG

__all__ = ["DEFAULT", "Holding", "validated"]

_new_request = tuple.__new__
_holds = HOLDS.by_key      # read without a lock on the re-entry path (see ylock.holds)


def validated(engine: Engine, fair: bool, lease: float, polling: Polling | None,
              timeout: float | None) -> tuple[Engine, bool, float, Polling, float | None]:
    """Check the options that a lock, a semaphore and their families share."""
    if not isinstance(engine, Engine):
        raise options.fail("engine", f"must be a ylock engine (see ylock.engine_from_url), got {engine!r}",
                           options.E_LOCK_OPTION)
    if polling is not None and not isinstance(polling, Polling):
        raise options.fail("polling", f"must be a ylock.Polling, got {polling!r}", options.E_LOCK_OPTION)
    return (engine, options.boolean(fair, "fair"), options.lease(lease), polling or DEFAULT_POLLING,
            options.timeout(timeout))


class Holding:
    """What a :class:`Lock` and a :class:`Semaphore` share: options, the owner's hold
    (reentrancy counted here, never on the server), events, and the calls to the engine,
    blocking or asyncio. Only first acquisitions and final releases reach the engine."""

    __slots__ = ("engine", "group", "name", "fair", "lease", "polling", "timeout")
    #: The class that adopts a ticket's hold, by its kind (see :meth:`adopt`).
    _kinds: ClassVar[dict[str, type[Holding]]] = {}
    #: What this is of, for the hold table ("lock" or "semaphore").
    kind = LOCK
    #: The number of permits (a semaphore's; 0 for a lock).
    permits = 0
    #: The modes it can be held in (:meth:`guard`).
    modes: tuple[str, ...] = (WRITE, READ)

    def __init__(self, engine: Engine, group: str, name: str = "global", *, fair: bool = True,
                 lease: float = 30.0, polling: Polling | None = None, timeout: float | None = None) -> None:
        self.engine, self.fair, self.lease, self.polling, self.timeout = \
            validated(engine, fair, lease, polling, timeout)
        self.group = check_group(group)
        self.name = check_name(name)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Holding._kinds.setdefault(cls.kind, cls)     # the first class of a kind: Lock, Semaphore

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
        """True once this thread's hold could not be renewed (it may be someone else's now):
        from the moment its lease may have run out on the server, before anyone else can
        be granted it, even while the watchdog still waits for a renewal's answer."""
        hold = self._hold()
        return hold is not None and HOLDS.lost_now(hold)

    def guard(self, mode: str, timeout: float | None = DEFAULT, *,
              context: Mapping[str, Any] | None = None) -> Guard:
        """Return the :class:`Guard` holding this in ``mode`` (a lock: ``"write"`` or ``"read"``,
        as :meth:`Lock.write` and :meth:`Lock.read`; a semaphore: ``"permit"``, as
        :meth:`Semaphore.hold`): for code that gets the mode as data (a setting, a request's
        method), with the guard's verbs (``try_acquire``, ``release`` and their asyncio twins)."""
        if mode not in self.modes:
            raise options.fail("mode", f"must be one of {', '.join(map(repr, self.modes))} for {self!r}, "
                               f"got {mode!r}", options.E_LOCK_OPTION)
        return Guard(self, mode, self.timeout_for(timeout), context)

    # -- the work (shared by both worlds; only the engine call differs) ---------------------------

    def _request(self, mode: str, owner: str, deadline: float | None, context: Mapping[str, Any] | None = None,
                 queued: Callable[[Mapping[str, Mapping[str, Any]] | None], None] | None = None) -> AcquireRequest:
        # tuple.__new__ straight from C: a NamedTuple's own __new__ is a Python call per acquisition.
        return _new_request(AcquireRequest, (self.group, self.name, owner, mode, self.fair, self.lease, deadline,
                                             self.polling, self.permits,
                                             # describe_holder's own first test, without the call
                                             describe_holder(context) if context or _doing.get() else "",
                                             queued))

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
        waiter_lease = self.polling.waiter_lease
        if HOLDS.renew_from(hold, READ, waiter_lease / 3, token.granted if token.__class__ is Grant else None,
                            min(self.lease, waiter_lease) if self.engine.grants_waiter_lease else None):
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
        # A grant lasts the waiter's short lease on the server until the watchdog renews it:
        # counted from when the call that granted it was sent if the engine says (a Grant),
        # else from its answer.
        granted = None
        if token.__class__ is Grant:
            granted, token = token.granted, int(token)
        hold = Hold(self.engine, self.group, self.name, owner, self.lease, token, self.kind)
        if mode == WRITE:
            hold.writes = 1
        else:
            hold.reads = 1
        # The watchdog's thread is started once: looked at here before calling ensure_running
        # (its check_fork ran already: current_owner() checks for a fork on every lock call).
        # (the first lease: the waiter's where the engine grants with it, else the whole lease)
        waiter_lease = self.polling.waiter_lease
        first = (self.lease if self.lease < waiter_lease else waiter_lease) if self.engine.grants_waiter_lease else None
        if HOLDS.add(hold, mode, waiter_lease / 3, granted, first) and WATCHDOG._thread is None:
            WATCHDOG.ensure_running()
        if not sigterm.checked:
            sigterm.install(exiting.release_all, exiting.EXIT_BUDGET)   # `kill PID` of a script gives its holds back
        if watched is not None:
            for watcher in watched.watchers:
                watcher.held(watched, hold)
        if events._subscribers:
            events.publish(events.ACQUIRED, self.group, self.name, self.engine.scheme, mode,
                           owner=owner, token=token, wait=time.monotonic() - started)
        return True

    def timeout_for(self, timeout: Any) -> float | None:
        """Return the seconds a call given ``timeout`` waits: :data:`DEFAULT` is this lock's
        own ``timeout`` (validated when the lock was made), anything else is checked here
        (None: forever). Every verb resolves its timeout here, once."""
        if timeout is DEFAULT:
            return self.timeout
        return None if timeout is None else options.timeout(timeout)

    def _acquire(self, mode: str, timeout: Any, raise_on_timeout: bool,
                 context: Mapping[str, Any] | None = None) -> bool:
        timeout = self.timeout_for(timeout)
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
            # The engine says when it starts to wait (watched.queued): no try of our own first.
            token = self.engine.acquire(self._request(mode, owner, deadline, watched.context, watched.queued))
        except BaseException as exc:
            for watcher in watching:
                watcher.waited(watched, None, exc)
            raise
        for watcher in watching:
            watcher.waited(watched, token, None)
        return self._taken(mode, owner, token, started, timeout, raise_on_timeout, watched)

    async def _aacquire(self, mode: str, timeout: Any, raise_on_timeout: bool,
                        context: Mapping[str, Any] | None = None) -> bool:
        timeout = self.timeout_for(timeout)
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
            token = await self.engine.aacquire(self._request(mode, owner, deadline, watched.context,
                                                             watched.queued))
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

    # -- holds that change hands (ylock.tickets) -------------------------------------------------

    def detach(self, lease: float | None = None) -> Ticket:
        """End this owner's hold here without releasing it on the server, and return a
        :class:`~ylock.Ticket` with which another thread or process takes it over
        (:meth:`adopt`). Nobody renews the hold between the two: its lease bounds how long a
        ticket that is never adopted blocks others. ``lease``: seconds the hold is to last
        unadopted from now (a ticket that waits in a task queue needs longer than the
        lock's own lease; default: the lock's)."""
        return tickets.detach(self, lease)

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
        target = cls._kinds[t.kind]._for_ticket(engine, t, lock_options)
        tickets.adopt(engine, t, target)
        return target

    @classmethod
    def _for_ticket(cls, engine: Engine, ticket: Ticket, lock_options: dict[str, Any]) -> Holding:
        """The lock (or semaphore) that adopts ``ticket``'s hold."""
        return cls(engine, ticket.group, ticket.name, **lock_options)


def _watching() -> tuple[events.Watcher, ...]:
    """The watchers that watch this acquisition (none: the plain path)."""
    watchers = events.watchers()
    return tuple(w for w in watchers if w.on()) if watchers else ()


#: Releases sent again after a cancelled one (see ``Holding._arelease``), referenced until done:
#: the event loop keeps only weak references to its tasks.
_resent: set[asyncio.Future[bool]] = set()


def _result(task: asyncio.Future[bool]) -> bool | None:
    return None if task.cancelled() or task.exception() is not None else task.result()


def _quietly(func: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(LockLost):
        func(*args)
