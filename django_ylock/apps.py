"""The Django app: everything is wired in ``ready()``, nothing at import time."""
from __future__ import annotations

import logging
import sys
from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import request_finished, setting_changed

import ylock

logger = logging.getLogger(__name__)


class YLockConfig(AppConfig):
    name = "django_ylock"
    verbose_name = "ylock distributed locks"
    default_auto_field = "django.db.models.AutoField"

    #: What YLOCK['METRICS'] started (a ``ylock.metrics.Metrics``), or None; the /metrics view reads it.
    metrics: Any = None

    def ready(self) -> None:
        from django_ylock import checks, conf, request_lock, signals  # noqa: F401 - registers the checks

        # django://ALIAS before anything reads the engine settings (the core names no plugin).
        ylock.engines.register_scheme("django", "django_ylock.databases.DjangoEngines")

        # Servers do not run system checks: an invalid YLOCK stops the app here, at
        # startup, naming every problem (``manage.py check`` reports them as checks instead).
        problems = conf.current().problems
        if problems and not _running_check():
            raise ImproperlyConfigured("invalid YLOCK setting:\n" + "\n".join(
                f"  django_ylock.{p.code}: {p}" for p in problems))
        ylock.events.subscribe(signals.relay)
        setting_changed.connect(_settings_changed, dispatch_uid="django_ylock.settings_changed")
        request_finished.connect(request_lock.release_pending, dispatch_uid="django_ylock.release_pending")
        self.configure_metrics()

    def configure_metrics(self) -> None:
        """Start the exporters that YLOCK['METRICS'] asks for (invalid settings are left to
        the system checks, so that ``manage.py check`` can report them)."""
        from django_ylock import conf

        self.metrics = None
        metrics = conf.ylock_settings().get("METRICS")
        if metrics is None:
            return
        try:
            import ylock.metrics

            self.metrics = ylock.metrics.configure(metrics, setting="YLOCK['METRICS']")
        except (ylock.ConfigurationError, ImportError) as exc:
            logger.error("ylock: metrics not started: %s", exc)


def _running_check() -> bool:
    """True when this process runs ``manage.py check`` (which reports settings problems
    as system checks, all at once, with their ids)."""
    return len(sys.argv) > 1 and sys.argv[1] == "check"


def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("YLOCK", "BASE_DIR", "SECRET_KEY"):
        from django.apps import apps

        from django_ylock import conf

        conf.reset()
        apps.get_app_config("django_ylock").configure_metrics()
