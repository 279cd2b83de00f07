"""Fault tests: each breaks a real server, the network or a process while locks are held and
waited for, asserts exclusion with a fenced register beside an unfenced counter, and bounds
the time of every call from both sides.

This module holds what the tests share besides fixtures: the journal of holds that checks
exclusion (:class:`Journal`), what the holders of the tests do (:func:`hold_until_lost`,
:func:`take`), the timing of one call (:func:`timed`) and the slack a call may take beyond its
bound on a loaded 2-core machine (:data:`SLACK`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import ylock
from tests.faults import workers
from tests.faults.workers import Checkers, Record, write_inside

#: Seconds a call may take beyond its bound on this 2-core machine with other tests running
#: (scheduling, a GIL switch, a reconnection's handshake).
SLACK = 0.4


# -- exclusion ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Verdict:
    """What :meth:`Journal.check` found (the figures a test reports)."""

    holds: int
    lost: int               # holders told that they had lost the lock
    overlaps: int           # pairs of critical sections that overlapped in time (one of them lost)
    caught: int             # stale writes the fenced register rejected
    unfenced_lost: int      # updates the unfenced counter lost to overlapping holders
    regressions: int        # holds whose token was not above that of a hold granted before

    def __str__(self) -> str:
        return (f"{self.holds} holds, {self.lost} told lost, {self.overlaps} overlaps, fencing rejected "
                f"{self.caught} stale writes, unfenced counter lost {self.unfenced_lost} updates"
                + (f", {self.regressions} token regressions" if self.regressions else ""))


class Journal:
    """The holds of one test and the checkers they wrote through (see :meth:`check`)."""

    def __init__(self, checkers: Checkers) -> None:
        self.checkers = checkers
        self.records: list[Record] = []
        self._mutex = threading.Lock()

    def add(self, record: Record) -> Record:
        with self._mutex:
            self.records.append(record)
        return record

    def hold(self, lock: ylock.Lock, who: str, **options: Any) -> Record:
        """Write inside ``lock`` (held by this thread), release it, and journal the hold
        (see :func:`tests.faults.workers.write_inside`)."""
        return self.add(write_inside(lock, who, self.checkers, **options))

    def check(self, *, strict: bool = True) -> Verdict:
        """Assert exclusion from the journal and the checkers, and return the figures.

        Always: every fenced write accepted is in the register (no update lost under
        fencing) and every write is accounted for. With ``strict`` (every fault but a
        failover, which may lose a recent acquisition and so its token):

        - two critical sections overlap only if one of the two holders was told that it had
          lost the lock (a force-release, an expired lease or session);
        - the register rejected only the writes of such holders (a holder that releases
          cleanly was never stale);
        - tokens increase with the order of the grants (fencing can tell old from new);
        - a holder that released cleanly was the server's holder while it was inside;
        - with no holder lost, the unfenced counter lost nothing either.
        """
        state = self.checkers.register.state()
        records = sorted(self.records, key=lambda r: r.granted)
        accepted = sum(r.accepted for r in records)
        rejected = sum(r.rejected for r in records)
        assert state.value == state.accepted == accepted, \
            f"fenced register {state} against {accepted} accepted writes: an update was lost under fencing"
        assert state.rejected == rejected, f"fenced register {state} against {rejected} rejected writes"
        overlaps: list[tuple[Record, Record]] = []
        inside: list[Record] = []           # the sections not ended when the next one began
        for record in records:
            inside = [r for r in inside if r.ended > record.granted]
            overlaps += [(r, record) for r in inside]
            inside.append(record)
        regressions = [(a, b) for a, b in zip(records, records[1:]) if b.token <= a.token]
        unfenced_lost = self.checkers.counter.lost
        lost = [r for r in records if r.outcome == "lost"]
        if strict:
            double = [(a, b) for a, b in overlaps if "lost" not in (a.outcome, b.outcome)]
            assert not double, f"two holders inside at once, neither told it had lost the lock: {double[:3]}"
            stale = [r for r in records if r.rejected and r.outcome != "lost"]
            assert not stale, f"fencing rejected writes of holders never told they had lost the lock: {stale[:3]}"
            assert not regressions, f"tokens do not follow the order of the grants: {regressions[:3]}"
            unconfirmed = [r for r in records if r.server_owner is False and r.outcome != "lost"]
            assert not unconfirmed, f"holders the server did not have as the owner: {unconfirmed[:3]}"
            if not lost:
                assert unfenced_lost == 0, f"no holder was lost, yet the unfenced counter lost {unfenced_lost}"
        return Verdict(len(records), len(lost), len(overlaps), rejected, unfenced_lost, len(regressions))


# -- timing ---------------------------------------------------------------------------------------


class Overrun(AssertionError):
    """A call took longer than its bound (a strict xfail can expect exactly this)."""


@dataclasses.dataclass
class Timed:
    """The outcome of one call: its result or the exception it raised, and how long it took."""

    result: Any
    error: BaseException | None
    started: float
    elapsed: float

    def within(self, low: float, high: float, what: str) -> Timed:
        """Assert ``low <= elapsed <= high`` (:class:`Overrun` if it took longer)."""
        if self.elapsed > high:
            raise Overrun(f"{what} took {self.elapsed:.3f} s, over its bound of {high:.3f} s ({self.error!r})")
        assert low <= self.elapsed, f"{what} took {self.elapsed:.3f} s, under its lower bound of {low:.3f} s"
        return self


def timed(func: Callable[..., Any], *args: Any, catch: tuple[type[BaseException], ...] = (ylock.LockError,),
          **kwargs: Any) -> Timed:
    """Call ``func``; return its outcome and duration (an exception of ``catch`` is kept)."""
    started = time.monotonic()
    try:
        result, error = func(*args, **kwargs), None
    except catch as exc:
        result, error = None, exc
    return Timed(result, error, started, time.monotonic() - started)




# -- holders and the server's view ------------------------------------------------------------------


def hold_until_lost(lock: ylock.Lock, journal: Journal, inside: threading.Event, *,
                    stop: threading.Event | None = None, patience: float = 10.0) -> Record:
    """Take ``lock`` and write inside until the hold is reported lost (or ``stop`` is set),
    setting ``inside`` after the first write; release it and return the record."""
    lock.lock(timeout=10)
    return journal.hold(lock, "H", until_lost=True, stop=stop, patience=patience, pace=0.002,
                        on_write=lambda _: inside.set())


def take(lock: ylock.Lock, journal: Journal, who: str, confirm: Callable[[str], bool] | None = None,
         timeout: float = 15.0) -> Record:
    """Wait for ``lock`` up to ``timeout``, write three times inside, release it."""
    lock.lock(timeout=timeout)
    return journal.hold(lock, who, writes=3, confirm=confirm)


def owners(engine: ylock.Engine, group: str, name: str, patience: float = 15.0) -> \
        tuple[tuple[str, ...], tuple[str, ...]]:
    """(holders, waiters) of a lock as the server has them; asked again while the engine
    cannot reach the server (after a fault), for up to ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            for info in engine.describe(group):
                if info.name == name:
                    return info.owners, info.waiters
            return (), ()
        except ylock.EngineUnavailable:
            assert time.monotonic() < deadline, f"{engine!r} did not reach its server again"


