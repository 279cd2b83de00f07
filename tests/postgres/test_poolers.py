"""The PostgreSQL engine behind a real PgBouncer (Debian's), in transaction and session
modes: the pooler check (W004, and the refusal of session scope at the first connection),
transaction-scope locks across processes, session-scope locks through a session pooler,
and what is left on the pooled server backends afterwards: nothing (no advisory lock, no
prepared statement, every setting the role's own default, which differs from each one
ylock gives its connections)."""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import psycopg
import pytest

import ylock
from tests.conftest import POOLED_ROLE
from tests.faults import run_counter
from tests.faults.test_postgres import freed_after_sigkill, start_holder
from tests.helpers import wait_until
from tests.postgres.conftest import STATE, STATE_NAMES, pooled_backends
from ylock.testing.fencing import UnfencedCounter


@pytest.fixture
def clean(postgres_server, pooled_role) -> dict[str, Any]:
    """What a backend of the pooled role carries when nobody changed it (read directly)."""
    url = postgres_server.url.replace(f"//{postgres_server.user}@", f"//{pooled_role}@")
    with psycopg.connect(url, autocommit=False) as conn:
        row = conn.execute(STATE).fetchone()
    assert row is not None
    state = dict(zip(STATE_NAMES, row[1:]))
    assert state["statement_timeout"] == "17s" and state["idle_session_timeout"] == "1h"   # not ylock's
    return state


def assert_nothing_left(bouncer, observer, clean) -> None:
    backends = pooled_backends(bouncer, POOLED_ROLE)
    assert backends, "the pooler has no server connection to look at"
    for pid, state in backends.items():
        assert state == clean, f"backend {pid} was left with {state}"
    rows = observer.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY(%s)",
                            [list(backends)]).fetchall()
    assert rows == []


def test_the_pooler_check_finds_pgbouncer_in_transaction_mode_only(make_engine, pgbouncer_transaction,
                                                                   pgbouncer_session, postgres_server, observer,
                                                                   clean):
    url = pgbouncer_transaction.url_for(POOLED_ROLE)
    found = make_engine(url).detect_pooler()
    assert found is not None and "transaction" in found and "PgBouncer" in found and "?scope=transaction" in found
    assert make_engine(url + "?scope=transaction").detect_pooler() is None
    assert make_engine(url + "?pooler=session").detect_pooler() is not None      # proof beats what it is told
    assert make_engine(pgbouncer_session.url_for(POOLED_ROLE)).detect_pooler() is None   # it keeps sessions
    assert make_engine(postgres_server.url).detect_pooler() is None
    assert_nothing_left(pgbouncer_transaction, observer, clean)                 # the check sets nothing


@pytest.mark.parametrize("scope", ["session", "transaction"])
def test_a_statement_pooler_is_named_in_both_scopes(make_engine, pgbouncer_statement, group, scope):
    url = f"{pgbouncer_statement.url_for(POOLED_ROLE)}?scope={scope}"
    found = make_engine(url).detect_pooler()
    assert found is not None and "statement mode" in found
    with pytest.raises(ylock.ConfigurationError, match="pool_mode=statement") as caught:
        ylock.Lock(make_engine(url), group, "n").lock(timeout=1)
    assert f"lock {group}/n" in str(caught.value)


def test_session_scope_behind_a_transaction_pooler_refuses_before_locking_or_setting_anything(
        make_engine, pgbouncer_transaction, observer, clean, group):
    engine = make_engine(pgbouncer_transaction.url_for(POOLED_ROLE))
    lock = ylock.Lock(engine, group, "n")
    for _ in range(2):                          # the first connection, and every use after it
        with pytest.raises(ylock.ConfigurationError) as caught:
            lock.lock(timeout=1)
        message = str(caught.value)
        assert "PgBouncer" in message and "?scope=transaction" in message and "nothing was locked" in message
        assert message.endswith(f"(lock {group}/n)")
        assert not lock.held()
    with pytest.raises(ylock.ConfigurationError):
        ylock.Semaphore(engine, group, "s", permits=2).acquire(timeout=1)
    fresh = make_engine(pgbouncer_transaction.url_for(POOLED_ROLE))      # asyncio: the same first connection
    with pytest.raises(ylock.ConfigurationError, match="scope=transaction"):
        asyncio.run(ylock.Lock(fresh, group, "n").alock(timeout=1))
    assert_nothing_left(pgbouncer_transaction, observer, clean)


