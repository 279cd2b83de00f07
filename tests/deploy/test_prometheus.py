"""Prometheus under gunicorn with several workers, set up as docs/metrics.md says (its code
blocks, extracted here): ``$PROMETHEUS_MULTIPROC_DIR``, the shipped ``on_starting`` and
``child_exit`` hooks, the Django view and the Flask endpoint. 60 locked requests on a real
Redis, then every scrape, whichever worker answers it, counts exactly 60 acquisitions,
also when workers were recycled (``--max-requests``) in the middle of the requests; with
sync, gthread and gevent workers."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.helpers import (
    ROOT,
    TEMPLATES,
    burst,
    clean_env,
    django_project,
    figures,
    flask_project,
    gunicorn,
    readme_block,
    record,
    serving,
)
from tests.helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DOCS = ROOT / "docs" / "metrics.md"
SECTION = "Prometheus with several worker processes"
REQUESTS = 60
SCRAPES = 6
#: How long every worker's queued events may take to reach the files once requests have finished
#: (the pump's period is 50 ms; this bounds a loaded CI machine).
SETTLE = 10.0
VARIANTS = {"sync": ["--workers", "3"],
            "recycled": ["--workers", "3", "--max-requests", "8", "--max-requests-jitter", "0"],
            "gthread": ["--workers", "3", "--threads", "4"],
            "gevent": ["--workers", "3", "--worker-class", "gevent", "--worker-connections", "50"]}

READY_HOOK = """

def post_worker_init(worker):             # the test's own: this worker has loaded the site
    open(os.path.join(os.environ["READY_DIR"], str(worker.pid)), "w").close()
"""


def docs_block(first_line: str) -> str:
    return readme_block(SECTION, first_line, DOCS)


def django_site(root: Path) -> tuple[Path, str]:
    site = django_project(root)
    with (site / "mysite" / "settings.py").open("a", encoding="utf-8") as fh:
        fh.write("\n" + docs_block("# settings.py"))
    with (site / "mysite" / "urls.py").open("a", encoding="utf-8") as fh:
        fh.write("\n" + docs_block("# urls.py"))
    return site, "mysite.wsgi"


def flask_site(root: Path) -> tuple[Path, str]:
    site = flask_project(root)
    line = docs_block("# app.py").splitlines()[-1]
    app_py = site / "app.py"
    text = app_py.read_text(encoding="utf-8")
    assert text.count("    ylock.init_app(app)") == 1
    app_py.write_text(text.replace("    ylock.init_app(app)", f"    {line}\n    ylock.init_app(app)"), encoding="utf-8")
    shutil.copy(TEMPLATES / "flask" / "metrics_app.py", site / "metrics_app.py")
    return site, "metrics_app:app"


def acquisitions(text: str, group: str = "counter") -> float:
    """The sum of ``ylock_events_total{outcome="acquired", group=...}`` over every series of a scrape."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ylock_events_total" and sample.labels.get("outcome") == "acquired" \
                    and sample.labels.get("group") == group:
                total += sample.value
    return total


def scrape(url: str) -> float:
    # A new connection per scrape, so that any worker may take it.
    response = httpx.get(f"{url}/metrics", timeout=30, headers={"Connection": "close"})
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/plain")
    return acquisitions(response.text)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("framework", ["django", "flask"])
