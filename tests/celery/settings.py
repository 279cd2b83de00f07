"""Celery settings of the test app (:mod:`tests.celery.app`), read on the app's first use,
from variables that the test session sets before it starts workers (see conftest.py)."""
from __future__ import annotations

import os

broker_url = os.environ["CELERY_YLOCK_TEST_BROKER"]
result_backend = os.environ["CELERY_YLOCK_TEST_BACKEND"]
# Short enough to be checked against the locks below, long enough never to redeliver here.
broker_transport_options = {"visibility_timeout": 120}
broker_connection_retry_on_startup = True
worker_prefetch_multiplier = 1
task_default_queue = "celery"
worker_hijack_root_logger = False
worker_redirect_stdouts = False

ylock = {
    "ENGINES": {"default": {"URL": os.environ["CELERY_YLOCK_TEST_YLOCK_URL"]}},
    "LOCKS": {
        "counter": {"LEASE": 5},
        "jobs": {"LEASE": 30},
        "dedup": {"LEASE": 10},
        "short": {"LEASE": 1.5},
        "long": {"LEASE": 60},
    },
}

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):     # the worker of test_prometheus_in_a_prefork_pool
    # the test tells its jobs apart by lock name: the counter group's names are labels (opted in)
    ylock["METRICS"] = {"PROMETHEUS": True, "TAG_NAMES": ["counter"]}
