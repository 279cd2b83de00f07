"""Faults that are the same test on both SQL engines (PostgreSQL and MariaDB, the engines
whose holds live in a server session): processes racing for one counter lose no update
(the control without the lock does), and a server restart loses the holds, is told to
their holders, and the engine recovers with tokens that keep rising. What differs stays in
test_postgres.py and test_mysql.py."""
from __future__ import annotations

import time

import pytest

import ylock
from tests.faults import run_counter
from tests.helpers import expect_event
from ylock import events
from ylock.testing.fencing import UnfencedCounter

pytestmark = pytest.mark.slow

#: Each engine's server fixtures: the session's (shared), and one that a test may restart
#: (the session's PostgreSQL restarts cleanly; MariaDB's is the fault tests' own).
SERVERS = {"postgres": ("postgres_server", "postgres_server"), "mariadb": ("mariadb_server", "own_mariadb")}
#: How a restart goes (each server's restart() default) and how soon the holder is told.
RESTARTS = {"postgres": ("server restart", 5.0), "mariadb": ("server killed and restarted", 10.0)}


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_processes_lose_no_update(request, server, group, tmp_path):
    url = request.getfixturevalue(SERVERS[server][0]).url
    path = str(tmp_path / "counter.json")
    tokens = run_counter(url, group, path, 4, 25, use_lock=True)
    counter = UnfencedCounter(path)
    assert counter.increments == 100 and counter.lost == 0 and counter.value == 100
    assert len(set(tokens)) == 100                       # every hold had its own token
    # The control: the same work without the lock loses updates, so the counter catches a broken lock.
    control = str(tmp_path / "control.json")
    run_counter(url, group, control, 4, 25, use_lock=False)
    assert UnfencedCounter(control).lost > 0


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_server_restart_loses_holds_tokens_rise_and_the_engine_recovers(request, server, engines, group, figures):
    """PostgreSQL: a fast shutdown; MariaDB: SIGKILL, a crash of the server. Either way the
    hold is lost and its holder told, a stale pooled connection is replaced, and the next
    token is above the lost hold's (PostgreSQL's sequence, InnoDB's AUTO_INCREMENT)."""
    restartable = request.getfixturevalue(SERVERS[server][1])
    how, told_within = RESTARTS[server]
    engine = engines(restartable.url)
    lost = expect_event(events.LOST, group)
    holder = ylock.Lock(engine, group, "n", lease=1.5)
    holder.lock()
    before = holder.token
    with ylock.Lock(engine, group, "pooled").write(timeout=5):
        pass                                              # leaves an idle connection in the pool
    restarted = time.monotonic()
    restartable.restart()
    assert lost.wait(told_within), "the restart did not make the hold lost"
    figures(f"{how}: holder told lost after {time.monotonic() - restarted:.2f} s (lease 1.5 s)")
    with pytest.raises(ylock.LockLost):
        holder.unlock()
    again = ylock.Lock(engine, group, "n")
    assert again.try_lock(5)                              # stale pooled connections are replaced
    assert again.token is not None and before is not None
    assert again.token > before                           # the token sequence survived the restart
    again.unlock()
