"""gunicorn in front of the README's Django and Flask projects: started cold and hit at once
by 200 concurrent requests on a read-modify-write counter (no warm-up request), on the
embedded default (no $YLOCK_URL: one embedded redis-server for every worker, none left
once gunicorn has stopped) and on a real Redis ($YLOCK_URL); settings mistakes stop the
workers' boot instead of answering 500s."""
from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest

from tests.deploy.helpers import (
    EMBEDDED_FILES,
    EMBEDDED_FILES_AFTER,
    Served,
    assert_cold,
    assert_no_lost_update,
    assert_nothing_held,
    assert_one_embedded_server,
    burst,
    clean_env,
    counter_value,
    django_project,
    embedded_files,
    embedded_processes,
    embedded_users,
    figures,
    flask_project,
    gunicorn,
    record,
    serving,
    wait_embedded_gone,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REQUESTS = 200
WORKERS = {"sync": ["--workers", "4"], "gthread": ["--workers", "4", "--threads", "8"],
           "preload": ["--workers", "4", "--preload"]}    # the app loaded in the master, then forked


def engine_env(request: pytest.FixtureRequest, engine: str, counter: Path) -> dict[str, str]:
    env = clean_env(COUNTER_FILE=str(counter))
    if engine == "redis":
        env["YLOCK_URL"] = request.getfixturevalue("redis_url")
    return env


def check_engine_while_serving(engine: str, db: Path, workers: set[int], answered: set[int]) -> str:
    """The embedded default: exactly one server (and keeper) for the database file, used by
    every worker that answered and by no other process. A real Redis: no embedded server."""
    if engine == "embedded":
        info = assert_one_embedded_server(db, workers, answered)
        assert embedded_files(db) <= set(EMBEDDED_FILES), embedded_files(db)
        return f"one embedded server (pid {info.pid}) for {len(embedded_users(db))} workers"
    assert embedded_processes(db) == ([], []) and not embedded_files(db)
    return "redis"


def check_engine_after_stop(engine: str, db: Path, env: dict[str, str]) -> str:
    if engine == "embedded":
        took = wait_embedded_gone(db)
        assert embedded_files(db) == set(EMBEDDED_FILES_AFTER), embedded_files(db)   # the database saved
        return f"embedded server gone {took:.2f}s after gunicorn"
    assert_nothing_held(env["YLOCK_URL"])
    return "nothing held"


@pytest.mark.parametrize("worker", ["sync", "gthread", "preload"])
@pytest.mark.parametrize("engine", ["embedded", "redis"])
def test_django_gunicorn_cold_burst_loses_no_update(tmp_path, request, engine, worker):
    site = django_project(tmp_path / "site")
    counter = tmp_path / "counter.txt"
    env = engine_env(request, engine, counter)
    db = site / ".ylock" / "ylock-redis.db"      # <BASE_DIR>/.ylock/ylock-redis.db: the embedded default
    with serving("gunicorn", gunicorn("mysite.wsgi", *WORKERS[worker]), site, env, tmp_path / "gunicorn.log") as srv:
        result = burst(srv.url + "/counter", REQUESTS, REQUESTS)
        workers = set(srv.processes())
        seen = check_engine_while_serving(engine, db, workers, set(result.per_pid()))
        assert_no_lost_update(result, counter, REQUESTS)
        if worker != "preload":
            assert_cold(result)
        # The README's views, as pasted, answer too (sync, async under WSGI, on_commit, health).
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            assert client.get("/accounts/7/withdraw").json() == {"account": 7}
            assert client.get("/accounts/7/balance").json() == {"account": 7}
            assert client.get("/ledger").json() == {"posted": True}
            assert client.get("/health").json() == {"locks": "ok"}
        if worker == "sync":
            # The control: the same view without the lock loses updates in this very setup.
            counter.unlink()
            unlocked = burst(srv.url + "/counter/unlocked", REQUESTS, REQUESTS)
            assert unlocked.codes == {200: REQUESTS}
            lost_unlocked = REQUESTS - counter_value(counter)
            assert lost_unlocked > 0, "the counter cannot tell a missing lock: the test proves nothing"
    assert not srv.leftovers()
    after = check_engine_after_stop(engine, db, env)
    extra = {"per worker": sorted(result.per_pid().values()), "engine": seen, "after stop": after}
    if worker == "sync":
        extra["lost without the lock"] = lost_unlocked
    record(request, figures(f"django gunicorn {worker} {engine}", result, lost=0, **extra))


@pytest.mark.parametrize("worker", ["sync", "gthread"])
@pytest.mark.parametrize("engine", ["embedded", "redis"])
def test_flask_gunicorn_cold_burst_loses_no_update(tmp_path, request, engine, worker):
    site = flask_project(tmp_path / "site")
    counter = tmp_path / "counter.txt"
    env = engine_env(request, engine, counter)
    db = site / "instance" / "ylock-redis.db"       # <app.instance_path>/ylock-redis.db
    with serving("gunicorn", gunicorn("counter_app:app", *WORKERS[worker]), site, env,
                 tmp_path / "gunicorn.log") as srv:
        result = burst(srv.url + "/counter", REQUESTS, REQUESTS)
        workers = set(srv.processes())
        seen = check_engine_while_serving(engine, db, workers, set(result.per_pid()))
        assert_no_lost_update(result, counter, REQUESTS)
        assert_cold(result)
        with httpx.Client(base_url=srv.url, timeout=30) as client:     # the README's routes, as pasted
            assert client.post("/accounts/7/withdraw").json() == {"account": 7}
            assert client.get("/accounts/7").json() == {"account": 7}
            assert client.get("/health").json() == {"locks": "ok"}
    assert not srv.leftovers()
    after = check_engine_after_stop(engine, db, env)
    record(request, figures(f"flask gunicorn {worker} {engine}", result, lost=0,
                            **{"per worker": sorted(result.per_pid().values()), "engine": seen, "after stop": after}))


def test_readme_flask_app_factory_served_as_pasted(tmp_path, request):
    """``gunicorn -w 4 'app:create_app()'``, the command in the README's Flask block, on the
    pasted file alone: its routes answer, on the embedded default."""
    site = flask_project(tmp_path / "site")
    db = site / "instance" / "ylock-redis.db"
    with serving("gunicorn", gunicorn("app:create_app()", "--workers", "4"), site, clean_env(),
                 tmp_path / "gunicorn.log") as srv:
        result = burst(srv.url + "/accounts/7/withdraw", 40, 40)
        assert result.codes == {200: 40}
        workers = set(srv.processes())
        assert_one_embedded_server(db, workers)
    assert not srv.leftovers()
    wait_embedded_gone(db)
    record(request, figures("flask README app:create_app()", result))


def test_gevent_workers_with_more_greenlets_than_the_pool_holds(tmp_path, request, redis_url):
    """gevent with worker-connections above the pool's default (redis-py 8's: 100): waiting
    greenlets hold no connection (they share one blocking pop), so the default pool does."""
    site = django_project(tmp_path / "site")
    counter = tmp_path / "counter.txt"
    env = clean_env(COUNTER_FILE=str(counter), YLOCK_URL=redis_url)
    argv = gunicorn("mysite.wsgi", "--worker-class", "gevent", "--workers", "2", "--worker-connections", "400")
    with serving("gunicorn", argv, site, env, tmp_path / "gunicorn.log") as srv:
        result = burst(srv.url + "/counter", REQUESTS, REQUESTS)
        assert_no_lost_update(result, counter, REQUESTS)
        assert_cold(result)
    assert not srv.leftovers()
    assert_nothing_held(redis_url)
    record(request, figures("django gunicorn gevent redis", result, lost=0))


# -- startup errors -------------------------------------------------------------------------------


def boot_failure(tmp_path: Path, site: Path, app: str, env: dict[str, str]) -> str:
    """Serve ``app`` and expect gunicorn to stop because its workers cannot boot; return its output."""
    srv = Served("gunicorn", gunicorn(app, "--workers", "2"), site, env, tmp_path / "gunicorn.log")
    try:
        with contextlib.suppress(AssertionError):      # it may stop before it was seen listening
            srv.start()
        status = srv.wait(60)
    finally:
        srv.stop()
    log = srv.output()
    # gunicorn exits with 3 (WORKER_BOOT_ERROR); run as ``python -m gunicorn``, the HaltServer
    # it raises to get there ends the interpreter with 1.
    assert status not in (None, 0) and "Worker failed to boot" in log, f"gunicorn status {status}:\n{log[-3000:]}"
    return log


@pytest.mark.parametrize("mistake, named", [
    ('"TIMOUT": 5}}', "YLOCK['LOCKS']['orders'] has unknown key 'TIMOUT'"),
    ('"TIMEOUT": 5}}, "ENGINE": {"default": {"URL": "redis://127.0.0.1:6379/0"}}', "unknown key 'ENGINE'"),
])
def test_django_settings_mistake_stops_the_worker_boot(tmp_path, mistake, named):
    site = django_project(tmp_path / "site")
    settings = site / "mysite" / "settings.py"
    text = settings.read_text()
    assert text.count('"TIMEOUT": 5}}') == 1
    settings.write_text(text.replace('"TIMEOUT": 5}}', mistake))
    log = boot_failure(tmp_path, site, "mysite.wsgi", clean_env(COUNTER_FILE=str(tmp_path / "c")))
    assert "django.core.exceptions.ImproperlyConfigured: invalid YLOCK setting" in log
    assert named in log, log[-3000:]
    db = site / ".ylock" / "ylock-redis.db"
    assert embedded_processes(db) == ([], []), "a worker that failed to boot left an embedded server"


def test_flask_settings_mistake_stops_the_worker_boot(tmp_path):
    site = flask_project(tmp_path / "site")
    app = site / "app.py"
    text = app.read_text()
    assert text.count('{"accounts": {"TIMEOUT": 2}}') == 1
    app.write_text(text.replace('{"accounts": {"TIMEOUT": 2}}', '{"accounts": {"TIMOUT": 2}}'))
    log = boot_failure(tmp_path, site, "app:create_app()", clean_env())
    assert "ylock.errors.ConfigurationError" in log and "YLOCK_LOCKS['accounts'] has unknown key 'TIMOUT'" in log, \
        log[-3000:]
