"""Fixtures of the PostgreSQL engine's tests: engines built with options (closed after the
test), an observer connection that reads pg_locks, and the backends of lock owners."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import ylock
from tests.helpers import wait_until
from ylock.testing.postgres import PostgresServer

_figures: list[tuple[str, str]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.section("ylock PostgreSQL figures")
        for test, text in _figures:
            terminalreporter.write_line(f"{test}: {text}")


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Note a measured figure (printed at the end of the run, for the README)."""
    def note(text: str) -> None:
        _figures.append((request.node.name, text))
    return note


@pytest.fixture
def make_engine(postgres_server: PostgresServer) -> Iterator[Callable[..., Any]]:
    """Build PostgreSQL engines on the session's server (``url=`` another), closed after the test."""
    built: list[ylock.Engine] = []

    def make(url: str | None = None, **options: Any) -> Any:
        engine = ylock.engine_from_url(url or postgres_server.url, **options)
        built.append(engine)
        return engine
    yield make
    for engine in built:
        engine.close()


@pytest.fixture
def observer(postgres_server: PostgresServer) -> Iterator[psycopg.Connection[Any]]:
    with postgres_server.connect(application_name="observer") as conn:
        yield conn


def backend_of(observer: psycopg.Connection[Any], owner: str) -> int | None:
    """The pid of the backend that holds or waits for a lock as ``owner``."""
    row = observer.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                           ["%:" + owner[-50:]]).fetchone()
    return None if row is None else int(row[0])


def advisory_rows(observer: psycopg.Connection[Any], pids: list[int] | None = None) -> list[tuple[Any, ...]]:
    """(pid, mode, granted) of every advisory lock (of ``pids``), in queue order."""
    rows = observer.execute("SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' "
                            "ORDER BY granted DESC, waitstart NULLS FIRST").fetchall()
    return [r for r in rows if pids is None or r[0] in pids]


#: What pooled_backends() reads on each server backend: the settings ylock gives its lock
#: connections, and what else a session can leave behind.
STATE = ("SELECT pg_backend_pid(), current_setting('statement_timeout'), current_setting('lock_timeout'), "
         "current_setting('idle_session_timeout'), current_setting('idle_in_transaction_session_timeout'), "
         "current_setting('synchronous_commit'), current_setting('client_connection_check_interval'), "
         "(SELECT count(*) FROM pg_prepared_statements), "
         "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())")
STATE_NAMES = ("statement_timeout", "lock_timeout", "idle_session_timeout", "idle_in_transaction_session_timeout",
               "synchronous_commit", "client_connection_check_interval", "prepared",
               "advisory")


def pooled_backends(bouncer: Any, role: str) -> dict[int, dict[str, Any]]:
    """What every server backend of ``bouncer``'s pool for ``role`` carries (pid -> STATE_NAMES):
    as many clients as it has server connections each open a transaction (which pins one
    backend to each, so together they see them all) and read it."""
    def servers_of(busy: bool) -> set[int]:
        return {int(r["remote_pid"]) for r in bouncer.show("SERVERS")
                if r["user"] == role and (r["state"] != "idle") == busy}
    # Clients that closed are gone from the pooler a moment later, and a server session it
    # took back may be reset or checked first: wait until every one is idle (the test
    # closed its engines), so that the pinning clients are handed exactly those.
    wait_until(lambda: not servers_of(busy=True), what="every server session of the pool idle")
    servers = servers_of(busy=False)
    seen: dict[int, dict[str, Any]] = {}
    clients: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(len(servers) + 3):
            if servers <= set(seen):
                break
            conn = psycopg.connect(bouncer.url_for(role), autocommit=False, prepare_threshold=None,
                                   connect_timeout=10)
            clients.append(conn)
            row = conn.execute(STATE).fetchone()
            assert row is not None
            seen[int(row[0])] = dict(zip(STATE_NAMES, row[1:]))
    finally:
        for conn in clients:
            conn.rollback()
            conn.close()
    assert servers <= set(seen), f"server backends {servers} not all seen: {sorted(seen)}"
    return seen
