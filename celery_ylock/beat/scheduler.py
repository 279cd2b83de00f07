"""``LeaderScheduler``: a Celery beat scheduler that sends only while it leads.

It wraps a scheduler class (the one ``ylock_beat["scheduler"]`` names) by subclassing it: the
wrapped class decides what is due, as it always does; this class decides whether this
process may send it. ``LeaderScheduler`` itself is the name to configure; instantiating it
makes an instance of ``Leader<Wrapped>``, a class made once per wrapped class, whose MRO is
``(Leader<Wrapped>, LeaderScheduler, Wrapped, ..., celery.beat.Scheduler)``. Wrapping a
class explicitly (``class MyBeat(LeaderScheduler, MyScheduler)``) works as well.

The wrapped class's hooks it takes:

``tick``
    A stand-by waits for the lock (``poll`` seconds at most) instead of ticking; a leader
    ticks, at least every ``poll`` seconds.
``populate_heap``
    Each entry's last run is taken from the shared state (what the previous leader sent)
    before the heap is built, at every term's start and whenever the wrapped class
    rebuilds its heap (django-celery-beat's schedule changed).
``reserve``, ``apply_entry``, ``apply_async``
    Every send is preceded by a claim in the shared state (:meth:`BeatLeader.claim`); a
    refused claim sends nothing and undoes the entry's advance. The message's headers
    carry :data:`HEADER`: the term's fencing token, the lock, the entry, the run's time and
    the sender.
``close``
    Release the lock first (a stand-by takes over within a tick), then the wrapped close.
"""
from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from typing import Any

from celery.beat import Scheduler, SchedulingError

from celery_ylock.beat.leader import BeatLeader, Record, sender
from celery_ylock.beat.settings import BeatSettings, beat_settings

#: The message header a leader's sends carry: ``{"token", "lock", "entry", "at", "by"}``
#: (read it with :func:`celery_ylock.beat.dispatch`).
HEADER = "ylock_beat"

_classes: dict[type[Scheduler], type[LeaderScheduler]] = {}


