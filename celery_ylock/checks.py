"""The checks that stop a Celery worker at startup when its ylock settings or locked tasks
contradict each other (also run on first use anywhere, and by :func:`check_app`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_ylock import conf
from ylock.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery


def problems(app: Celery) -> list[ConfigurationError]:
    """Return every problem of ``app``'s ylock settings, locked tasks and leader-elected beat
    (``ylock_beat``), without connecting."""
    try:
        st = conf.state(app)
    except ConfigurationError as exc:
        return [exc]
    from celery_ylock.beat import settings as beat

    found = beat.problems(app)           # ylock_beat, if the app's beat is the LeaderScheduler
    for task in list(app.tasks.values()):
        # A locked task is one whose class carries a lock spec (LockedTask and its subclasses).
        spec: Any = getattr(type(task), "ylock_spec", None)
        if spec is not None:
            try:
                spec.check(task, st.registry)
            except ConfigurationError as exc:
                found.append(exc)
    return found


def check_app(app: Celery) -> None:
    """Raise :class:`~ylock.ConfigurationError` listing every problem of ``app``'s ylock
    settings and locked tasks (a worker runs it at startup)."""
    found = problems(app)
    if len(found) == 1:
        raise found[0]
    if found:
        first = found[0]
        raise ConfigurationError("celery_ylock: invalid settings:\n" + "\n".join(f"  {p}" for p in found),
                                 code=first.code)
