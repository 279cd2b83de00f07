"""A Celery app's engines and named locks (the checks that stop a worker at startup are
:mod:`celery_ylock.checks`).

Where the settings come from (the first that is set wins):

1. ``app.conf.ylock``: a dict shaped like Django's ``YLOCK`` (``ENGINES``, ``LOCKS``,
   ``METRICS``); in a Django project that reads Celery's settings with
   ``namespace="CELERY"``, that is ``CELERY_YLOCK`` in settings.py. ``app.conf.ylock_url``
   (else ``$YLOCK_URL``) fills in a ``default`` engine that ``ENGINES`` does not define.
2. ``app.conf.ylock_url`` alone: the ``default`` engine's URL.
3. In a Django project with ``django_ylock`` installed: its registry (the ``YLOCK``
   setting), so that tasks and views share engines and ``LOCKS``.
4. ``$YLOCK_URL``.

Nothing is built at import. Each process builds its engines on first use (a forked pool
child rebuilds none of its parent's connections: the core resets engines after
``fork()``), and connects on the engine's own first use.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ylock import options as opt
from ylock.errors import ConfigurationError
from ylock.registry import TOP_KEYS, Registry, with_default_engine

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

#: Broker transports that deliver a message again when it is not acknowledged within a
#: visibility timeout, with kombu's default for it (seconds).
VISIBILITY_TRANSPORTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "redis+socket": 3600.0,
                         "socket": 3600.0, "sqs": 1800.0}
#: How long an enqueue-scope lock waits in the queue for a worker, when neither the task
#: nor the broker (its visibility timeout) says.
DEFAULT_QUEUE_LEASE = 3600.0


@dataclass
class State:
    """One app's ylock settings in this process."""

    where: str                       # where the settings came from, for messages
    own: Registry | None             # built from app.conf / $YLOCK_URL; None: django_ylock's

    @property
    def registry(self) -> Registry:
        if self.own is not None:
            return self.own
        from django_ylock.registry import registry

        return registry()    # follows Django's settings (override_settings) by itself


_states: weakref.WeakKeyDictionary[Any, State] = weakref.WeakKeyDictionary()
_mutex = threading.Lock()


def state(app: Celery) -> State:
    """Return ``app``'s ylock state, built (and validated) on first use in this process;
    raise :class:`~ylock.ConfigurationError` naming the bad setting."""
    found = _states.get(app)
    if found is None:
        with _mutex:
            found = _states.get(app)
            if found is None:
                found = _states[app] = _build(app)
                from celery_ylock import signals
                from ylock import events

                events.subscribe(signals.relay)      # once per process (subscribe ignores repeats)
    return found


def reset(app: Celery) -> None:
    """Forget ``app``'s state (its settings changed); close the engines it built."""
    with _mutex:
        old = _states.pop(app, None)
    if old is not None and old.own is not None:
        old.own.close_all()


def _build(app: Celery) -> State:
    conf = app.conf
    raw = conf.get("ylock")
    url = conf.get("ylock_url") or None
    if raw is None and url is None and _django_ylock_installed():
        return State("django_ylock (settings.YLOCK)", None)
    url = url or os.environ.get("YLOCK_URL") or None
    where = "app.conf.ylock"
    if raw is not None and not isinstance(raw, Mapping):
        raise opt.fail(where, f"must be a dict shaped like Django's YLOCK setting, got {raw!r}", opt.E_SHAPE)
    settings = dict(raw or {})
    engines = opt.mapping(settings.get("ENGINES"), f"{where}['ENGINES']")
    if not engines and raw is None:
        where = "app.conf.ylock_url" if conf.get("ylock_url") else "$YLOCK_URL"
    settings["ENGINES"] = with_default_engine(engines, url, _no_engine)
    registry = Registry(settings, where=where)
    registry.validate(known=TOP_KEYS)
    if settings.get("METRICS") is not None:
        import ylock.metrics

        ylock.metrics.configure(settings["METRICS"], setting=f"{where}['METRICS']")
    return State(where, registry)


def _no_engine() -> str:
    """Celery has no embedded default engine: say how to name one."""
    raise ConfigurationError(
        "celery_ylock has no engine: set app.conf.ylock_url (CELERY_YLOCK_URL with Django's namespace), "
        "app.conf.ylock['ENGINES'] or $YLOCK_URL", code=opt.E_SHAPE,
        hint="e.g. app.conf.ylock_url = 'redis://127.0.0.1:6379/0'")


def _django_ylock_installed() -> bool:
    """True in a Django project whose INSTALLED_APPS has django_ylock (and is set up)."""
    if "django" not in sys.modules:
        return False
    try:
        from django.apps import apps
        from django.conf import settings

        return bool(settings.configured and apps.ready and apps.is_installed("django_ylock"))
    except Exception:  # noqa: BLE001 - any Django trouble means: not a usable django_ylock
        return False


# -- the broker --------------------------------------------------------------------------------


def visibility_timeout(app: Celery) -> float | None:
    """Return the seconds after which the broker delivers an unacknowledged message again
    (Redis, SQS), or None: a broker without one (RabbitMQ), or eager mode (no broker)."""
    conf = app.conf
    if conf.get("task_always_eager"):
        return None
    url = conf.get("broker_url") or conf.get("broker_read_url") or ""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    url = str(url).split(";")[0].strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else url.lower()
    default = VISIBILITY_TRANSPORTS.get(scheme)
    if default is None:
        return None
    options = conf.get("broker_transport_options") or {}
    value = options.get("visibility_timeout", default)
    return float(opt.seconds(value, "app.conf.broker_transport_options['visibility_timeout']"))
