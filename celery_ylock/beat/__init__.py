"""A leader-elected Celery beat: run ``celery beat`` (or ``celery worker -B``) in every
instance, and exactly one of them sends.

    # celeryconfig.py (or app.conf; CELERY_BEAT_SCHEDULER / CELERY_YLOCK_BEAT in Django settings)
    beat_scheduler = "celery_ylock.beat:LeaderScheduler"
    ylock_beat = {"lock": "beat", "lease": 30, "scheduler": "celery.beat:PersistentScheduler"}

The beat that holds the lock (a named lock of the ylock settings: its engine, group, name)
leads; the others wait in its queue and take over when it is released (SIGTERM: at once)
or its lease runs out (SIGKILL, a lost host). When each entry last ran is shared through
the engine, so that a takeover neither repeats nor skips a run; every send is claimed there
first, fenced by the term's token, so a leader paused past its lease sends nothing after
it resumes. Each message carries the token in its headers (:func:`dispatch` reads it in
the task). See docs/celery.md, "Beat in every instance".

The package, by concern: :mod:`.settings` (``ylock_beat``), :mod:`.scheduler` (the
scheduler class and its hooks), :mod:`.leader` (the term and the claims), :mod:`.state`
(the shared state on each engine, and ``lua/``).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from celery_ylock.beat.scheduler import HEADER, LeaderScheduler

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["HEADER", "Dispatch", "LeaderScheduler", "dispatch", "status"]


class Dispatch(NamedTuple):
    """What a leader's message says about its send (:func:`dispatch`): ``token`` is the
    fencing token of the term that sent it (pass the Dispatch itself, or its token, to the
    fenced helpers), ``lock`` the beat lock (``group/name``), ``entry`` the schedule entry,
    ``at`` the run's time (epoch seconds, the sender's clock), ``sender`` its ``host:pid``."""

    token: int
    lock: str
    entry: str
    at: float
    sender: str


def dispatch(request: Any) -> Dispatch | None:
    """Return the :class:`Dispatch` of the task request ``request`` (``self.request`` in a
    bound task), or None if no LeaderScheduler sent it (a call, another beat)."""
    headers = getattr(request, "headers", None) or {}
    value = headers.get(HEADER) if isinstance(headers, dict) else None
    if value is None:
        value = getattr(request, HEADER, None)
    if not isinstance(value, dict) or not isinstance(value.get("token"), int):
        return None
    return Dispatch(value["token"], str(value.get("lock", "")), str(value.get("entry", "")),
                    float(value.get("at") or 0.0), str(value.get("by", "")))


def status(app: Celery) -> dict[str, Any]:
    """Return the shared state of ``app``'s beat lock, read from its engine: ``lock``,
    ``leader`` (the newest term: ``owner``, ``sender`` host:pid, ``token``, ``since``), ``terms``
    (how many terms began: the first election and every takeover), ``entries`` (by entry
    name: ``at``, ``n`` runs, ``token``, ``by``). Raise :class:`ylock.EngineUnavailable` if
    the engine does not answer."""
    from celery_ylock import conf
    from celery_ylock.beat.settings import beat_settings
    from celery_ylock.beat.state import ENTRY, store_for

    settings = beat_settings(app)
    engine = conf.state(app).registry.engine(settings.engine)
    raw = store_for(engine, settings.group, settings.name).read()
    return {"lock": settings.label, "leader": json.loads(raw["leader"]) if raw.get("leader") else None,
            "terms": int(raw.get("terms", 0)),
            "entries": {k[len(ENTRY):]: json.loads(v) for k, v in raw.items() if k.startswith(ENTRY)}}
