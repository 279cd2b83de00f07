"""Fixtures shared by every test: real servers (session-scoped, free loopback ports),
engines, a unique group per test, and server logs attached to failing tests' reports.

The contract suite takes the ``engine`` fixture, parametrised over CONTRACT_ENGINES: each
entry ``X`` names a fixture ``X_engine``. A missing server is a failure, never a skip.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import ylock
from ylock.holds import HOLDS
from ylock.testing.postgres import PostgresServer
from ylock.testing.redis import RedisCluster, RedisSentinel, RedisServer
from ylock.testing.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

CONTRACT_ENGINES = ["local", "redis", "redis_cluster", "redis_sentinel", "zookeeper", "zookeeper_ensemble", "postgres"]

_servers: list[object] = []   # whatever has a read_log(), for failure reports


def _forget_leftover_holds() -> None:
    """At the end of the session, before a shared server stops: forget the holds some tests
    left behind (their groups are their own; their keys expire by their lease), so that the
    renewal thread does not retry them against a stopped server for the rest of the run and
    the release at exit does not wait on it."""
    for hold in HOLDS.holds():
        HOLDS.remove(hold)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for server in _servers:
            report.sections.append((f"server log: {server!r}", server.read_log()))  # type: ignore[attr-defined]


@pytest.fixture
def group() -> str:
    """A lock group no other test uses."""
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(params=CONTRACT_ENGINES)
def engine(request: pytest.FixtureRequest) -> ylock.Engine:
    """Every engine of the contract suite, in turn."""
    return request.getfixturevalue(f"{request.param}_engine")  # type: ignore[no-any-return]


@pytest.fixture
def local_engine() -> ylock.Engine:
    return ylock.engine_from_url("local://")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    _servers.append(server)
    yield server
    _servers.remove(server)
    _forget_leftover_holds()
    server.stop()


@pytest.fixture
def redis_engine(redis_server: RedisServer) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(redis_server.url)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster(3).start()
    _servers.append(cluster)
    yield cluster
    _servers.remove(cluster)
    _forget_leftover_holds()
    cluster.stop()


@pytest.fixture
def redis_cluster_engine(redis_cluster: RedisCluster) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(redis_cluster.url)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    sentinel = RedisSentinel().start()
    _servers.append(sentinel)
    yield sentinel
    _servers.remove(sentinel)
    _forget_leftover_holds()
    sentinel.stop()


@pytest.fixture
def redis_sentinel_engine(redis_sentinel: RedisSentinel) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(redis_sentinel.url)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer().start()
    _servers.append(server)
    yield server
    _servers.remove(server)
    _forget_leftover_holds()
    server.stop()


@pytest.fixture
def zookeeper_engine(zookeeper_server: ZooKeeperServer) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(zookeeper_server.url("/contract") + "?session_timeout=4")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    ensemble = ZooKeeperEnsemble(3).start()
    _servers.append(ensemble)
    yield ensemble
    _servers.remove(ensemble)
    _forget_leftover_holds()
    ensemble.stop()


@pytest.fixture
def zookeeper_ensemble_engine(zookeeper_ensemble: ZooKeeperEnsemble) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(zookeeper_ensemble.url("/contract") + "?session_timeout=4")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    _servers.append(server)
    yield server
    _servers.remove(server)
    _forget_leftover_holds()
    server.cleanup()


@pytest.fixture
def postgres_engine(postgres_server: PostgresServer) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(postgres_server.url)
    yield engine
    engine.close()
