"""A Celery app whose settings contradict each other: a worker must refuse to start.

The broker delivers an unacknowledged message again after 20 s; the task acknowledges
late and skips when busy, but its lock's lease is 30 s: a task delivered again after its
worker died would find the dead worker's lock still held, and be skipped."""
from __future__ import annotations

from celery import Celery

from celery_ylock import LockedTask

app = Celery("ylock_bad_tests", set_as_current=False)
app.config_from_object("tests.celery.settings")
app.conf.broker_transport_options = {"visibility_timeout": 20}


@app.task(shared=False, base=LockedTask, acks_late=True, lock={"name": "jobs", "key": "{job}", "on_busy": "skip"})
def late_job(job: str) -> None:
    """Never runs."""
