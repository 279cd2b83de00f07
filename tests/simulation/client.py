"""The simulation's one coupling to the code under test: everything it takes from
``ylock.engines.redis.engine``/``steps``, ``ylock.engines.local``, ``ylock.holds`` and
what it mirrors of ``ylock.lock`` and ``ylock.watchdog`` lives here, so that a change of
their signatures is an edit of this module only.

A simulated process runs its lock calls as generators of *operations* (the classes below),
which the world (:mod:`tests.simulation.world`) carries out on its virtual network and
server: the Redis engine's own acquisition steps (:func:`acquire_steps`) are fed through
:meth:`RedisProtocol.acquire`, the local engine's through :meth:`LocalProtocol.acquire`.
What is mirrored rather than called (the facade's bookkeeping around an engine call, the
watchdog thread's loop, the engine's first try) is a few lines each, marked below; the
renewal schedule itself is the real :class:`~ylock.holds.HoldTable`.

Clocks: the modules under test read ``time.monotonic()``; :func:`virtual_time` gives them
:data:`CLOCK` instead, which answers the simulated process's clock in the simulation's
thread (and the real clock in any other thread).
"""
from __future__ import annotations

import contextlib
import random
import threading
import time as _time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ylock import holds as _holds_module
from ylock.engines import local as _local_module
from ylock.engines.base import Abandon, AcquireRequest
from ylock.engines.local import LocalEngine
from ylock.engines.redis import engine as _engine_module
from ylock.engines.redis import inspection as _inspection
from ylock.engines.redis import steps as _steps_module
from ylock.engines.redis.engine import RedisEngine
from ylock.engines.redis.scripts import ACQUIRE, RELEASE, SOURCES, release_args
from ylock.engines.redis.steps import Acquire, Pop, Release, Sleep, acquire_steps, queued_too_late
from ylock.errors import EngineUnavailable, LockLost
from ylock.holds import PERMIT, READ, SEMAPHORE, WRITE, Grant, Hold, HoldTable, RenewItem
from ylock.waiting import Polling
from ylock.watchdog import SPREAD

__all__ = ["CLOCK", "BlockingPop", "LocalProtocol", "LocalWait", "Pause", "Process", "RedisProtocol", "RenewBatch",
           "Script", "SimPolling", "WatchdogSleep", "virtual_time"]

Ops = Generator[Any, Any, Any]


# -- the operations a simulated process asks of the world --------------------------------------

class Script(NamedTuple):
    """EVALSHA one script with its ``keys`` by ``end`` (the process's clock); answers its
    reply (raises EngineUnavailable if none came in time). ``first``: the engine's own first
    try of an acquisition (not one of its steps')."""

    name: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    end: float
    first: bool = False


class RenewBatch(NamedTuple):
    """A pipeline of renew script calls (keys, args) by ``end``; answers their replies (an
    exception for a failed one)."""

    calls: tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]
    end: float


class BlockingPop(NamedTuple):
    """BLPOP ``key`` blocking ``block`` s on the server, the whole call by ``end``."""

    key: str
    block: float
    end: float


class Pause(NamedTuple):
    """Sleep ``seconds`` without the server."""

    seconds: float


class LocalWait(NamedTuple):
    """The local engine's wait: a Mailbox event, or None at ``until`` (the process's clock;
    None: forever)."""

    mailbox: Any
    until: float | None


class WatchdogSleep(NamedTuple):
    """The watchdog waits until ``until`` (client clock; None: until a renewal is scheduled),
    or until the hold table's ``wake_at`` falls below it (what ``changed.notify()`` does)."""

    until: float | None


# -- the virtual clock -------------------------------------------------------------------------

