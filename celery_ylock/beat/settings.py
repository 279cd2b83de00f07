"""The beat's settings: ``app.conf.ylock_beat`` (``CELERY_YLOCK_BEAT`` in a Django project
that reads Celery's settings with ``namespace="CELERY"``), validated at the scheduler's start
(and by :func:`celery_ylock.check_app`), each mistake a :class:`~ylock.ConfigurationError`
naming the key."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from celery.beat import Scheduler
from celery.utils.imports import load_extension_class_names, symbol_by_name

from celery_ylock import conf
from celery_ylock.beat.state import check_engine
from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.waiting import Polling

if TYPE_CHECKING:
    from celery import Celery

#: Where the settings are read, for messages.
WHERE = "app.conf.ylock_beat"
#: The keys of ``ylock_beat``, with their defaults.
DEFAULTS: dict[str, Any] = {
    "lock": "beat",                                      # a named lock (LOCKS): engine, group, name, lease
    "lease": None,                                       # seconds; None: the lock's LEASE
    "scheduler": "celery.beat:PersistentScheduler",      # the scheduler class that decides what is due
    "poll": 1.0,                                         # seconds a stand-by waits per tick
}


@dataclass(frozen=True)
class BeatSettings:
    """``ylock_beat``, validated."""

    lock: str                       # the name of the lock in the settings' LOCKS
    engine: str                     # its engine's alias
    group: str
    name: str
    fair: bool
    lease: float
    polling: Polling | None
    scheduler: type[Scheduler]      # the wrapped class
    poll: float

    @property
    def label(self) -> str:
        return f"{self.group}/{self.name}"


def beat_settings(app: Celery) -> BeatSettings:
    """Return ``app``'s beat settings; raise :class:`~ylock.ConfigurationError` naming the
    bad key (or the ylock setting behind it: the lock's ``LOCKS`` entry, its engine)."""
    raw = app.conf.get("ylock_beat")
    if raw is not None and not isinstance(raw, Mapping):
        raise opt.fail(WHERE, f"must be a dict such as {{'lock': 'beat', 'lease': 30}}, got {raw!r}", opt.E_SHAPE)
    values = opt.section(raw, WHERE, DEFAULTS)
    name = opt.text(values["lock"], f"{WHERE}['lock']")
    registry = conf.state(app).registry
    options = registry.lock_options(name)
    lease = options.lease if values["lease"] is None else opt.lease(values["lease"], f"{WHERE}['lease']")
    poll = opt.seconds(values["poll"], f"{WHERE}['poll']", maximum=60.0)
    scheduler = scheduler_class(values["scheduler"], f"{WHERE}['scheduler']")
    check_engine(registry.engine(options.engine), f"{WHERE}['lock'] = {name!r}")   # not at the first tick
    return BeatSettings(lock=name, engine=options.engine, group=options.group, name=options.lock_name,
                        fair=options.fair, lease=lease, polling=options.polling, scheduler=scheduler, poll=poll)


def scheduler_class(value: Any, where: str) -> type[Scheduler]:
    """Return the scheduler class that ``value`` names: a class, ``"module:Class"``,
    ``"module.Class"`` or an alias of the ``celery.beat_schedulers`` entry points (as
    ``celery beat --scheduler`` takes them)."""
    cls = value
    if isinstance(value, str):
        if not value.strip():
            raise opt.fail(where, "must name a scheduler class such as 'celery.beat:PersistentScheduler', got ''",
                           opt.E_IMPORT)
        try:
            cls = symbol_by_name(value, aliases=dict(cast(Any, load_extension_class_names("celery.beat_schedulers"))))
        except (ImportError, AttributeError, ValueError) as exc:
            raise opt.fail(where, f"= {value!r} cannot be imported: {exc}", opt.E_IMPORT) from exc
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise opt.fail(where, f"must be a celery.beat.Scheduler subclass (or the path of one), got {value!r}",
                       opt.E_IMPORT)
    if getattr(cls, "ylock_leader", False):           # LeaderScheduler or a subclass
        raise opt.fail(where, "names celery_ylock's LeaderScheduler itself: name the scheduler it wraps, such as "
                       "'celery.beat:PersistentScheduler'", opt.E_IMPORT)
    return cls


def problems(app: Celery) -> list[ConfigurationError]:
    """The problems of ``app``'s beat settings, if the app uses the LeaderScheduler (its
    ``beat_scheduler`` names it, or ``ylock_beat`` is set)."""
    scheduler = app.conf.get("beat_scheduler")
    name = scheduler if isinstance(scheduler, str) else getattr(scheduler, "__module__", "")
    if app.conf.get("ylock_beat") is None and "celery_ylock.beat" not in str(name):
        return []
    try:
        beat_settings(app)
    except ConfigurationError as exc:
        return [exc]
    return []
