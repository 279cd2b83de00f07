"""The Celery app of the beat tests (``celery -A tests.celery.beat_app beat|worker``): a 2 s
schedule of two entries on the "beat" queue, and the task that records every send it
receives. Read from variables that each test sets for the processes it starts:

``CELERY_YLOCK_TEST_BROKER`` / ``CELERY_YLOCK_TEST_YLOCK_URL``  the session's redis-server
``BEAT_SCHEDULER``   the scheduler (default: celery_ylock's LeaderScheduler; the control: Celery's)
``BEAT_LOCK``, ``BEAT_LEASE``, ``BEAT_PERIOD``  the beat lock, its lease, the schedule's period
``BEAT_QUEUE``       the queue the schedule's messages go to (one per test)
``BEAT_WRAPS``       the scheduler class the LeaderScheduler wraps (default: PersistentScheduler)
``BEAT_RECORD``      the file the ``record`` task writes (passed in each message's arguments)
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery, Task

import celery_ylock.beat

app = Celery("ylock_beat_tests", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("CELERY_YLOCK_TEST_BROKER", "memory://"),
    ylock_url=os.environ.get("CELERY_YLOCK_TEST_YLOCK_URL", "local://"),
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 120},
    task_default_queue=os.environ.get("BEAT_QUEUE", "beat"),
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    beat_scheduler=os.environ.get("BEAT_SCHEDULER", "celery_ylock.beat:LeaderScheduler"),
    ylock_beat={"lock": os.environ.get("BEAT_LOCK", "beat"), "lease": float(os.environ.get("BEAT_LEASE", "30")),
                "poll": 0.5, "scheduler": os.environ.get("BEAT_WRAPS", "celery.beat:PersistentScheduler")},
)

RECORD_TASK = "ylock_beat_tests.record"
PERIOD = float(os.environ.get("BEAT_PERIOD", "2"))
ENTRIES = ("every-2s-a", "every-2s-b")
_record_file = os.environ.get("BEAT_RECORD", "")
app.conf.beat_schedule = {
    entry: {"task": RECORD_TASK, "schedule": PERIOD, "args": (entry, _record_file),
            "options": {"queue": os.environ.get("BEAT_QUEUE", "beat")}}
    for entry in ENTRIES
}


@app.task(bind=True, shared=False, name=RECORD_TASK)
def record(self: Task, entry: str, path: str) -> None:
    """Append what this send says about itself to ``path`` (O_APPEND: lines never mix)."""
    sent = celery_ylock.beat.dispatch(self.request)
    line: dict[str, Any] = {"entry": entry, "received": time.time(), "task_id": self.request.id,
                            "origin": self.request.origin, "worker": os.getpid(), "token": None, "at": None,
                            "sender": self.request.origin}
    if sent is not None:
        line.update(token=sent.token, at=sent.at, sender=sent.sender, lock=sent.lock, header_entry=sent.entry)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")
