"""What the simulated processes do and what the world records of it: each process's lock
program (acquire a lock in either mode or a semaphore's permit, work while asking whether it
still holds it, maybe downgrade, maybe detach for another process to adopt, release; or
adopt a waiting ticket), and the history the checker reads (:mod:`tests.simulation.history`):
holds opened and closed, renewals and loss as their owners heard of them.

A mixin of :class:`tests.simulation.world.World` (split from it by concern)."""
from __future__ import annotations

import random
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from tests.simulation.client import Pause, Ticket
from tests.simulation.history import Acquisition, History, HoldRecord
from ylock.errors import EngineUnavailable, LockError
from ylock.holds import LOCK, PERMIT, READ, SEMAPHORE, WRITE

if TYPE_CHECKING:
    from tests.simulation.world import Config, _Call, _Proc

__all__ = ["GROUP", "LOCK", "SEMAPHORE", "US", "Programs"]

US = 1_000_000
GROUP = "sim"


class Programs:
    """The processes' programs and the world's records of them (see the module docstring)."""

    config: Config
    history: History
    holds: dict[int, HoldRecord]
    tickets: list[tuple[Ticket, int]]
    trace: list[str] | None
    now: int
    hold_ids: Any
    acq_ids: Any
    polling: Any
    running: _Proc | None

    # -- recording --------------------------------------------------------------------------

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now / US:11.6f} {text}")

    def _lost(self, hold: Any, why: str) -> None:
        record = self.holds.get(id(hold))
        if record is not None and record.told_lost is None:
            self.note(f"{record.proc} TOLD LOST {record.lock[1]} token {record.token} ({why})")
            record.told_lost = self.now / US
            if record.end is None:
                record.end, record.why = self.now / US, "lost"

    def _record_renewals(self, call: _Call, replies: list[Any] | None) -> None:
        """A renewal batch's answers (None: no answer in time) as each hold's renewals."""
        for i, (keys, args) in enumerate(call.op.calls):
            owner, mode = str(args[0]), str(args[1])
            lock = _lock_of(keys)
            reply = None if replies is None or isinstance(replies[i], Exception) else bool(replies[i])
            renewal = (call.sent / US, self.now / US, reply, call.id, int(args[2]) / 1000)
            adopting = call.task.proc.adopting
            if adopting is not None and adopting[0] == (owner, lock, mode):
                adopting[1].append(renewal)      # the adopter's first renewal: its record opens next
                continue
            record = self._find(owner, lock, mode)
            if record is not None:
                record.renewals.append(renewal)

    def _record_local_renewals(self, items: list[Any], results: list[bool | None]) -> None:
        """The local engine's renewals (calls in the process: sent and answered at once)."""
        for item, result in zip(items, results):
            lock = (SEMAPHORE if item.mode == PERMIT else LOCK), item.name
            renewal = (self.now / US, self.now / US, result, 0, item.lease)
            adopting = self.running.adopting if self.running is not None else None
            if adopting is not None and adopting[0] == (item.owner, lock, item.mode):
                adopting[1].append(renewal)
                continue
            record = self._find(item.owner, lock, item.mode)
            if record is not None:
                record.renewals.append(renewal)

    def _find(self, owner: str, lock: tuple[str, str], mode: str) -> HoldRecord | None:
        """The open hold of ``owner`` in ``mode`` on ``lock``, else its latest (a renewal
        answered after its owner stopped acting on the hold still tells how long the server
        may keep it)."""
        for record in self.holds.values():
            if record.owner == owner and record.mode == mode and record.lock == lock:
                return record
        for record in reversed(self.history.holds):
            if record.owner == owner and record.mode == mode and record.lock == lock:
                return record
        return None

    def _open(self, proc: _Proc, hold: Any, lock: tuple[str, str], mode: str, how: str,
              parent: int | None = None, acquisition: int | None = None) -> HoldRecord:
        c = self.config
        # A grant lasts min(lease, waiter lease) until renewed; an adopted hold lasts what its
        # ticket had (its parent's) until the adopter's renewal.
        first = 0.0 if how == "adopt" else min(c.lease, self.polling.waiter_lease)
        if parent is None:
            # A hold of this owner after an adoption whose answer it never heard (its script
            # may have run, making the ticket's hold this owner's): the ticket's hold,
            # continued, with its token, or with a new one if a new request found it.
            attempts = [(tok == hold.token, t) for o, lk, tok, t in self.history.adopt_attempts
                        if o == hold.owner and lk == lock]
            ticket = next((self.history.hold(t) for same, t in sorted(attempts, reverse=True)
                           if same or self.history.hold(t).end is None), None)
            if ticket is not None:
                parent = ticket.id
                if ticket.end is None:
                    ticket.end, ticket.why = self.now / US, "adopted"
        record = HoldRecord(next(self.hold_ids), proc.name, hold.owner, lock, mode, hold.token, self.now / US,
                            first, c.lease, how, parent, acquisition)
        self.history.holds.append(record)
        self.holds[id(hold)] = record
        self.note(f"{proc.name} HOLDS {lock[1]} {mode} token {hold.token} ({how})")
        return record

    def _close(self, hold: Any, why: str) -> HoldRecord | None:
        return self._close_key(id(hold), why)

    def _close_key(self, key: int, why: str) -> HoldRecord | None:
        record = self.holds.pop(key, None)
        if record is not None and record.end is None:
            record.end, record.why = self.now / US, why
            self.note(f"{record.proc} ENDS {record.lock[1]} {record.mode} token {record.token} ({why})")
        return record

    # -- the programs -----------------------------------------------------------------------

    def _program(self, proc: _Proc) -> Generator[Any, Any, None]:
        """A process's lock calls, drawn from its own generator: acquire (a lock in either
        mode, or a semaphore's permit; with a timeout or without), work (checking ``lost``),
        maybe downgrade, maybe detach for another process to adopt, release; or adopt a
        waiting ticket."""
        c = self.config
        rng = proc.rng
        p = proc.process
        for _ in range(c.rounds):
            if self.tickets and rng.random() < 0.5:
                yield from self._adopt(proc, *self.tickets.pop(0))
                yield Pause(rng.uniform(0, 0.3))
                continue
            if c.semaphore and rng.random() < 0.35:
                kind, name, mode, fair = SEMAPHORE, "s", PERMIT, rng.random() < 0.7
            else:
                i = rng.randrange(len(c.locks))
                kind, name, mode, fair = LOCK, c.locks[i], rng.choice((WRITE, WRITE, READ)), c.fair[i]
            timeout = rng.choice((None, None, 0.0, 0.3, 1.0, 3.0))
            now = proc.clock()
            deadline = None if timeout is None else now + timeout
            a = Acquisition(next(self.acq_ids), proc.name, proc.owner, (kind, name), mode, fair, self.now / US,
                            None if timeout is None else self.now / US + timeout)
            self.history.acquisitions.append(a)
            proc.current = a
            # A watched acquisition (tracing) asks for the holders' notes and is told once when
            # it first waits (its own generator: the schedule's other draws stay as they were).
            watched = random.Random(f"watch:{c.seed}:{a.id}").random() < 0.3
            r = p.request(kind, GROUP, name, proc.owner, mode, fair, deadline, c.permits,
                          a.told.append if watched else None)
            try:
                hold = yield from p.take(r, kind)
            except EngineUnavailable:
                a.done, a.outcome = self.now / US, "unavailable"
                proc.current = None
                yield Pause(rng.uniform(0, 0.5))
                continue
            proc.current = None
            a.done = self.now / US
            if hold is None:
                a.outcome = "timeout"
                continue
            a.outcome, a.token = "token", hold.token
            record = self._open(proc, hold, (kind, name), mode, "acquire", acquisition=a.id)
            yield from self._work(proc, hold, rng.uniform(0.05, 1.5 * c.lease))
            if not self._still_held(proc, hold):
                yield from self._end(proc, hold, mode)
                continue
            if mode == WRITE and rng.random() < 0.25:
                # (its tries recorded as an acquisition's, not one of the history's: the read
                # hold's grant floor is the send time of the try that granted it)
                proc.current = d = Acquisition(0, proc.name, proc.owner, (kind, name), READ, fair, self.now / US,
                                               self.now / US)
                self.history.downgrades.append(d)
                try:
                    token = yield from p.downgrade(hold, fair)
                except EngineUnavailable:
                    token, d.outcome = None, "unavailable"
                except LockError:
                    token, d.outcome = None, "lost"
                else:
                    d.outcome, d.token = "token", token
                d.done = self.now / US
                proc.current = None
                if token is not None:
                    read_hold = _ReadView(hold)
                    self.holds[id(read_hold)] = rec = HoldRecord(
                        next(self.hold_ids), proc.name, hold.owner, (kind, name), READ, token, self.now / US,
                        min(c.lease, self.polling.waiter_lease), c.lease, "downgrade", record.id)
                    rec.tries = d.tries
                    self.history.holds.append(rec)
                    self._close(hold, "release")
                    yield from self._release(proc, hold, WRITE, record)
                    self.holds[id(hold)] = rec                # the hold is now the read hold
                    del self.holds[id(read_hold)]
                    yield from self._work(proc, hold, rng.uniform(0.05, c.lease))
                    yield from self._end(proc, hold, READ)
                    continue
            if rng.random() < 0.15 and self._still_held(proc, hold):
                try:
                    ticket = yield from p.detach(hold, c.lease)
                except EngineUnavailable:
                    ticket = None
                if ticket is not None:
                    self._close(hold, "detach")
                    # The hold is the ticket's now (its own owner id), until adopted or its lease ends.
                    t = HoldRecord(next(self.hold_ids), f"{proc.name}:ticket", ticket.owner, (kind, name), mode,
                                   hold.token, self.now / US, 0.0, c.lease, "ticket", record.id)
                    self.history.holds.append(t)
                    self.tickets.append((ticket, t.id))
                    continue
            yield from self._end(proc, hold, mode)
            yield Pause(rng.uniform(0, 0.3))

    def _work(self, proc: _Proc, hold: Any, seconds: float) -> Generator[Any, Any, None]:
        """Work on what the hold protects for ``seconds``, asking (as ``lock.lost`` does)
        before every step whether it is still held: each answer is recorded (the checker
        holds every "held" to the server's lease)."""
        end = proc.clock() + seconds
        record = self.holds.get(id(hold))
        # Some holders look themselves up with describe_lock on the way (own generator: the
        # schedule's other draws stay as they were).
        look = random.Random(f"describe:{self.config.seed}:{record.id if record else 0}")
        describe_at = proc.clock() + look.uniform(0, seconds) if look.random() < 0.3 else None
        while proc.clock() < end and self._still_held(proc, hold):
            if describe_at is not None and proc.clock() >= describe_at:
                describe_at = None
                yield from self._describe(proc, hold)
                continue
            yield Pause(min(0.1, max(0.0, end - proc.clock())) + 1e-6)

    def _describe(self, proc: _Proc, hold: Any) -> Generator[Any, Any, None]:
        sent = self.now / US
        try:
            info = yield from proc.process.protocol.describe(GROUP, hold.name, hold.kind)
        except EngineUnavailable:
            return
        record = self.holds.get(id(hold))
        if record is not None:
            record.described.append((sent, self.now / US, info.owners if info else (), info.mode if info else None,
                                     info.token if info else None))

    def _still_held(self, proc: _Proc, hold: Any) -> bool:
        held = not proc.process.lost(hold)
        record = self.holds.get(id(hold))
        if record is not None:
            record.reads.append((self.now / US, held))
            if not held and record.told_lost is None:
                self._lost(hold, "lost")
        return held

    def _end(self, proc: _Proc, hold: Any, mode: str) -> Generator[Any, Any, None]:
        record = self._close(hold, "release" if self._still_held(proc, hold) else "lost")
        yield from self._release(proc, hold, mode, record)

    def _release(self, proc: _Proc, hold: Any, mode: str, record: HoldRecord | None) -> Generator[Any, Any, None]:
        try:
            held = yield from proc.process.release(hold, mode)
        except EngineUnavailable:
            return
        if record is not None:
            record.released = held

    def _adopt(self, proc: _Proc, ticket: Ticket, parent: int) -> Generator[Any, Any, None]:
        lock = (ticket.kind, ticket.name)
        renewals: list[Any] = []
        proc.adopting = ((proc.owner, lock, ticket.mode), renewals)
        sent = self.now / US
        try:
            hold = yield from proc.process.adopt(ticket, proc.owner)
        except EngineUnavailable:
            # Its script may have run: a hold of this owner with the ticket's token continues it,
            # and the ticket's hold may be this owner's from then on (a new request of its own
            # may find it and give it a new, shorter first lease).
            self.history.adopt_attempts.append((proc.owner, lock, ticket.token, parent))
            ticket_record = self.history.hold(parent)
            if ticket_record.end is None:
                ticket_record.end, ticket_record.why = sent, "adopted"
            return
        finally:
            proc.adopting = None
        if hold is None:
            return
        ticket_record = next(h for h in self.history.holds if h.id == parent)
        if ticket_record.end is None:
            ticket_record.end, ticket_record.why = self.now / US, "adopted"
        record = self._open(proc, hold, lock, ticket.mode, "adopt", parent)
        record.renewals.extend(renewals)
        yield from self._work(proc, hold, proc.rng.uniform(0.05, self.config.lease))
        yield from self._end(proc, hold, ticket.mode)


def _lock_of(keys: tuple[str, ...]) -> tuple[str, str]:
    """The (kind, name) of the lock whose keys (a renewal's: x, or s and t) are ``keys``."""
    base = keys[0].rsplit(":", 1)[0]            # "<prefix>:{<group>:<name>}" (":p": a semaphore's)
    tagged = base[base.index("{") + 1:base.rindex("}")]
    return (SEMAPHORE if base.endswith(":p") else LOCK), tagged.split(":", 1)[1]


class _ReadView:
    """A stand-in key for the read hold a downgrade opens while the write hold is released."""

    def __init__(self, hold: Any) -> None:
        self.hold = hold