def test_every_scrape_counts_every_workers_acquisitions(tmp_path, request, redis_url, framework, variant):
    site, app = (django_site if framework == "django" else flask_site)(tmp_path / "site")
    ready = tmp_path / "ready"
    ready.mkdir()
    # The docs' configuration, and a hook of the test's own: each worker leaves a file once it
    # has loaded the site (so the burst does not start while only one worker can answer).
    (site / "gunicorn.conf.py").write_text(docs_block("# gunicorn.conf.py") + READY_HOOK, encoding="utf-8")
    directory = tmp_path / "prometheus"
    directory.mkdir()
    # A previous run's files: on_starting must clear them, or counts would go on from them.
    (directory / "counter_999999.db").write_bytes(b"stale")
    env = clean_env(YLOCK_URL=redis_url, COUNTER_FILE=str(tmp_path / "counter.txt"),
                    PROMETHEUS_MULTIPROC_DIR=str(directory), READY_DIR=str(ready))
    argv = gunicorn(app, "-c", "gunicorn.conf.py", *VARIANTS[variant])
    with serving(f"gunicorn {framework} {variant}", argv, site, env, tmp_path / "gunicorn.log") as server:
        wait_until(lambda: len(list(ready.iterdir())) >= 3, timeout=120, what="the 3 workers loaded the site")
        result = burst(f"{server.url}/counter", REQUESTS, concurrency=6)
        assert result.codes == {200: REQUESTS}, f"answers: {dict(result.codes)}"
        answered = result.per_pid()
        if variant not in ("gthread", "gevent"):    # such a worker may accept every connection itself
            assert len(answered) >= 2, f"one worker answered every request: {dict(answered)}"
        deadline = time.monotonic() + SETTLE
        while (first := scrape(server.url)) != REQUESTS:
            assert first < REQUESTS, f"a scrape counted {first:g} acquisitions of {REQUESTS}"
            assert time.monotonic() < deadline, f"{first:g} acquisitions of {REQUESTS} after {SETTLE}s"
            time.sleep(0.05)
        counts = [scrape(server.url) for _ in range(SCRAPES)]
        assert counts == [REQUESTS] * SCRAPES
        if variant == "recycled":   # more pids than workers: some exited after their 8 requests
            assert len(answered) > 3, f"no worker was recycled: answered by {dict(answered)}"
        files = sorted(p.name for p in directory.iterdir())
    assert "counter_999999.db" not in files
    record(request, figures(f"{framework} {variant}", result, workers_answering=len(answered),
                            scrapes=[first, *counts]))


def test_the_docs_gunicorn_conf_starts_without_the_variable(tmp_path, redis_url):
    """The docs' ``gunicorn.conf.py`` where ``PROMETHEUS_MULTIPROC_DIR`` is not set (a dev shell,
    CI): gunicorn reads ``./gunicorn.conf.py`` even without ``-c``, and its hooks must not stop
    it (they raised KeyError in the master). The server starts, answers locked requests and
    ``/metrics`` (each worker its own counts), and says once, naming the variable, that the
    counts are per worker."""
    site, app = django_site(tmp_path / "site")
    ready = tmp_path / "ready"
    ready.mkdir()
    (site / "gunicorn.conf.py").write_text(docs_block("# gunicorn.conf.py") + READY_HOOK, encoding="utf-8")
    env = clean_env(YLOCK_URL=redis_url, COUNTER_FILE=str(tmp_path / "counter.txt"), READY_DIR=str(ready))
    for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        env.pop(name, None)
    argv = gunicorn(app, "--workers", "2")          # no -c: gunicorn finds ./gunicorn.conf.py itself
    with serving("gunicorn django without the variable", argv, site, env, tmp_path / "gunicorn.log") as server:
        wait_until(lambda: len(list(ready.iterdir())) >= 2, timeout=120, what="the 2 workers loaded the site")
        result = burst(f"{server.url}/counter", 10, concurrency=2)
        assert result.codes == {200: 10}, f"answers: {dict(result.codes)}"
        counted = scrape(server.url)              # one worker's own counts
        assert 0 <= counted <= 10
    log = server.output()
    assert "Traceback" not in log and "KeyError" not in log, log[-3000:]
    assert log.count("PROMETHEUS_MULTIPROC_DIR is not set") == 1, log[-3000:]


