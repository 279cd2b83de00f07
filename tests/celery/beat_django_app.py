"""The Celery app of the DatabaseScheduler beat test (``celery -A tests.celery.beat_django_app
beat``): a Django project's app, configured from Django's settings
(:mod:`tests.celery.beat_django_settings`); its schedule is django-celery-beat's table, filled
by :func:`prepare`."""
from __future__ import annotations

import json
import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celery.beat_django_settings")
django.setup()

app = Celery("ylock_beat_django_tests", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")


def prepare(queue: str, entries: list[str], period: int) -> None:
    """Create the tables and one row per entry: every ``period`` seconds, the beat tests'
    record task on ``queue``."""
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    every, _ = IntervalSchedule.objects.get_or_create(every=period, period=IntervalSchedule.SECONDS)
    for entry in entries:
        PeriodicTask.objects.create(name=entry, task="ylock_beat_tests.record", interval=every,
                                    args=json.dumps([entry, ""]), queue=queue)


if __name__ == "__main__":
    import sys

    prepare(sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]))