class _VirtualTime:
    """Stands for the ``time`` module in the modules under test."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, now: float | None) -> None:
        """The clock of the process now running in this thread (None: the real clock)."""
        self._local.now = now

    def monotonic(self) -> float:
        now = getattr(self._local, "now", None)
        return _time.monotonic() if now is None else now

    def time(self) -> float:
        now = getattr(self._local, "now", None)
        return _time.time() if now is None else 1_700_000_000.0 + now

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


CLOCK = _VirtualTime()
_TIMED_MODULES = (_steps_module, _engine_module, _holds_module, _local_module)


@contextlib.contextmanager
def virtual_time() -> Iterator[_VirtualTime]:
    """Give the modules under test :data:`CLOCK` for ``time`` while the simulation runs."""
    saved = [(module, module.time) for module in _TIMED_MODULES]
    for module, _ in saved:
        module.time = CLOCK        # type: ignore[attr-defined]
    try:
        yield CLOCK
    finally:
        CLOCK.set(None)
        for module, real in saved:
            module.time = real     # type: ignore[attr-defined]


@dataclass(frozen=True)
class SimPolling(Polling):
    """:class:`~ylock.Polling` whose jitter is drawn from the schedule's seed (the library's
    own generator is seeded from the OS)."""

    seed: int = 0

    def intervals(self) -> Iterator[float]:
        rng = random.Random(self.seed)
        interval = self.initial
        while True:
            yield interval * (1.0 - self.jitter * rng.random()) if self.jitter else interval
            interval = min(self.maximum, interval * self.multiplier)


# -- the engines' protocols, as operations ---------------------------------------------------

class RedisProtocol:
    """The Redis engine's calls as generators of operations. Built on a real, never connected
    :class:`RedisEngine` (its key grammar, arguments, options and reply handling)."""

    kind = "redis"

    def __init__(self, socket_timeout: float, barge_window: float = 0.1, fence_retention: float = 300.0) -> None:
        self.engine = RedisEngine("redis://127.0.0.1:9/0", socket_timeout=socket_timeout,
                                  barge_window=barge_window, fence_retention=fence_retention)
        self.socket_timeout = socket_timeout

    def sources(self) -> dict[str, str]:
        """The scripts as this engine loads them (constants filled in)."""
        return {name: self.engine._fill(source) for name, source in SOURCES.items()}

    def lock_keys(self, group: str, name: str, mode: str) -> tuple[str, ...]:
        """The keys the release, describe and force_release scripts declare."""
        return self.engine.keys.lock(group, name, mode)

    def acquire(self, r: AcquireRequest) -> Ops:
        """:meth:`RedisEngine.acquire`: its first try (mirrored), then the real steps."""
        engine = self.engine
        keys, args = engine._request(r)
        reply = None
        if r.deadline is None or CLOCK.monotonic() < r.deadline:
            reply = yield Script(ACQUIRE[r.mode], keys, tuple(args), CLOCK.monotonic() + engine.socket_timeout, True)
            if reply.__class__ is int:
                return reply
            if queued_too_late(r, reply):
                yield from self._abandon_first(acquire_steps(engine, r, keys, args, None))
                return None
        return (yield from self._run(acquire_steps(engine, r, keys, args, reply)))

    def _op(self, op: Any) -> Any:
        if isinstance(op, Acquire):
            return Script(op.script, op.keys, tuple(op.args), op.end)
        if isinstance(op, Pop):
            return BlockingPop(op.key, op.block, op.end)
        if isinstance(op, Release):
            return Script(op.script, op.keys, tuple(op.args), op.end)
        if isinstance(op, Sleep):
            return Pause(op.seconds)
        raise AssertionError(f"unknown step {op!r}")

    def _run(self, steps: Ops) -> Ops:
        """:func:`ylock.engines.base.run_steps`, each operation done by the world."""
        try:
            op = next(steps)
        except StopIteration as stop:
            return stop.value
        return (yield from self._drive(steps, op))

    def _abandon_first(self, steps: Ops) -> Ops:
        """:func:`ylock.engines.base.run_abandon_first`, each operation done by the world."""
        try:
            next(steps)
            op = steps.throw(Abandon())
            yield from self._drive(steps, op)
        except (StopIteration, Abandon, EngineUnavailable):
            return

    def _drive(self, steps: Ops, op: Any) -> Ops:
        """Do ``op`` and every operation the steps ask for after it; return what they return
        (an error of the world is thrown into the steps, as the engine's runners do)."""
        try:
            while True:
                try:
                    result = yield self._op(op)
                except EngineUnavailable as exc:
                    op = steps.throw(exc)
                else:
                    op = steps.send((result, 0) if isinstance(op, Acquire) else result)
        except StopIteration as stop:
            return stop.value

    def release(self, group: str, name: str, owner: str, mode: str) -> Ops:
        keys = self.lock_keys(group, name, mode)
        reply = yield Script(RELEASE[mode], keys, tuple(release_args(owner, mode)),
                             CLOCK.monotonic() + self.socket_timeout)
        return self.engine._released(group, name, reply)

    def renew(self, items: list[RenewItem]) -> Ops:
        """:meth:`RedisEngine.renew`: one pipeline of renew script calls."""
        renewed = self.engine.keys.renewed
        calls = tuple((renewed(i.group, i.name, i.mode), (i.owner, i.mode, int(i.lease * 1000))) for i in items)
        try:
            replies = yield RenewBatch(calls, CLOCK.monotonic() + self.socket_timeout)
        except EngineUnavailable:
            return [None] * len(items)
        return [None if isinstance(reply, Exception) else bool(reply) for reply in replies]

    def adopt(self, group: str, name: str, mode: str, old: str, new: str, token: int) -> Ops:
        reply = yield Script("adopt", self.engine.keys.adopted(group, name, mode), (old, new, mode, str(token)),
                             CLOCK.monotonic() + self.socket_timeout)
        return bool(reply)

    def describe(self, group: str, name: str, kind: str) -> Ops:
        """:meth:`RedisEngine.describe_lock`: its script by the world, its reply read by the
        engine's own :func:`~ylock.engines.redis.inspection.describe_lock`."""
        keys = self.lock_keys(group, name, PERMIT if kind == SEMAPHORE else WRITE)
        reply = yield Script("describe", keys, (), CLOCK.monotonic() + self.socket_timeout)
        return _inspection.describe_lock(_Answered(self.engine.keys, reply), group, name, kind)  # type: ignore[arg-type]

    def force_release_call(self, group: str, name: str, kind: str) -> tuple[str, tuple[str, ...]]:
        """(script, keys) of :meth:`RedisEngine.force_release` (an operator's, run by the world)."""
        return "force_release", self.lock_keys(group, name, PERMIT if kind == SEMAPHORE else WRITE)


class _Answered:
    """The engine parts :func:`inspection.describe_lock` reads: the keys, and the script's answer."""

    def __init__(self, keys: Any, reply: Any) -> None:
        self.keys = keys
        self.reply = reply

    def _run(self, name: str, keys: tuple[str, ...], args: list[Any], end: float | None = None) -> Any:
        return self.reply


class LocalProtocol:
    """The local engine's calls as operations: its acquisition steps wait on a Mailbox,
    everything else is a call in this process (no network, no server faults)."""

    kind = "local"
    socket_timeout = 0.0

    def __init__(self) -> None:
        self.engine = LocalEngine()
        #: Told (items, results) of every renewal (the world records them: they take no time).
        self.on_renew: Callable[[list[RenewItem], list[bool | None]], None] | None = None

    def acquire(self, r: AcquireRequest) -> Ops:
        steps = self.engine._acquire_steps(r)
        try:
            op = next(steps)
            while True:
                op = steps.send((yield LocalWait(op[1], op[2])))
        except StopIteration as stop:
            return stop.value

    def release(self, group: str, name: str, owner: str, mode: str) -> Ops:
        return self.engine.release(group, name, owner, mode)
        yield  # a generator, as the Redis protocol's

    def renew(self, items: list[RenewItem]) -> Ops:
        results = self.engine.renew(items)
        if self.on_renew is not None:
            self.on_renew(items, results)
        return results
        yield

    def adopt(self, group: str, name: str, mode: str, old: str, new: str, token: int) -> Ops:
        return self.engine.adopt(group, name, mode, old, new, token)
        yield

    def describe(self, group: str, name: str, kind: str) -> Ops:
        return self.engine.describe_lock(group, name, kind)
        yield


# -- one simulated process: the facade's bookkeeping and the watchdog, mirrored ------------------

@dataclass
class Ticket:
    """A detached hold on its way to another process (:class:`ylock.Ticket`'s fields used here)."""

    kind: str
    group: str
    name: str
    mode: str
    owner: str
    token: int
    permits: int


@dataclass
class Process:
    """One simulated process: its owner id, its HoldTable (the real one) and the lock calls
    of :mod:`ylock.lock` around an engine, as operations. ``on_lost(hold, why)`` is told
    whenever a hold is marked lost (the watchdog, a release that found nothing)."""

    name: str
    protocol: Any
    lease: float
    polling: Polling
    on_lost: Any
    table: HoldTable = field(default_factory=HoldTable)
    tickets: int = 0

    def owner(self, n: int) -> str:
        return f"sim:{self.name}:0:{n}"

    def request(self, kind: str, group: str, name: str, owner: str, mode: str, fair: bool,
                deadline: float | None, permits: int = 0,
                queued: Callable[[Any], None] | None = None) -> AcquireRequest:
        """The facade's request (``Holding._request``); ``queued``: a watched acquisition's
        callback (its tries ask for the holders' notes)."""
        return AcquireRequest(group, name, owner, mode, fair, self.lease, deadline, self.polling,
                              permits if kind == SEMAPHORE else 0, "", queued)

    def take(self, r: AcquireRequest, kind: str) -> Ops:
        """A first acquisition (``Lock._acquire``/``_taken``): the hold, or None at the deadline."""
        token = yield from self.protocol.acquire(r)
        if token is None:
            return None
        granted = None
        if token.__class__ is Grant:
            granted, token = token.granted, int(token)
        hold = Hold(self.protocol.engine, r.group, r.name, r.owner, self.lease, token, kind)
        if r.mode == WRITE:
            hold.writes = 1
        else:
            hold.reads = 1
        waiter_lease = self.polling.waiter_lease
        self.table.add(hold, r.mode, waiter_lease / 3, granted, min(self.lease, waiter_lease))
        if hold.lost:
            self.on_lost(hold, "acquire")
        return hold

    def downgrade(self, hold: Hold, fair: bool) -> Ops:
        """A write holder takes the read lock too (``Lock._acquire`` then ``_downgraded``)."""
        r = self.request(hold.kind, hold.group, hold.name, hold.owner, READ, fair, CLOCK.monotonic())
        token = yield from self.protocol.acquire(r)
        if token is None:
            raise LockLost("the server refused this write holder its downgrade to read")
        hold.reads = 1
        waiter_lease = self.polling.waiter_lease
        self.table.renew_from(hold, READ, waiter_lease / 3, token.granted if token.__class__ is Grant else None,
                              min(self.lease, waiter_lease))
        return int(token)

    def release(self, hold: Hold, mode: str) -> Ops:
        """A final release of ``mode`` (``Lock._count_release`` and ``_release``): True if the
        server still had it; marks the hold lost otherwise."""
        if mode == WRITE:
            hold.writes = 0
        else:
            hold.reads = 0
        if not hold.writes and not hold.reads:
            self.table.remove(hold)
        else:
            self.table.stop_renewing(hold, mode)
        still_held = yield from self.protocol.release(hold.group, hold.name, hold.owner, mode)
        if hold.lost or not still_held:
            self.table.lose(hold, "the server no longer had this hold at release")
            self.on_lost(hold, "release")
            return False
        return True

    def detach(self, hold: Hold, lease: float) -> Ops:
        """:func:`ylock.tickets.detach`: renew for the ticket's lease, hand the hold to a fresh
        owner id (the ticket's) through the engine's adopt, stop renewing; the ticket, or None
        if the hold was lost."""
        if hold.lost:
            return None
        mode = hold.held_modes()[0][0]
        renewed, = yield from self.protocol.renew([RenewItem(hold.group, hold.name, hold.owner, mode, lease)])
        if renewed is False:
            self.table.lose(hold, "the server no longer had this hold at detach")
            self.on_lost(hold, "detach")
            return None
        self.tickets += 1
        holder = f"sim:{self.name}:ticket:{self.tickets}"
        if not (yield from self.protocol.adopt(hold.group, hold.name, mode, hold.owner, holder, hold.token)):
            self.table.lose(hold, "the server no longer had this hold at detach")
            self.on_lost(hold, "detach")
            return None
        self.table.remove(hold)
        self.protocol.engine.detached(hold.group, hold.name, mode, holder, lease)
        return Ticket(hold.kind, hold.group, hold.name, mode, holder, hold.token, 0)

    def adopt(self, ticket: Ticket, owner: str) -> Ops:
        """:func:`ylock.tickets.adopt`: the hold, or None if the ticket's hold is gone."""
        t = ticket
        if not (yield from self.protocol.adopt(t.group, t.name, t.mode, t.owner, owner, t.token)):
            return None
        granted = CLOCK.monotonic()
        renewed, = yield from self.protocol.renew([RenewItem(t.group, t.name, owner, t.mode, self.lease)])
        hold = Hold(self.protocol.engine, t.group, t.name, owner, self.lease, t.token, t.kind)
        if t.mode == WRITE:
            hold.writes = 1
        else:
            hold.reads = 1
        self.table.add(hold, t.mode, self.lease / 3, granted, self.lease if renewed else 0.0)
        return hold

    def lost(self, hold: Hold) -> bool:
        """``Holding.lost``: whether the owner is told its hold is lost."""
        return self.table.lost_now(hold)

    def watchdog(self) -> Ops:
        """``Watchdog._run`` over this process's table (its thread's loop, mirrored; the
        schedule is the table's own ``overdue``/``earliest_due``/``next_expiry``/``due``/
        ``renewed``)."""
        table = self.table
        while True:
            now = CLOCK.monotonic()
            with table.changed:
                overdue = table.overdue(now)
                earliest = table.earliest_due()
                expiry = table.next_expiry()
                if expiry is not None and (earliest is None or expiry < earliest):
                    earliest = expiry
                if overdue:
                    batches: dict[Any, Any] | None = {}
                elif earliest is None or earliest > now:
                    table.wake_at = float("inf") if earliest is None else earliest
                    batches = None
                else:
                    table.wake_at = now
                    batches = table.due(now, SPREAD)
            for hold in overdue:
                table.lose(hold, "its lease may have run out: no renewal was confirmed in time")
                self.on_lost(hold, "renewal")
            if batches is None:
                yield WatchdogSleep(earliest)
                continue
            for _engine, batch in batches.items():
                started = CLOCK.monotonic()
                results = yield from self.protocol.renew([renewal.item for _, renewal in batch])
                _renewed, lost = table.renewed(batch, results, started)
                for hold, why in lost:
                    table.lose(hold, why)
                    self.on_lost(hold, "renewal")


#: The kinds of hold and their modes, as the world draws them.
LOCK_MODES = (WRITE, READ)
SEMAPHORE_MODE = PERMIT
