"""The leadership of one beat process: its lock, its term, the shared schedule state.

Timeline of a term (``L`` the leader, ``S`` a stand-by, both :class:`BeatLeader`)::

    S: waits up to `poll` s in the lock's queue, each tick        L: holds the lock; the watchdog renews
    L: SIGTERM -> releases at once ------------------------------> S: granted within a round trip
    S: open_term(token): fence := token, read every entry's record (one round trip)
    S: ticks: merges the records into its schedule, sends what is due, each send after a
       claim(token, entry, seen, record) that the store grants only while fence == token

A leader killed (SIGKILL, a lost host) is replaced when its lease runs out. A leader paused
past its lease (SIGSTOP, a long GC) and resumed finds, at its first claim, a fence raised by
the next term: the claim is refused, it steps down and sends nothing, whatever its own
clocks say (its watchdog also tells it, soon after, that the hold was lost).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import ylock
from celery_ylock import conf, signals
from celery_ylock.beat.settings import BeatSettings
from celery_ylock.beat.state import CLAIMED, FENCED, StateStore, store_for
from ylock.errors import EngineUnavailable, LockError, LockTimeout
from ylock.exiting import EXIT_BUDGET
from ylock.leader import Leadership, Term
from ylock.threads import start_thread

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("celery_ylock.beat")


class Record(NamedTuple):
    """An entry's last run as the beats share it."""

    at: float               # when it ran (epoch seconds, the sender's clock)
    runs: int               # the entry's run count
    token: int | None       # the fencing token of the term that sent it
    sender: str             # "host:pid"

    def dumps(self) -> str:
        return json.dumps({"at": self.at, "n": self.runs, "token": self.token, "by": self.sender},
                          separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str) -> Record | None:
        """The record of ``raw``, or None if it is not one (written by something else)."""
        try:
            data = json.loads(raw)
            return cls(float(data["at"]), int(data.get("n", 0)), data.get("token"), str(data.get("by", "")))
        except (ValueError, TypeError, KeyError):
            return None


def sender() -> str:
    """``host:pid`` of this process (after a fork, the child's)."""
    return f"{socket.gethostname().split('.')[0]}:{os.getpid()}"