def test_transaction_scope_through_a_transaction_pooler_excludes_processes_and_leaves_nothing(
        make_engine, pgbouncer_transaction, observer, clean, group, tmp_path):
    url = pgbouncer_transaction.url_for(POOLED_ROLE) + "?scope=transaction"
    path = str(tmp_path / "counter.json")
    tokens = run_counter(url, group, path, 3, 20, use_lock=True)
    counter = UnfencedCounter(path)
    assert counter.increments == 60 and counter.lost == 0 and counter.value == 60
    assert len(set(tokens)) == 60
    control = str(tmp_path / "control.json")
    run_counter(url, group, control, 3, 20, use_lock=False)
    assert UnfencedCounter(control).lost > 0                # the counter catches a broken lock
    # Acquisitions that time out give back what they may have been granted (a rollback).
    holder, other = make_engine(url), make_engine(url)
    with ylock.Lock(holder, group, "n"):
        for _ in range(3):
            assert not ylock.Lock(other, group, "n").try_lock(timeout=0.05)
            assert not ylock.Lock(other, group, "n").try_rlock()
    # A semaphore's queue key is a session lock even in transaction scope (taken and let go
    # within the hold's transaction): a head that gives up lets it go on the same backend.
    with ylock.Semaphore(holder, group, "s", permits=1):
        for _ in range(3):
            with pytest.raises(ylock.LockTimeout):
                ylock.Semaphore(other, group, "s", permits=1).acquire(timeout=0.2)
    holder.close()
    other.close()
    assert_nothing_left(pgbouncer_transaction, observer, clean)


def test_session_scope_through_a_session_pooler_works_and_leaves_nothing(
        make_engine, pgbouncer_session_noreset, observer, clean, group, tmp_path):
    bouncer = pgbouncer_session_noreset             # what is left is not cleaned by the pooler here
    url = bouncer.url_for(POOLED_ROLE)
    assert make_engine(url).detect_pooler() is None
    path = str(tmp_path / "counter.json")
    tokens = run_counter(url, group, path, 3, 20, use_lock=True)
    counter = UnfencedCounter(path)
    assert counter.increments == 60 and counter.lost == 0 and len(set(tokens)) == 60
    engine = make_engine(url)
    lock = ylock.Lock(engine, group, "n")
    with lock.write(timeout=5):
        assert observer.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() != (0,)
    engine.close()
    assert_nothing_left(bouncer, observer, clean)
    # A second engine after the first closed reuses its server sessions: no prepared statement
    # of the first one collides (PgBouncer left them all in place before).
    again = make_engine(url)
    with ylock.Lock(again, group, "n").write(timeout=5):
        pass
    again.close()
    assert_nothing_left(bouncer, observer, clean)
    # Cleaning up costs the pooler nothing: it keeps its server sessions (it would close one
    # its client left while still busy, and the next client would wait for a new backend).
    before = set(pooled_backends(bouncer, POOLED_ROLE))
    for _ in range(3):
        engine = make_engine(url)
        with ylock.Lock(engine, group, "n").write(timeout=5):
            pass
        engine.close()
    assert set(pooled_backends(bouncer, POOLED_ROLE)) == before