def server_has(engine: ylock.Engine, group: str, name: str) -> Callable[[str], bool]:
    """A ``confirm`` for :func:`take`: whether the server has ``owner`` as the only holder."""
    return lambda owner: owners(engine, group, name)[0] == (owner,)


# -- processes racing for one counter --------------------------------------------------------------


def run_counter(url: str, group: str, path: str, processes: int, iterations: int, use_lock: bool) -> list[int]:
    """Have ``processes`` spawned processes, started at once, each increment the unfenced
    counter at ``path`` ``iterations`` times, inside ``group``'s write lock on ``url`` or not;
    return the tokens of the holds."""
    from tests.postgres import workers as counter_workers

    spawn = multiprocessing.get_context("spawn")
    with spawn.Manager() as manager, ProcessPoolExecutor(processes, mp_context=spawn) as pool:
        start = manager.Barrier(processes)
        futures = [pool.submit(counter_workers.counter, url, group, path, iterations, use_lock, start)
                   for _ in range(processes)]
        return [t for f in futures for t in f.result(timeout=120)]


# -- a holder process that dies or freezes inside the lock ---------------------------------------


@dataclasses.dataclass
class StoppedHolder:
    """The holder of :func:`holder_process`: when it was killed or stopped, and its record."""

    stopped: float
    record: Record


@contextlib.contextmanager
def holder_process(url: str, group: str, lease: float, journal: Journal, how: str) -> Iterator[StoppedHolder]:
    """A process takes ``group``/n on ``url`` (``lease``) and writes inside it; it is then
    killed or stopped (``how``: "SIGKILL" or "SIGSTOP") and the block runs (a waiter takes
    over). After the block a stopped holder is resumed: it must be told it lost the lock, its
    stale write rejected by the fenced register; a killed one died inside. Its record goes to
    the journal; the process is gone in the end, however the block ends."""
    parent, child = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(
        target=workers.hold_then_write_until_lost, args=(url, group, "n", lease, journal.checkers, child))
    proc.start()
    try:
        assert parent.poll(30), "the holder process did not take the lock"
        _, record = parent.recv()
        os.kill(proc.pid, getattr(signal, how))
        holder = StoppedHolder(time.monotonic(), record)
        if how == "SIGSTOP":
            parent.send("go")                   # read once it runs again
        yield holder
        if how == "SIGSTOP":
            os.kill(proc.pid, signal.SIGCONT)
            assert parent.poll(30), "the resumed holder was never told it lost the lock"
            _, holder.record = parent.recv()
            assert holder.record.outcome == "lost" and holder.record.rejected >= 1, holder.record
        else:
            holder.record.ended = holder.stopped    # it died inside
        journal.add(holder.record)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
