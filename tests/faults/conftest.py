"""Fixtures of the fault tests: servers of their own (these tests freeze, restart and cut
them off), fault proxies, engines closed after each test, the journal of holds that every
test checks exclusion with (:class:`tests.faults.Journal`), the logs of the servers a test
used in its failure report, and the figures that the README's Guarantees table quotes,
printed at the end of the run ("ylock fault figures")."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ylock
from tests.faults import Journal
from tests.faults.workers import Checkers
from ylock.testing.mariadb import MariaDBServer
from ylock.testing.proxy import TcpProxy
from ylock.testing.redis import RedisServer
from ylock.testing.zookeeper import ZooKeeperServer

_figures: list[tuple[str, str]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.section("ylock fault figures")
        for test, text in _figures:
            terminalreporter.write_line(f"{test}: {text}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        titles = {title for title, _ in report.sections}
        for value in getattr(item, "funcargs", {}).values():
            title = f"server log: {value!r}"
            if hasattr(value, "read_log") and title not in titles:
                report.sections.append((title, value.read_log()))


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Note a measured figure; they are all printed at the end of the run."""
    def note(text: str) -> None:
        _figures.append((request.node.name, text))
    return note


# -- servers and engines ------------------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, in memory only (a restart loses every key)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def persistent_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own that keeps every acknowledged write across a restart."""
    server = RedisServer(persistent=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server of this module's own (its tests restart and freeze it); each test
    works under a chroot of its own and leaves the server running and unfrozen."""
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def own_mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB of the fault tests' own (they restart and pause it); each test leaves it
    running and unfrozen."""
    server = MariaDBServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def proxy_to() -> Iterator[Callable[[int], TcpProxy]]:
    """Start a fault proxy in front of a port; stopped after the test."""
    proxies: list[TcpProxy] = []

    def start(port: int) -> TcpProxy:
        proxies.append(TcpProxy(port).start())
        return proxies[-1]
    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def engines() -> Iterator[Callable[..., ylock.Engine]]:
    """Build engines from URLs (each with its own connections or session); closed after the test."""
    built: list[ylock.Engine] = []

    def make(url: str, **options: Any) -> ylock.Engine:
        built.append(ylock.engine_from_url(url, **options))
        return built[-1]
    yield make
    for engine in built:
        engine.close()


@pytest.fixture
def journal(tmp_path: Any) -> Journal:
    """The fenced register, the unfenced counter and the journal of holds of this test."""
    return Journal(Checkers(tmp_path))


