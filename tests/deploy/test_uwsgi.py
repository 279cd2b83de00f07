"""uWSGI in front of the README's Django project (``--processes 4 --enable-threads``), with
and without ``--lazy-apps``, on the embedded default: started cold, 200 concurrent
requests on the locked counter at once, no update lost, one embedded redis-server for all
workers and none left once uWSGI has stopped.

Without ``--lazy-apps`` uWSGI loads the app in its master and forks the workers from C,
which skips Python's fork hooks (``os.register_at_fork``) unless ``--py-call-osafterfork``
is given: ylock notices the new process on the worker's first use instead
(:func:`ylock.owner.after_fork`), so that no two workers share owner ids (two workers'
requests would pass for one owner re-entering the lock)."""
from __future__ import annotations

import signal
import sys

import pytest

from tests.deploy.helpers import (
    assert_cold,
    assert_no_lost_update,
    assert_one_embedded_server,
    burst,
    clean_env,
    django_project,
    figures,
    record,
    serving,
    uwsgi_binary,
    wait_embedded_gone,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REQUESTS = 200


@pytest.mark.parametrize("mode", ["lazy-apps", "py-call-osafterfork", "preload"])
def test_django_uwsgi_cold_burst_loses_no_update(tmp_path, request, mode):
    site = django_project(tmp_path / "site")
    counter = tmp_path / "counter.txt"
    db = site / ".ylock" / "ylock-redis.db"
    argv = [uwsgi_binary(), "--http-socket", "127.0.0.1:{port}", "--module", "mysite.wsgi:application",
            "--processes", "4", "--enable-threads", "--master", "--need-app", "--die-on-term",
            "--chdir", str(site), "--pythonpath", str(site), "--virtualenv", sys.prefix, "--disable-logging",
            "--listen", "1024"]     # uWSGI's backlog is 100: the rest of a burst would wait for SYN retries (1+2+4 s)
    if mode != "preload":
        argv.append(f"--{mode}")
    with serving("uwsgi", argv, site, clean_env(COUNTER_FILE=str(counter)), tmp_path / "uwsgi.log",
                 sig=signal.SIGTERM) as srv:
        result = burst(srv.url + "/counter", REQUESTS, REQUESTS)
        workers = set(srv.processes())
        info = assert_one_embedded_server(db, workers, set(result.per_pid()))
        assert_no_lost_update(result, counter, REQUESTS)
        if mode == "lazy-apps":
            assert_cold(result)
    assert not srv.leftovers()
    gone = wait_embedded_gone(db)
    record(request, figures(f"django uwsgi {mode} embedded", result, lost=0,
                            **{"per worker": sorted(result.per_pid().values()),
                               "engine": f"embedded server {info.pid}", "gone after stop": f"{gone:.2f}s"}))