class BeatLeader:
    """Lead a beat's schedule while holding the beat lock (see the module docstring)."""

    def __init__(self, app: Celery, settings: BeatSettings, scheduler_name: str) -> None:
        self.settings = settings
        engine = conf.state(app).registry.engine(settings.engine)
        self.lock = ylock.Lock(engine, settings.group, settings.name, fair=settings.fair, lease=settings.lease,
                               polling=settings.polling)
        self.leadership = Leadership(self.lock)
        self.store: StateStore = store_for(engine, settings.group, settings.name)
        self.scheduler_name = scheduler_name
        #: The current term (None while standing by).
        self.term: Term | None = None
        self._leading: contextlib.AbstractContextManager[Term] | None = None
        #: Every entry's record as this leader last read or wrote it (raw JSON, by entry name).
        self.records: dict[str, str] = {}
        #: When the current term began (epoch seconds), and how many terms this process led.
        self.since: float | None = None
        self.terms = 0
        #: Set when a term begins; the scheduler clears it once it has merged the records.
        self.new_term = False
        self._told_waiting = False
        self._outage: str | None = None

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def token(self) -> int | None:
        return None if self.term is None else self.term.token

    # -- becoming the leader ----------------------------------------------------------------------

    def standby(self) -> float | None:
        """Return None if this beat leads (beginning a term if the lock comes within ``poll``
        seconds), else the seconds to wait before the next tick."""
        term = self.term
        if term is not None:
            if not term.lost.is_set():
                return None
            self.step_down(f"the hold was lost: {term.reason}")
        poll = self.settings.poll
        try:
            with ylock.context("celery beat", scheduler=self.scheduler_name):
                leading = self.leadership.lead(timeout=poll)
                term = leading.__enter__()
        except LockTimeout:
            if not self._told_waiting:
                self._told_waiting = True
                logger.info("beat: standing by: another beat leads %s (waiting for it in turns of %g s)",
                            self.label, poll)
            self._outage = None
            return 0.0
        except EngineUnavailable as exc:
            self._unavailable(exc)
            return poll
        self._leading, self.term = leading, term
        self._outage = None
        return None if self._open(term) else poll

    def _open(self, term: Term, again: bool = False) -> bool:
        """Begin ``term`` on the shared state (``again``: read it again within the term)."""
        if term.token is None:
            self.step_down(f"the engine gave no fencing token for {self.label}")
            return False
        description = {"owner": term.owner, "sender": sender(), "token": term.token, "since": round(time.time(), 3)}
        try:
            opened = self.store.open_term(term.token, json.dumps(description, separators=(",", ":")))
        except EngineUnavailable as exc:
            self.step_down(f"the schedule state could not be read: {exc}")
            return False
        if isinstance(opened, int):
            self.step_down(f"a newer term (token {opened}) holds the schedule state")
            return False
        self.records = dict(opened.records)
        self.new_term = True
        if again:
            return True
        self.since = time.time()
        self.terms += 1
        self._told_waiting = False
        previous = _previous(opened.previous)
        logger.warning("beat: leading %s from now on (token %s, term %d of the deployment, %d of this process)%s",
                       self.label, term.token, opened.terms, self.terms,
                       f"; the previous leader was {previous}" if previous else "")
        signals.beat_elected.send(sender=self.label, lock=self.label, token=term.token, since=self.since,
                                  previous=previous, terms=opened.terms)
        return True

    def _unavailable(self, exc: Exception) -> None:
        text = str(exc)
        if self._outage != text:            # once per outage, not once per tick
            self._outage = text
            logger.error("beat: cannot reach the engine of %s: %s (nothing is sent until it answers)", self.label,
                         text)

    # -- sending ----------------------------------------------------------------------------------

    def claim(self, entry: str, at: float, runs: int) -> bool:
        """Record a run of ``entry`` at ``at`` in the shared state if this term still leads it;
        return True if it may be sent. A refusal steps this beat down (or, for a record it
        did not know of, reads the state again): it must not send."""
        term = self.term
        if term is None or term.token is None:
            return False
        if term.lost.is_set():
            self.step_down(f"the hold was lost: {term.reason}")
            return False
        record = Record(at, runs, term.token, sender()).dumps()
        try:
            outcome, current = self.store.claim(term.token, entry, self.records.get(entry), record)
        except EngineUnavailable as exc:
            self.step_down(f"the run of {entry!r} could not be recorded: {exc}")
            return False
        if outcome == CLAIMED:
            self.records[entry] = record
            return True
        if outcome == FENCED:
            self.step_down(f"a newer term (token {current}) holds the schedule state: {entry!r} not sent")
            return False
        logger.warning("beat: %r has a run recorded that this leader did not know of (%s): not sent; reading the "
                       "schedule state again", entry, current)
        self._open(term, again=True)
        return False

    # -- stepping down ----------------------------------------------------------------------------

    def step_down(self, reason: str, budget: float | None = None) -> None:
        """Stop leading (if this beat leads) and release the lock; ``budget``: release from a
        helper thread and wait for it at most that long (the caller may be a signal handler
        that interrupted a lock call)."""
        term, leading = self.term, self._leading
        self.term = self._leading = None
        self.new_term = False
        if term is None or leading is None:
            return
        held = time.time() - self.since if self.since else 0.0
        logger.warning("beat: no longer leading %s (token %s, after %.1f s): %s", self.label, term.token, held,
                       reason)
        signals.beat_stepped_down.send(sender=self.label, lock=self.label, token=term.token, reason=reason)
        self.since = None

        def release() -> None:
            try:
                ylock.run_as(term.owner, leading.__exit__, None, None, None)
            except LockError as exc:        # lost already, or the engine is down: its lease frees it
                logger.info("beat: releasing %s: %s", self.label, exc)
        if budget is None:
            release()
            return
        helper = start_thread(release, "ylock-beat-release")
        helper.join(budget)

    def close(self) -> None:
        """Release the lock at once, if this beat leads (a stand-by takes over within a tick)."""
        self.step_down("shutting down", budget=EXIT_BUDGET)


def _previous(raw: str | None) -> str | None:
    if not raw:
        return None
    try:
        data: Any = json.loads(raw)
        return f"{data.get('sender')} (token {data.get('token')})"
    except (ValueError, AttributeError):
        return raw
