"""An in-memory engine for users' tests, with the faults a test needs to reach every path
of its code: a lock that is busy, an engine that is down, a hold that is lost.

    from ylock.testing.local import LocalTestEngine

    engine = LocalTestEngine()
    with engine.busy("orders", "42"):           # another owner holds orders/42
        ...                                     # your code: LockTimeout, 423, TaskLocked
    with engine.unavailable():                  # every engine call raises EngineUnavailable
        ...                                     # your code: 503
    with engine.lost("orders", "42"):           # every hold of orders/42 taken here is lost
        ...                                     # your code: lock.lost is True, LockLost at release

:class:`LocalTestEngine` is :class:`~ylock.engines.local.LocalEngine` (the same admission,
lease, token and queue code) plus the switches. The faults take the paths the real ones
take: the busy lock is held by another owner (its own owner scope, renewed by the
watchdog like any hold); a down engine raises :class:`ylock.EngineUnavailable` from the
engine calls, as a server that does not answer does; a lost hold's lease runs out on the
engine (others may take the lock; the release finds nothing) and the process's hold table
is told, as a renewal that finds no lock tells it. No mock stands in for anything.

The pytest plugin (:mod:`pytest_ylock`) hands one to each test that asks
(``ylock_engine``) and wires it into Django's and Flask's settings; :meth:`django_setting`
and :meth:`flask_config` do the wiring by hand, e.g. for an app factory.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ylock import events
from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, AcquireRequest, Listing, RenewItem
from ylock.engines.local import LocalEngine
from ylock.errors import EngineUnavailable
from ylock.holds import HOLDS
from ylock.lock import Lock
from ylock.owner import new_owner, owner_scope
from ylock.semaphore import Semaphore

#: Every live test engine by name, for :func:`shared` (the dotted path the settings name).
_named: weakref.WeakValueDictionary[str, LocalTestEngine] = weakref.WeakValueDictionary()
_numbers = itertools.count(1)

Target = Lock | Semaphore | str


def shared(name: str) -> LocalTestEngine:
    """Return the live test engine called ``name``: the factory that settings name, as
    ``{"ENGINE": "ylock.testing.local.shared", "OPTIONS": {"name": ...}}``, so that the
    code under test and the test share one lock space however often the settings are
    re-read (Django re-reads them after every ``override_settings``)."""
    engine = _named.get(name)
    if engine is None:
        raise LookupError(f"no live ylock test engine named {name!r}: the settings outlived the test "
                          "(or the fixture) that made it")
    return engine


class LocalTestEngine(LocalEngine):
    """An in-process engine with switches for faults (see the module docstring)."""

    def __init__(self, url: str = "local://", *, name: str | None = None) -> None:
        super().__init__(url)
        self.name = name or f"test-{next(_numbers)}"
        self._down: str | None = None              # why the engine is unavailable, while it is
        self._losing: list[tuple[str, str, str]] = []    # (kind, group, name) whose new holds are lost
        self._switch = threading.Lock()
        _named[self.name] = self

    # -- settings ----------------------------------------------------------------------

    def engine_setting(self) -> dict[str, Any]:
        """Return an ``ENGINES`` entry that resolves to this engine."""
        return {"ENGINE": f"{__name__}.shared", "OPTIONS": {"name": self.name}}

    def django_setting(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Return the ``YLOCK`` setting ``base`` (e.g. your project's, to keep its ``LOCKS``)
        with every engine alias, and ``default``, resolving to this engine."""
        setting = dict(base or {})
        aliases = set(setting.get("ENGINES") or {}) | {"default"}
        setting["ENGINES"] = {alias: self.engine_setting() for alias in sorted(aliases)}
        setting.pop("METRICS", None)       # no exporter talks to a server from a unit test
        return setting

    def flask_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Return the ``app.config`` keys that make ``flask_ylock`` use this engine for
        every engine alias in ``config`` (e.g. ``app.config``), and ``default``."""
        config = config or {}
        aliases = set(config.get("YLOCK_ENGINES") or {}) | {"default"}
        return {"YLOCK_ENGINES": {alias: self.engine_setting() for alias in sorted(aliases)}, "YLOCK_URL": None,
                "YLOCK_METRICS": None}

    # -- an engine that is down ------------------------------------------------------------

    @contextlib.contextmanager
    def unavailable(self, reason: str = "the engine was made unavailable by the test") -> Iterator[LocalTestEngine]:
        """Make every call to this engine raise :class:`ylock.EngineUnavailable` inside the
        ``with`` block, as a server that does not answer does: acquisitions, releases,
        renewals (holds taken before are lost once a whole lease passes without one) and
        listings."""
        with self._switch:
            before, self._down = self._down, reason
        try:
            yield self
        finally:
            with self._switch:
                self._down = before

    def _check(self) -> None:
        reason = self._down
        if reason is not None:
            raise EngineUnavailable(f"{self!r} is unavailable: {reason}")

    def acquire(self, request: AcquireRequest) -> int | None:
        self._check()
        return super().acquire(request)

    async def aacquire(self, request: AcquireRequest) -> int | None:
        self._check()
        return await super().aacquire(request)

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        self._check()
        return super().release(group, name, owner, mode)

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        self._check()
        return super().renew(items)

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        self._check()
        return super().describe(group, limit)

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        self._check()
        return super().force_release(group, name, kind)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        self._check()
        return super().adopt(group, name, mode, old_owner, new_owner, token)

    def ping(self) -> None:
        self._check()

    # -- a lock that is busy ---------------------------------------------------------------

    @contextlib.contextmanager
    def busy(self, target: Target, name: str | None = None, *, mode: str = WRITE,
             permits: int | None = None) -> Iterator[list[str]]:
        """Hold ``target`` by another owner inside the ``with`` block, so that your code
        waits for it and times out (``LockTimeout``, a 423, ``TaskLocked``); yield the
        holders' owner ids.

        ``target``: a :class:`ylock.Lock` or :class:`ylock.Semaphore` on this engine (e.g.
        ``django_ylock.locks("accounts")["7"]``), or a group with ``name``. ``mode``:
        "write" (default: nobody else gets in) or "read" (readers still do). A semaphore has
        all its permits taken (a 429), or ``permits`` of them.
        """
        holder = self._target(target, name, permits)
        if isinstance(holder, Semaphore):
            count = holder.permits if permits is None else permits
        elif permits is not None:
            raise TypeError(f"permits= is for a semaphore; {holder!r} is a lock")
        else:
            if mode not in (WRITE, READ):
                raise ValueError(f"mode must be 'write' or 'read', got {mode!r}")
            count = 1
        owners: list[str] = []
        try:
            for _ in range(count):
                owner = new_owner()
                with owner_scope(owner):
                    if isinstance(holder, Semaphore):
                        got = holder.try_acquire(0)
                    else:
                        got = holder.try_lock(0) if mode == WRITE else holder.try_rlock(0)
                if not got:
                    raise RuntimeError(f"{holder!r} cannot be made busy: it is held already (by the code under "
                                       "test, or a busy() block still open)")
                owners.append(owner)
            yield owners
        finally:
            for owner in owners:
                with owner_scope(owner), contextlib.suppress(Exception):
                    if isinstance(holder, Semaphore):
                        holder.release()
                    elif mode == WRITE:
                        holder.unlock()
                    else:
                        holder.runlock()

    # -- a hold that is lost ---------------------------------------------------------------

    def lose(self, target: Target, name: str | None = None) -> int:
        """Make every current hold of ``target`` lost, now: its lease runs out on the engine
        (another owner may take it) and its holder is told, so that ``lock.lost`` is True
        and its release raises :class:`ylock.LockLost`. Return how many holds were lost."""
        holder = self._target(target, name, None)
        return self._expire(_kind_of(holder), holder.group, holder.name, None)

    @contextlib.contextmanager
    def lost(self, target: Target, name: str | None = None) -> Iterator[LocalTestEngine]:
        """Make every hold of ``target`` taken inside the ``with`` block lost as soon as it is
        taken (see :meth:`lose`): for code that takes a lock and works under it (a view, a
        task), which the test cannot interrupt in between."""
        holder = self._target(target, name, None)
        key = (_kind_of(holder), holder.group, holder.name)

        # The hold enters the process's hold table after the engine granted it, just before
        # the ``acquired`` event is published (synchronously, in the acquiring thread): the
        # event is the first moment the hold can be lost the way a real one is.
        def on_event(event: events.Event) -> None:
            if event.kind == events.ACQUIRED and (SEMAPHORE if event.mode == PERMIT else LOCK,
                                                  event.group, event.name) in self._losing:
                self._expire(SEMAPHORE if event.mode == PERMIT else LOCK, event.group, event.name, event.owner)

        with self._switch:
            self._losing.append(key)
        events.subscribe(on_event)
        try:
            yield self
        finally:
            events.unsubscribe(on_event)
            with self._switch:
                self._losing.remove(key)

    def _expire(self, kind: str, group: str, name: str, owner: str | None) -> int:
        """Run out the lease of ``owner``'s hold (every holder's, if None) on the engine, then
        mark the holds lost in the hold table, the way a renewal that finds no lock does."""
        with self._mutex:
            state = self._states.get((kind, group, name))
            if state is not None:
                now = time.monotonic()
                if state.writer is not None and owner in (None, state.writer):
                    state.writer_deadline = now
                for reader in state.readers:
                    if owner in (None, reader):
                        state.readers[reader] = now
                state.expire(now)
                for waiter in state.queue:
                    waiter.mailbox.poke()           # the lock may be free for a waiter now
                self._tidy(kind, group, name, state)
        return HOLDS.mark_lost(self, group, name, owner, detail="its lease ran out (made lost by the test)",
                               kind=kind)

    # -- helpers ---------------------------------------------------------------------------

    def _target(self, target: Target, name: str | None, permits: int | None) -> Lock | Semaphore:
        if isinstance(target, (Lock, Semaphore)):
            if name is not None:
                raise TypeError("give a Lock or Semaphore, or a group and a name, not both")
            if target.engine is not self:
                raise ValueError(f"{target!r} is not on this test engine ({self!r}): take it from the settings the "
                                 "test engine is wired into (the ylock_django / ylock_flask fixtures), or build it "
                                 "on this engine")
            return target
        if isinstance(target, str) and isinstance(name, str):
            if permits is not None:
                return Semaphore(self, target, name, permits=permits)
            return Lock(self, target, name)
        raise TypeError(f"expected a ylock.Lock, a ylock.Semaphore, or a group and a name; got {target!r}, {name!r}")

    def forget_holds(self) -> int:
        """Drop this process's holds on this engine from the hold table (the end of a test
        that left some behind), so that nothing renews them any longer; return how many."""
        holds = HOLDS.holds(self)
        for hold in holds:
            HOLDS.remove(hold)
        return len(holds)

    def close(self) -> None:
        """Keep the lock space: settings re-read in mid-test close the engines they built."""

    def url_for_display(self) -> str:
        return f"local:// (test engine {self.name})"


def _kind_of(target: Lock | Semaphore) -> str:
    return SEMAPHORE if isinstance(target, Semaphore) else LOCK
