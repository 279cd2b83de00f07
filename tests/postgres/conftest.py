"""Fixtures of the PostgreSQL engine's tests: engines built with options (closed after the
test), an observer connection that reads pg_locks, and the backends of lock owners."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import ylock
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