def series(text: str) -> int:
    """How many time series a scrape shows: its sample lines."""
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def test_lock_names_do_not_grow_the_series(tmp_path, request, redis_url):
    """The docs' minimal setup (``YLOCK["METRICS"] = {"PROMETHEUS": True}``) with the README's
    views and per-user middleware, under gunicorn with 3 workers in multiprocess mode: 200
    requests over 200 distinct lock names (100 accounts of ``@locked(key="account_id")``,
    100 API clients' tokens under USER_LOCK) add at most a few dozen series, whichever
    worker answers the scrape. The control opts both groups in (``TAG_NAMES``): one set of
    series per name, and ``manage.py check`` warns (W007) about exactly that setting."""
    grown: dict[bool, int] = {}
    for opted_in in (False, True):
        site, app = django_site(tmp_path / f"site-{opted_in}")
        if opted_in:
            with (site / "mysite" / "settings.py").open("a", encoding="utf-8") as fh:
                fh.write('\nYLOCK["METRICS"]["TAG_NAMES"] = ["accounts", "users"]\n')
        ready = tmp_path / f"ready-{opted_in}"
        ready.mkdir()
        (site / "gunicorn.conf.py").write_text(docs_block("# gunicorn.conf.py") + READY_HOOK, encoding="utf-8")
        directory = tmp_path / f"prometheus-{opted_in}"
        directory.mkdir()
        env = clean_env(YLOCK_URL=redis_url, COUNTER_FILE=str(tmp_path / "counter.txt"),
                        PROMETHEUS_MULTIPROC_DIR=str(directory), READY_DIR=str(ready))
        check = subprocess.run([sys.executable, "manage.py", "check"], cwd=site, env=env, capture_output=True,
                               text=True, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        warned = re.findall(r"django_ylock\.W007\) (YLOCK\['METRICS'\]\['TAG_NAMES'\] lists '\w+')",
                            check.stdout + check.stderr)
        assert sorted(warned) == ([] if not opted_in else ["YLOCK['METRICS']['TAG_NAMES'] lists 'accounts'",
                                                           "YLOCK['METRICS']['TAG_NAMES'] lists 'users'"]), \
            check.stdout + check.stderr
        argv = gunicorn(app, "-c", "gunicorn.conf.py", "--workers", "3")
        with serving(f"gunicorn series {opted_in}", argv, site, env, tmp_path / f"gunicorn-{opted_in}.log") as server:
            wait_until(lambda ready=ready: len(list(ready.iterdir())) >= 3, timeout=120,
                       what="the 3 workers loaded the site")

            def run(requests: list[tuple[str, dict[str, str]]]) -> None:
                with httpx.Client(timeout=60) as client:
                    for path, headers in requests:
                        answer = client.get(f"{server.url}{path}", headers={**headers, "Connection": "close"})
                        assert answer.status_code == 200, (path, answer.text[:300])

            def settled(expected: int) -> str:
                """A scrape once every worker's events are in (each group's acquisitions counted)."""
                deadline = time.monotonic() + SETTLE
                while True:
                    text = httpx.get(f"{server.url}/metrics", timeout=30, headers={"Connection": "close"}).text
                    if acquisitions(text, "accounts") == acquisitions(text, "users") == expected:
                        return text
                    assert time.monotonic() < deadline, f"not every acquisition was counted: {expected}"
                    time.sleep(0.05)
            # The first request of each group makes its series (about 59 each: counters, histograms).
            run([("/accounts/0/withdraw", {}), ("/api/whoami", {"Authorization": "Token warm-up"})])
            before = series(settled(1))
            run([r for i in range(1, 101) for r in ((f"/accounts/{i}/withdraw", {}),
                                                      ("/api/whoami", {"Authorization": f"Token client-{i}"}))])
            after = series(settled(101))
        grown[opted_in] = after - before
        record(request, f"[deploy] series: opted in {opted_in}: {before} before, {after} after 200 names")
    assert grown[False] <= 36, grown          # a few dozen at most (here: none)
    assert grown[True] >= 200 * 2, grown      # the control: at least acquired + released per name