@pytest.mark.parametrize("reset", ["default", "off"])
def test_a_killed_holder_behind_a_session_pooler(request, make_engine, observer, clean, group, tmp_path, figure,
                                                 reset):
    """SIGKILL: the holder's client connection closes, PgBouncer gives its server session back
    to the pool (it was idle: not closed). With the default reset (DISCARD ALL) the lock goes
    at once; with the reset off, the lock stays on that server session until the next ylock
    connection that gets it drops it, or its lease (idle_session_timeout) ends it."""
    bouncer = request.getfixturevalue("pgbouncer_session" if reset == "default" else "pgbouncer_session_noreset")
    url = bouncer.url_for(POOLED_ROLE)
    proc, pipe, _ = start_holder(url, group, 30.0, str(tmp_path / "r.json"))
    engine = make_engine(url)
    if reset == "default":
        freed = freed_after_sigkill(engine, group, proc.pid)
        figure(f"holder SIGKILLed behind PgBouncer session mode (DISCARD ALL): lock free after "
               f"{freed * 1000:.1f} ms")
        assert freed < 0.5
        engine.close()
    else:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
        # The killed holder's server session, idle in the pool, still holds the lock...
        wait_until(lambda: not any(r["state"] == "active" for r in bouncer.show("SERVERS")
                                   if r["user"] == POOLED_ROLE), what="the holder's server session idle")
        assert observer.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                                ).fetchone()[0] >= 1
        # ...until a ylock connection gets that server session: it drops what it finds there.
        lock = ylock.Lock(engine, group, "n")
        assert lock.try_lock(timeout=5)
        lock.unlock()
        engine.close()
    proc.join(5)
    pipe.close()
    assert_nothing_left(bouncer, observer, clean)


DJANGO_SETTINGS = """
SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ylock"]
DATABASES = {{name: {{"ENGINE": "django.db.backends.postgresql", "NAME": "ylock", "USER": "{role}",
                     "HOST": "127.0.0.1", "PORT": str(port), "OPTIONS": {{"sslmode": "disable"}}}}
             for name, port in (("default", {direct}), ("txn", {txn}), ("sess", {sess}))}}
YLOCK = {{"ENGINES": {{"direct": {{"URL": "django://default"}}, "txn": {{"URL": "django://txn"}},
                      "txn_xact": {{"URL": "django://txn?scope=transaction"}}, "sess": {{"URL": "django://sess"}}}}}}
"""

DJANGO_RUN = """
import json, sys
import django
django.setup()
from django.core.checks import run_checks
import django_ylock, ylock

out = {"checks": sorted((m.id, m.msg) for m in run_checks(include_deployment_checks=True)
                        if m.id.startswith("django_ylock"))}
try:
    ylock.Lock(django_ylock.engine("txn"), sys.argv[1], "a").lock(timeout=1)
    out["txn"] = "locked"
except ylock.ConfigurationError as exc:
    out["txn"] = str(exc)
for alias in ("txn_xact", "sess", "direct"):
    with ylock.Lock(django_ylock.engine(alias), sys.argv[1], "a").write(timeout=5):
        out[alias] = "locked"
    django_ylock.engine(alias).close()
print("RESULT " + json.dumps(out))
"""


def test_the_django_database_engine_behind_pgbouncer(postgres_server, pgbouncer_transaction, pgbouncer_session,
                                                     pooled_role, observer, clean, group, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "bsettings.py").write_text(DJANGO_SETTINGS.format(
        role=pooled_role, direct=postgres_server.port, txn=pgbouncer_transaction.port, sess=pgbouncer_session.port))
    (tmp_path / "run.py").write_text(DJANGO_RUN)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bsettings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), group], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = json.loads(lines[-1][len("RESULT "):])
    [(code, message)] = out["checks"]             # W004 for the session-scope engine on the transaction pooler only
    assert code == "django_ylock.W004" and message.startswith("YLOCK engine 'txn': a connection pooler in transaction")
    assert "PgBouncer" in out["txn"] and "?scope=transaction" in out["txn"]
    assert out["txn_xact"] == out["sess"] == out["direct"] == "locked"
    assert_nothing_left(pgbouncer_transaction, observer, clean)
    assert_nothing_left(pgbouncer_session, observer, clean)
