"""The HoldTable: what this process holds, when each hold is due for renewal, and how a
hold is marked lost. One table per process (:data:`HOLDS`); every other part reads it.

- The facade (:mod:`ylock.lock`) adds a :class:`Hold` on an owner's first acquisition,
  counts re-entries on it, and removes it on the final release. Only the owner touches
  its counts; the re-entry path reads the table without a lock (a dict read is atomic
  in CPython).
- For engines whose holds expire unless renewed (``engine.needs_renewal``), each mode of
  a hold carries a :class:`Renewal`: when it is due and when the server last confirmed
  it. The watchdog thread (:mod:`ylock.watchdog`) waits on :attr:`HoldTable.changed`,
  takes what is due (:meth:`HoldTable.due`) and reports back (:meth:`HoldTable.renewed`).
  The schedule is a heap of due times (a renewal rescheduled, released or lost leaves a
  stale entry that is dropped when it comes up): finding what is due costs O(log n) per
  renewal, not a walk over every hold, which at 20,000 holds took milliseconds per wake-up
  under the lock the lock path takes too.
- Anyone who learns that a hold is gone (the watchdog's renewal, a ZooKeeper session or
  watch, a release that found nothing) calls :meth:`HoldTable.mark_lost`, which flags the
  hold and publishes one ``lost`` event. Engines report loss here and never import the
  watchdog.
- A renewed hold is also lost, without anyone hearing so, once its lease may have run out
  on the server (:attr:`Hold.expires`: the send time of the call that granted or last
  renewed it, plus that call's lease): :meth:`HoldTable.lost_now` tells its owner so from
  that moment (``lock.lost``), before the server can grant the lock to anyone else, and
  the watchdog marks it at that moment too (:meth:`HoldTable.overdue`, a second heap, of
  the holds' expiries).

After a fork the child starts with an empty table: it inherits no holds (also after a fork
made from C, noticed on the child's first use: :func:`ylock.owner.after_fork`).
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

from ylock import events
from ylock.owner import after_fork, check_fork


class Engine(Protocol):
    """What the table, its renewal thread and the exit hook need of an engine
    (:class:`ylock.Engine` has it): its name, whether its holds expire unless renewed, how to
    renew them, and how to release one."""

    scheme: ClassVar[str]
    needs_renewal: ClassVar[bool]

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]: ...

    def release(self, group: str, name: str, owner: str, mode: str) -> bool: ...

#: The modes of a hold: a lock's exclusive and shared modes, and a semaphore's permit.
WRITE = "write"
READ = "read"
PERMIT = "permit"
MODES = (WRITE, READ)
#: What a hold is of.
LOCK = "lock"
SEMAPHORE = "semaphore"

#: (engine, group, name, owner) for a lock; (engine, group, name, owner, "semaphore") for a
#: semaphore of the same name, which is another thing altogether.
HoldKey = tuple[Any, ...]


class RenewItem(NamedTuple):
    """One engine-level hold for the watchdog to renew (what ``engine.renew()`` receives)."""

    group: str
    name: str
    owner: str
    mode: str
    lease: float


_new_item = tuple.__new__
_INF = float("inf")
#: How much sooner than a whole lease after the send a server may drop a hold: Redis keeps
#: deadlines in whole milliseconds of a clock it rounds down, so a lease set at 12.3456 s
#: runs out at 12.345 s + lease. A hold's :attr:`Renewal.expires` counts it off.
TICK = 0.001


class Grant(int):
    """A fencing token that says when its grant began: an engine's ``acquire`` may return
    one instead of a bare ``int`` when the answer may have come long after the server
    granted (a waiter's steps, a paused client). ``granted`` (``time.monotonic()``) is when
    the call that granted it was sent: the server's lease began no earlier, so the hold
    table counts the hold's first lease from it, not from the answer."""

    granted: float

    def __new__(cls, token: int, granted: float) -> Grant:
        self = int.__new__(cls, token)
        self.granted = granted
        return self


class Renewal:
    """One mode of a hold, as the watchdog renews it."""

    __slots__ = ("item", "due", "confirmed", "expires")

    def __init__(self, item: RenewItem, due: float, confirmed: float, expires: float | None = None) -> None:
        self.item = item
        self.due = due                # monotonic time the next renewal is due
        #: Monotonic time the call that granted or last renewed the lease was sent.
        self.confirmed = confirmed
        #: Until when the server surely keeps it: ``confirmed`` plus that call's lease (less
        #: the server clock's :data:`TICK`).
        self.expires = confirmed + item.lease - TICK if expires is None else expires


class Hold:
    """One owner's hold of one lock (or semaphore): reentry counts per mode (a semaphore's
    permits count as ``reads``), token, lost flag, renewals."""

    __slots__ = ("engine", "group", "name", "owner", "lease", "writes", "reads", "token",
                 "started", "lost", "lost_reason", "renewals", "kind", "span", "_lost_published", "key", "expires")

    def __init__(self, engine: Engine, group: str, name: str, owner: str, lease: float, token: int,
                 kind: str = LOCK) -> None:
        self.kind = kind
        self.engine = engine
        self.group = group
        self.name = name
        self.owner = owner
        self.lease = lease
        self.writes = 0
        self.reads = 0
        self.token = token
        self.started = time.monotonic()
        self.lost = False
        self.lost_reason = ""
        self.renewals: dict[str, Renewal] = {}
        #: Until when the server surely keeps every renewed mode (the earliest of their
        #: :attr:`Renewal.expires`; infinite while nothing is renewed): from then on the hold
        #: is lost unless a renewal sent before confirms it (:meth:`HoldTable.lost_now`).
        self.expires = _INF
        self.span: Any = None              # the hold's trace span (ylock.tracing), if traced
        self._lost_published = False
        #: Its place in :attr:`HoldTable.by_key` (built once: the lock path looks it up per call).
        self.key: HoldKey = ((engine, group, name, owner) if kind == LOCK
                             else (engine, group, name, owner, kind))

    @property
    def mode(self) -> str:
        """The strongest mode held: "write" while any write level is held, else "read"
        ("permit" for a semaphore)."""
        if self.kind == SEMAPHORE:
            return PERMIT
        return WRITE if self.writes else READ

    def held_modes(self) -> list[tuple[str, int]]:
        """The modes held, with their counts, the weakest first (how to release them all)."""
        if self.kind == SEMAPHORE:
            return [(PERMIT, self.reads)] if self.reads else []
        return [(m, c) for m, c in ((READ, self.reads), (WRITE, self.writes)) if c]

    def __repr__(self) -> str:
        return f"<Hold {self.group}/{self.name} {self.mode} by {self.owner} token={self.token}>"


class HoldTable:
    """Every live hold of this process (see the module docstring)."""

    def __init__(self) -> None:
        #: Every live hold by (engine, group, name, owner). The facade reads it without a
        #: lock; everything that changes it holds :attr:`changed`. The same dict for the
        #: life of the process (a fork clears it in place), so readers may keep a reference.
        self.by_key: dict[HoldKey, Hold] = {}
        #: The renewal schedule: (due, sequence, renewal, hold), the earliest first. An entry
        #: whose renewal is no longer its hold's, or is due at another time now, is stale.
        self._heap: list[tuple[float, int, Renewal, Hold]] = []
        #: The holds' expiries: (expires, sequence, hold), the earliest first; an entry whose
        #: hold expires at another time now (renewed, released, lost) is stale.
        self._expiries: list[tuple[float, int, Hold]] = []
        self._reset()

    def _reset(self) -> None:
        #: The lock of :attr:`changed`, taken directly on the lock path (a C-level ``with``:
        #: a Condition's ``__enter__``/``__exit__`` are Python calls).
        self._mutex = threading.Lock()
        #: Guards adds, removals, renewal schedules and loss; the watchdog waits on it.
        self.changed = threading.Condition(self._mutex)
        self.by_key.clear()
        self._heap.clear()
        self._expiries.clear()
        self._order = itertools.count()
        #: When the renewal thread means to look at the schedule next (it sets this before
        #: it sleeps); a renewal due earlier must wake it.
        self.wake_at = float("inf")
        #: When a renewal was last scheduled (the watchdog ticks for a while after that).
        self.scheduled_at = 0.0

    # -- the owner's side ---------------------------------------------------------------

    def get(self, key: HoldKey) -> Hold | None:
        """Return the hold for (engine, group, name, owner), or None (no lock taken)."""
        return self.by_key.get(key)

    def add(self, hold: Hold, mode: str | None = None, first_renewal: float = 0.0, granted: float | None = None,
            first_lease: float | None = None) -> bool:
        """Record a first acquisition; with ``mode``, also have that mode renewed as
        :meth:`renew_from` does (under the same acquisition of the table's lock). Return
        whether a renewal was scheduled (False: no ``mode``, or its engine needs none)."""
        if mode is None or not hold.engine.needs_renewal:
            with self._mutex:
                self.by_key[hold.key] = hold
            return False
        now = time.monotonic()
        if granted is None or granted > now:
            granted = now
        third = hold.lease / 3
        due = granted + (first_renewal if first_renewal < third else third)
        expires = granted + (hold.lease if first_lease is None else first_lease) - TICK
        # tuple.__new__ straight from C (a NamedTuple's own __new__ is a Python call): this
        # runs on every first acquisition.
        renewal = Renewal(_new_item(RenewItem, (hold.group, hold.name, hold.owner, mode, hold.lease)), due, granted,
                          expires)
        with self._mutex:
            self.by_key[hold.key] = hold
            hold.renewals[mode] = renewal
            hold.expires = expires           # (a new hold: its one renewal)
            order = self._order
            heapq.heappush(self._heap, (due, next(order), renewal, hold))
            heapq.heappush(self._expiries, (expires, next(order), hold))
            self.scheduled_at = now
            if due < self.wake_at:           # see renew_from
                self.wake_at = due
                self.changed.notify()
        if expires <= now:
            # Its answer came after the server may have dropped it (a late answer, a pause).
            self.lost_now(hold)
        return True

    def remove(self, hold: Hold) -> None:
        """Forget ``hold`` (its final release, or a detach); stop renewing it."""
        key = hold.key
        with self._mutex:
            hold.renewals.clear()
            hold.expires = _INF
            if self.by_key.get(key) is hold:
                del self.by_key[key]

    def renew_from(self, hold: Hold, mode: str, first_renewal: float, granted: float | None = None,
                   first_lease: float | None = None) -> bool:
        """Have ``mode`` of ``hold`` renewed, the first time ``first_renewal`` seconds (at
        most a third of its lease) after ``granted`` (when the call that granted it was
        sent; default now), the server keeping it ``first_lease`` seconds from then (default
        its lease); return False if its engine needs no renewal."""
        if not hold.engine.needs_renewal:
            return False
        now = time.monotonic()
        if granted is None or granted > now:
            granted = now
        due = granted + min(first_renewal, hold.lease / 3)
        renewal = Renewal(RenewItem(hold.group, hold.name, hold.owner, mode, hold.lease), due, granted,
                          granted + (hold.lease if first_lease is None else first_lease) - TICK)
        with self._mutex:
            hold.renewals[mode] = renewal
            self._settle(hold)
            heapq.heappush(self._heap, (due, next(self._order), renewal, hold))
            self.scheduled_at = now
            # Waking the renewal thread costs the lock path a context switch and the GIL:
            # do it only if it would otherwise sleep past this renewal.
            if due < self.wake_at:
                self.wake_at = due
                self.changed.notify()
        if renewal.expires <= now:
            self.lost_now(hold)
        return True

    def stop_renewing(self, hold: Hold, mode: str) -> None:
        """Stop renewing ``mode`` of ``hold`` (it was released in that mode)."""
        if mode not in hold.renewals:       # never renewed (or lost): nothing to take back
            return
        with self._mutex:
            hold.renewals.pop(mode, None)
            self._settle(hold)

    # -- reading -----------------------------------------------------------------------

    def holds(self, engine: Engine | None = None) -> list[Hold]:
        """Return the live holds (of ``engine``, if given)."""
        check_fork()
        with self.changed:
            return [h for h in self.by_key.values() if engine is None or h.engine is engine]

    def __iter__(self) -> Iterator[Hold]:
        return iter(self.holds())

    def __len__(self) -> int:
        return len(self.by_key)

    # -- loss --------------------------------------------------------------------------

    def mark_lost(self, engine: Engine, group: str | None = None, name: str | None = None,
                  owner: str | None = None, detail: str = "", kind: str | None = None) -> int:
        """Mark every matching live hold of ``engine`` lost (a ZooKeeper session expired, a
        lock node was deleted, a renewal found another owner); return how many."""
        with self.changed:
            victims = [h for h in self.by_key.values() if h.engine is engine and not h.lost
                       and (group is None or h.group == group) and (name is None or h.name == name)
                       and (owner is None or h.owner == owner) and (kind is None or h.kind == kind)]
            for hold in victims:
                hold.renewals.clear()
                hold.expires = _INF
        for hold in victims:
            self.lose(hold, detail)
        return len(victims)

    def lost_now(self, hold: Hold) -> bool:
        """Return whether ``hold`` is lost: marked so, or its lease may have run out on the
        server by now with no renewal confirmed (then it is marked lost here: its owner is
        told before the server can grant the lock to anyone else)."""
        if hold.lost:
            return True
        if hold.expires > time.monotonic():
            return False
        with self._mutex:
            now = time.monotonic()
            if hold.lost or hold.expires > now:     # renewed meanwhile, or marked already
                return hold.lost
            hold.renewals.clear()
            hold.expires = _INF
        self.lose(hold, "its lease may have run out: no renewal was confirmed in time")
        return True

    def lose(self, hold: Hold, reason: str) -> None:
        """Flag ``hold`` lost (keeping the first reason) and publish one ``lost`` event."""
        hold.lost = True
        hold.lost_reason = hold.lost_reason or reason
        if not hold._lost_published:
            hold._lost_published = True
            if hold.span is not None:
                hold.span.add_event("ylock.lost", {"ylock.reason": hold.lost_reason})
            events.publish(events.LOST, hold.group, hold.name, hold.engine.scheme, hold.mode,
                           owner=hold.owner, token=hold.token, detail=hold.lost_reason)

    # -- the renewal schedule (the watchdog's side) ---------------------------------------

    def _settle(self, hold: Hold) -> None:
        """Recompute :attr:`Hold.expires` from its renewals (a renewal confirmed, a mode
        gone) and schedule it in the expiries. Call with :attr:`changed` held."""
        renewals = hold.renewals
        if not renewals:
            hold.expires = _INF
            return
        expires = min(r.expires for r in renewals.values())
        if expires != hold.expires:
            hold.expires = expires
            heapq.heappush(self._expiries, (expires, next(self._order), hold))

    def overdue(self, now: float) -> list[Hold]:
        """Take the renewals of every hold whose lease may have run out by ``now`` (no
        renewal confirmed in time) and return those holds, for the caller to mark lost
        outside the lock. O(log n) per expiry looked at. Call with :attr:`changed` held."""
        out = []
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires, _, hold = heapq.heappop(heap)
            if hold.expires == expires and not hold.lost:
                hold.renewals.clear()
                hold.expires = _INF
                out.append(hold)
        return out

    def next_expiry(self) -> float | None:
        """When the next hold's lease may run out (or a stale entry for one comes up), or
        None. Call with :attr:`changed` held."""
        heap = self._expiries
        return heap[0][0] if heap else None

    def _top(self) -> tuple[float, int, Renewal, Hold] | None:
        """The schedule's earliest live entry (stale ones above it dropped), or None."""
        heap = self._heap
        while heap:
            entry = heap[0]
            due, _, renewal, hold = entry
            if renewal.due == due and hold.renewals.get(renewal.item.mode) is renewal:
                return entry
            heapq.heappop(heap)
        return None

    def earliest_due(self) -> float | None:
        """Return when the next renewal is due, or None if nothing is to be renewed.
        Call with :attr:`changed` held."""
        top = self._top()
        return None if top is None else top[0]

    def due(self, now: float, spread: int = 0) -> dict[Engine, list[tuple[Hold, Renewal]]]:
        """Return, per engine, the renewals due by ``now``, and those due within a sixth of
        their lease from ``now`` (taking holds due a little later along coalesces them into
        few batches), earliest first; with ``spread``, no more of the early ones than make
        ``spread`` renewals in all (what is due is always taken): a large crowd of holds is
        renewed in batches spread over the window rather than all at once. Costs O(log n) per
        renewal taken. Call with :attr:`changed` held."""
        batches: dict[Engine, list[tuple[Hold, Renewal]]] = {}
        taken = 0
        while (top := self._top()) is not None:
            due, _, renewal, hold = top
            if due > now + renewal.item.lease / 6 or (spread and due > now and taken >= spread):
                break           # (the heap is in due order: what follows is no more due)
            heapq.heappop(self._heap)
            batches.setdefault(hold.engine, []).append((hold, renewal))
            taken += 1
        return batches

    def renewed(self, batch: list[tuple[Hold, Renewal]], results: list[bool | None], started: float) -> \
            tuple[list[tuple[Hold, str]], list[tuple[Hold, str]]]:
        """Apply the outcome of renewing ``batch`` (sent at ``started``): True renewed (the
        server keeps it a lease from ``started`` at least), False lost (another owner or
        none), None unknown (no answer: retried soon, and no later than when its lease may
        run out; lost from then). Return (renewed holds with their mode, lost holds with
        why); the caller publishes, outside the lock."""
        now = time.monotonic()
        renewed: list[tuple[Hold, str]] = []
        lost: list[tuple[Hold, str]] = []
        with self.changed:
            for (hold, renewal), result in zip(batch, results):
                mode = renewal.item.mode
                if hold.renewals.get(mode) is not renewal:
                    continue            # released (or re-acquired) while we were renewing
                if result:
                    renewal.confirmed = started
                    renewal.expires = started + renewal.item.lease - TICK
                    renewal.due = started + renewal.item.lease / 3
                    self._settle(hold)
                    heapq.heappush(self._heap, (renewal.due, next(self._order), renewal, hold))
                    renewed.append((hold, mode))
                elif result is False:
                    del hold.renewals[mode]
                    self._settle(hold)
                    lost.append((hold, "renewal found another owner or no lock"))
                elif now >= renewal.expires:
                    del hold.renewals[mode]
                    self._settle(hold)
                    lost.append((hold, "server unreachable until its lease may have run out"))
                else:
                    retry = now + min(1.0, renewal.item.lease / 10)
                    renewal.due = retry if retry < renewal.expires else renewal.expires
                    heapq.heappush(self._heap, (renewal.due, next(self._order), renewal, hold))
        return renewed, lost

    def _after_fork(self) -> None:
        # The parent's holds are not the child's, and the lock may have been held at fork().
        self._reset()


HOLDS = HoldTable()
after_fork(HOLDS._after_fork)
