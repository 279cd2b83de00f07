"""Django settings of the DatabaseScheduler beat test (:mod:`tests.celery.beat_django_app`):
django-celery-beat's tables in a SQLite file, Celery's settings under ``CELERY_`` (what a
Django project's ``app.config_from_object("django.conf:settings", namespace="CELERY")`` reads),
the beat lock's settings as ``CELERY_YLOCK_BEAT``. Read from the beat tests' variables."""
from __future__ import annotations

import os

SECRET_KEY = "ylock-beat-tests"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_celery_beat"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("BEAT_DB", ":memory:"),
                         "OPTIONS": {"timeout": 30}}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("CELERY_YLOCK_TEST_BROKER", "memory://")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = None              # no backend_cleanup entry written by every beat at its start
CELERY_YLOCK_URL = os.environ.get("CELERY_YLOCK_TEST_YLOCK_URL", "local://")
CELERY_BEAT_SCHEDULER = "celery_ylock.beat:LeaderScheduler"
CELERY_YLOCK_BEAT = {"lock": os.environ.get("BEAT_LOCK", "beat"), "lease": float(os.environ.get("BEAT_LEASE", "30")),
                     "poll": 0.5, "scheduler": "django_celery_beat.schedulers:DatabaseScheduler"}