class LeaderScheduler(Scheduler):  # type: ignore[misc,unused-ignore]
    """A beat scheduler that sends only while it holds the beat lock (see the module
    docstring, and docs/celery.md for the settings). ``scheduler.leader`` is its
    :class:`~celery_ylock.beat.leader.BeatLeader` (``term``, ``since``, ``terms``)."""

    leader: BeatLeader
    _ylock_settings: Any
    #: Marks the class (ylock_beat["scheduler"] must name another).
    ylock_leader = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        settings = None
        if cls is LeaderScheduler:
            settings = beat_settings(kwargs["app"] if "app" in kwargs else args[0])
            cls = leader_class(settings.scheduler)
        self = super().__new__(cls)
        self._ylock_settings = settings
        return self

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        settings: BeatSettings = getattr(self, "_ylock_settings", None) or beat_settings(app)
        self.leader = BeatLeader(app, settings, _qualname(wrapped(type(self))))
        self._ylock_reserved: dict[str, Any] = {}
        self._ylock_claimed: str | None = None
        super().__init__(app, *args, **kwargs)

    # -- ticking ----------------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait = self.leader.standby()
        if wait is not None:
            return wait
        if self.leader.new_term:
            self.leader.new_term = False
            self._heap = None                 # rebuilt from the shared records (populate_heap)
        interval: float = super().tick(*args, **kwargs)
        return min(interval, self.leader.settings.poll)

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        merge(self.leader.records, self.schedule.values())
        super().populate_heap(*args, **kwargs)

    # -- sending ----------------------------------------------------------------------------------

    def reserve(self, entry: Any) -> Any:
        new = super().reserve(entry)
        self._ylock_reserved[entry.name] = new
        return new

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if self._claim(entry):
            super().apply_entry(entry, producer=producer)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        old = entry
        if advance:
            entry = self.reserve(entry)
        claimed, self._ylock_claimed = self._ylock_claimed, None
        if claimed != entry.name:
            if not self._claim(old):
                raise SchedulingError(f"{entry.name!r} not sent: this beat does not lead {self.leader.label}")
            self._ylock_claimed = None
        record = Record.loads(self.leader.records.get(entry.name, ""))
        options = entry.options
        headers = dict(options.get("headers") or {})
        headers[HEADER] = {"token": self.leader.token, "lock": self.leader.label, "entry": entry.name,
                           "at": record.at if record else time.time(), "by": sender()}
        entry.options = {**options, "headers": headers}
        try:
            return super().apply_async(entry, producer=producer, advance=False, **kwargs)
        finally:
            entry.options = options

    def _claim(self, entry: Any) -> bool:
        """Claim the run that :meth:`reserve` just advanced ``entry`` to; undo the advance if
        the claim is refused."""
        new = self._ylock_reserved.pop(entry.name, None)
        run = entry if new is None else new
        at = time.time() if new is None else epoch(run.last_run_at)
        if self.leader.claim(entry.name, at, int(run.total_run_count or 0)):
            self._ylock_claimed = entry.name
            return True
        if new is not None:
            self._unreserve(entry, new)
        self._heap = None                     # rebuilt from the shared records at the next term
        return False

    def _unreserve(self, old: Any, new: Any) -> None:
        schedule = self.schedule
        if schedule.get(old.name) is new:
            schedule[old.name] = old
        model = getattr(new, "model", None)       # django-celery-beat: next() changed its row object
        if model is not None:
            model.last_run_at, model.total_run_count = old.last_run_at, old.total_run_count

    # -- stopping ---------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.leader.close()
        finally:
            super().close()

    @property
    def info(self) -> str:
        s = self.leader.settings
        mine = f"    . leader lock -> {s.label} (lease {s.lease:g} s; wraps {_qualname(wrapped(type(self)))})"
        inner: str = super().info
        return f"{inner}\n{mine}" if inner else mine


def leader_class(scheduler: type[Scheduler]) -> type[LeaderScheduler]:
    """Return ``Leader<scheduler>``: the LeaderScheduler that wraps ``scheduler`` (made once)."""
    cls = _classes.get(scheduler)
    if cls is None:
        name = f"Leader{scheduler.__name__}"
        cls = _classes[scheduler] = type(name, (LeaderScheduler, scheduler), {"__module__": __name__,
                                                                             "__qualname__": name})
    return cls


def wrapped(cls: type) -> type:
    """The scheduler class a LeaderScheduler class wraps (the first after it in the MRO)."""
    mro = cls.__mro__
    return mro[mro.index(LeaderScheduler) + 1]


def merge(records: dict[str, str], entries: Iterable[Any]) -> None:
    """Set each entry's last run (and run count) to the shared record's, where there is one."""
    if not records:
        return
    for entry in entries:
        raw = records.get(entry.name)
        record = Record.loads(raw) if raw else None
        if record is None:
            continue
        at = entry_time(record.at, entry.last_run_at)
        entry.last_run_at, entry.total_run_count = at, record.runs
        model = getattr(entry, "model", None)       # django-celery-beat: the row it saves at sync
        if model is not None:
            model.last_run_at, model.total_run_count = at, record.runs


def epoch(value: datetime.datetime | None) -> float:
    """Epoch seconds of a Celery time (naive ones are UTC, as Celery takes them)."""
    if value is None:
        return time.time()
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


def entry_time(at: float, like: datetime.datetime | None) -> datetime.datetime:
    """``at`` (epoch seconds) as a datetime of the kind of ``like``: aware in its zone, or
    naive UTC."""
    utc = datetime.datetime.fromtimestamp(at, tz=datetime.timezone.utc)
    if like is None:
        return utc
    if like.tzinfo is None:
        return utc.replace(tzinfo=None)
    return utc.astimezone(like.tzinfo)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["HEADER", "LeaderScheduler", "leader_class", "merge", "wrapped"]
