"""The Django app: everything is wired in ``ready()``, nothing at import time."""
from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.core.signals import request_finished, setting_changed

import ylock

logger = logging.getLogger("django_ylock")


class YLockConfig(AppConfig):
    name = "django_ylock"
    verbose_name = "ylock distributed locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_ylock import checks, request_lock, signals  # noqa: F401 - registers the checks

        ylock.events.subscribe(signals.relay)
        setting_changed.connect(_settings_changed, dispatch_uid="django_ylock.settings_changed")
        request_finished.connect(request_lock.release_pending, dispatch_uid="django_ylock.release_pending")
        configure_metrics()


#: What YLOCK['METRICS'] started (``ylock.metrics.Metrics``), or None; the /metrics view reads it.
METRICS: Any = None


def configure_metrics() -> None:
    """Start the exporters that YLOCK['METRICS'] asks for (invalid settings are left to
    the system checks, so that ``manage.py check`` can report them)."""
    from django_ylock import conf

    global METRICS
    METRICS = None
    metrics = conf.ylock_settings().get("METRICS")
    if metrics is None:
        return
    try:
        import ylock.metrics

        METRICS = ylock.metrics.configure(metrics, setting="YLOCK['METRICS']")
    except (ylock.ConfigurationError, ImportError) as exc:
        logger.error("ylock: metrics not started: %s", exc)


def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("YLOCK", "BASE_DIR"):
        from django_ylock import registry

        registry.reset()
        configure_metrics()
