"""What a lock holder does in the fault tests, in a thread of the test process or in a child
process: write through the fenced register and the unfenced counter while it holds the lock,
and keep a :class:`Record` of its hold for the test to check exclusion with.

Times are ``time.monotonic()``: on Linux that is CLOCK_MONOTONIC, one clock for every process
of the machine, so the records of threads and of child processes compare.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import ylock
from ylock.testing.fencing import FencedRegister, UnfencedCounter


@dataclasses.dataclass
class Record:
    """One hold, as its holder saw it.

    ``granted`` is when its lock call returned and ``ended`` when it stopped writing (before
    its release): the critical section. ``outcome`` is ``"released"`` (a clean release),
    ``"lost"`` (``lock.lost`` or ``LockLost``: the holder was told), ``"release unavailable"``
    (the release could not reach the server) or ``"held"`` (a holder that never released, such as
    a process killed inside). ``server_owner`` is what the server said about the owner while
    the holder was inside, when the test asked for it (True: the server had this owner).
    """

    who: str
    owner: str
    token: int
    granted: float
    ended: float = 0.0
    outcome: str = ""
    accepted: int = 0
    rejected: int = 0
    lost_at: float | None = None
    released: float | None = None
    server_owner: bool | None = None


class Checkers:
    """The fenced register and the unfenced counter of one test, by path: they pickle to a
    few bytes and every process that builds them shares their state."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        self.register = FencedRegister(os.path.join(self.directory, "register"))
        self.counter = UnfencedCounter(os.path.join(self.directory, "counter"))


def write_once(record: Record, checkers: Checkers) -> None:
    """One write of a holder: to the fenced register with its token, then to the counter."""
    if checkers.register.increment(record.token):
        record.accepted += 1
    else:
        record.rejected += 1
    checkers.counter.increment()


def write_inside(lock: ylock.Lock, who: str, checkers: Checkers, *, writes: int = 2, until_lost: bool = False,
                 stop: threading.Event | None = None, patience: float = 15.0, pace: float = 0.0,
                 on_write: Callable[[Record], None] | None = None, confirm: Callable[[str], bool] | None = None,
                 release: bool = True) -> Record:
    """Run by a thread that holds ``lock`` (in write mode): write ``writes`` times (see
    :func:`write_once`); or, with ``until_lost``, keep writing until the hold is reported
    lost or ``stop`` is set (at most ``patience`` seconds: the caller asserts which), ``pace``
    seconds apart (the holder's work between two writes). Then release (unless ``release``
    is False) and return the record of the hold. ``confirm(owner)`` is asked once, inside,
    whether the server has this owner as the holder; ``on_write`` is called after each write."""
    token = lock.token
    assert token is not None, f"{who} does not hold {lock!r}"
    record = Record(who, ylock.current_owner(), token, time.monotonic())
    if confirm is not None:
        record.server_owner = confirm(record.owner)
    give_up = record.granted + patience
    done = 0
    while not lock.lost:
        if until_lost:
            if (stop is not None and stop.is_set()) or time.monotonic() > give_up:
                break
        elif done >= writes:
            break
        write_once(record, checkers)
        done += 1
        if on_write is not None:
            on_write(record)
        if pace:
            time.sleep(pace)
    record.ended = time.monotonic()
    if lock.lost:
        record.lost_at = record.ended
    if release:
        finish(lock, record)
    else:
        record.outcome = "held"
    return record


def finish(lock: ylock.Lock, record: Record) -> Record:
    """Release ``lock`` and note the outcome in ``record``."""
    try:
        lock.unlock()
        record.outcome = "lost" if record.lost_at is not None else "released"
    except ylock.LockLost:
        record.outcome = "lost"
        record.lost_at = record.lost_at or time.monotonic()
    except ylock.EngineUnavailable:
        record.outcome = "lost" if record.lost_at is not None else "release unavailable"
    record.released = time.monotonic()
    return record


# -- child processes (spawned: a fresh interpreter each) ----------------------------------------


def hold_then_write_until_lost(url: str, group: str, name: str, lease: float, checkers: Checkers,
                               conn: Any) -> None:
    """Take the write lock, write once, and send the record so far (``("inside", record)``);
    then wait inside the lock for the parent's word, which is where the parent stops this
    process (SIGSTOP) or kills it. Resumed, write at once, as a holder that did not notice its
    pause (a GC pause in Kleppmann's example), then keep writing until the hold is reported
    lost; send the final record (``("record", record)``)."""
    lock = ylock.Lock(ylock.engine_from_url(url), group, name, lease=lease)
    lock.lock(timeout=10)
    record = write_inside(lock, "paused holder", checkers, writes=1, release=False)
    conn.send(("inside", record))
    conn.recv()
    write_once(record, checkers)
    rest = write_inside(lock, "paused holder", checkers, until_lost=True, patience=30, pace=0.01, release=False)
    record.accepted += rest.accepted
    record.rejected += rest.rejected
    record.ended, record.lost_at = rest.ended, rest.lost_at
    conn.send(("record", finish(lock, record)))


# -- forked children (they inherit the parent's objects, and its lock, which they must not hold) ----


def forked_child(lock: ylock.Lock, checkers: Checkers, conn: Any) -> None:
    """Report what the child inherited of the parent's hold, then wait for the lock (the
    parent holds it) and write inside; send the record."""
    conn.send(("inherited", lock.held(), lock.token, lock.lost, ylock.current_owner()))
    started = time.monotonic()
    try:
        lock.lock(timeout=30)
    except ylock.LockError as exc:
        conn.send(("error", repr(exc)))
        return
    record = write_inside(lock, "forked child", checkers, writes=2)
    conn.send(("record", record, started))


def hold(url: str, group: str, conn: Any, lease: float = 30.0, register: str | None = None) -> None:
    """In a process of its own: take the write lock of ``group``/n, report ``("acquired",
    token, pid)`` on ``conn``, then obey its orders: "write" (through the fenced register at
    ``register``, with this hold's token: ``("written", ok)``), "status" (``("status",
    lock.lost)``), "unlock" (``("unlocked", None)``, or ``("lost", message)`` if the hold was
    lost). The test may kill or stop it at any time."""
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "n", lease=lease)
    lock.lock(timeout=10)
    conn.send(("acquired", lock.token, os.getpid()))
    while True:
        order = conn.recv()
        if order == "write" and register is not None:
            conn.send(("written", FencedRegister(register).write(lock.token, f"child {lock.token}")))  # type: ignore[arg-type]
        elif order == "status":
            conn.send(("status", lock.lost))
        elif order == "unlock":
            try:
                lock.unlock()
                conn.send(("unlocked", None))
            except ylock.LockLost as exc:
                conn.send(("lost", str(exc)))
            return
