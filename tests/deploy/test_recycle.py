"""gunicorn recycles a worker (``--max-requests``): the worker exits normally, and whatever
it still held (here a lock a view took and kept, as a leader or a long job would) is given
back at its exit, so the worker that replaces it takes the lock at once instead of after
the lease. Real gunicorn, real Redis."""
from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from tests.deploy.helpers import clean_env, gunicorn, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = textwrap.dedent('''
    import os
    from flask import Flask
    import ylock

    app = Flask(__name__)
    engine = ylock.engine_from_url(os.environ["YLOCK_URL"])
    job = ylock.Lock(engine, os.environ["GROUP"], "job", lease=60)

    @app.get("/take")
    def take():
        # Taken and kept past the request (re-entered by the same worker thread).
        return f"{'took' if job.try_lock(0) else 'busy'} {os.getpid()}"
''')


def test_a_recycled_worker_gives_back_its_locks_at_once(tmp_path: Path, redis_url: str, group: str) -> None:
    (tmp_path / "recycle_app.py").write_text(APP)
    env = clean_env(YLOCK_URL=redis_url, GROUP=group)
    argv = gunicorn("recycle_app:app", "--workers", "1", "--max-requests", "2")
    with serving("gunicorn", argv, tmp_path, env, tmp_path / "gunicorn.log") as served, \
            httpx.Client(base_url=served.url, timeout=30) as http:
        answers = [http.get("/take").text.split() for _ in range(3)]
    (first, pid1), (second, pid1_again), (third, pid2) = answers
    assert (first, second) == ("took", "took") and pid1 == pid1_again
    assert pid2 != pid1, "gunicorn did not recycle its worker after --max-requests 2"
    # The lease is 60 s: the new worker got the lock only because the old one gave it back.
    assert third == "took", served.output()[-3000:]
