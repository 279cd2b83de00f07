"""Tests of celery_ylock: task-level locks run by real Celery workers (Redis broker and
result backend, started by the test session in subprocesses)."""
