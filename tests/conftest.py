"""Fixtures shared by every test: real servers (session-scoped, free loopback ports),
engines, a unique group per test, and server logs attached to failing tests' reports.

The contract suite takes the ``engine`` fixture, parametrised over CONTRACT_ENGINES: each
entry ``X`` names a fixture ``X_engine``. A missing server is a failure, never a skip.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

import ylock
from ylock.holds import HOLDS
from ylock.testing.mariadb import MariaDBServer
from ylock.testing.pgbouncer import PgBouncer
from ylock.testing.postgres import PostgresServer
from ylock.testing.redis import RedisCluster, RedisSentinel, RedisServer
from ylock.testing.zookeeper import ZooKeeperEnsemble, ZooKeeperServer

CONTRACT_ENGINES = ["local", "redis", "redis_cluster", "redis_sentinel", "zookeeper", "zookeeper_ensemble", "postgres",
                    "mysql"]

_S = TypeVar("_S")
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


def _serving(server: _S, stop: Callable[[_S], None] = lambda server: server.stop()) -> Iterator[_S]:
    """A started server for the session: its log goes into failing tests' reports; at the
    end the holds tests left are forgotten (see below), then it is stopped."""
    _servers.append(server)
    yield server
    _servers.remove(server)
    _forget_leftover_holds()
    stop(server)


def _engine(url: str) -> Iterator[ylock.Engine]:
    engine = ylock.engine_from_url(url)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _serving(RedisServer().start())


@pytest.fixture
def redis_engine(redis_server: RedisServer) -> Iterator[ylock.Engine]:
    yield from _engine(redis_server.url)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    yield from _serving(RedisCluster(3).start())


@pytest.fixture
def redis_cluster_engine(redis_cluster: RedisCluster) -> Iterator[ylock.Engine]:
    yield from _engine(redis_cluster.url)


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinel]:
    yield from _serving(RedisSentinel().start())


@pytest.fixture
def redis_sentinel_engine(redis_sentinel: RedisSentinel) -> Iterator[ylock.Engine]:
    yield from _engine(redis_sentinel.url)


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    yield from _serving(ZooKeeperServer().start())


@pytest.fixture
def zookeeper_engine(zookeeper_server: ZooKeeperServer) -> Iterator[ylock.Engine]:
    yield from _engine(zookeeper_server.url("/contract") + "?session_timeout=4")


@pytest.fixture(scope="session")
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    yield from _serving(ZooKeeperEnsemble(3).start())


@pytest.fixture
def zookeeper_ensemble_engine(zookeeper_ensemble: ZooKeeperEnsemble) -> Iterator[ylock.Engine]:
    yield from _engine(zookeeper_ensemble.url("/contract") + "?session_timeout=4")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from _serving(PostgresServer().start(), lambda server: server.cleanup())


@pytest.fixture
def postgres_engine(postgres_server: PostgresServer) -> Iterator[ylock.Engine]:
    yield from _engine(postgres_server.url)


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    yield from _serving(MariaDBServer().start(), lambda server: server.cleanup())


@pytest.fixture
def mysql_engine(mariadb_server: MariaDBServer) -> Iterator[ylock.Engine]:
    yield from _engine(mariadb_server.url)


#: A role of the test PostgreSQL server whose own defaults differ from every setting ylock
#: gives its lock connections, so a setting ylock left on a pooled backend shows.
POOLED_ROLE = "ylock_pooled"
POOLED_ROLE_DEFAULTS = {"statement_timeout": "17s", "lock_timeout": "13s", "idle_session_timeout": "1h",
                        "idle_in_transaction_session_timeout": "2h", "synchronous_commit": "local",
                        "client_connection_check_interval": "0", "tcp_keepalives_idle": "0"}


@pytest.fixture(scope="session")
def pooled_role(postgres_server: PostgresServer) -> str:
    """:data:`POOLED_ROLE`, created (a superuser, with :data:`POOLED_ROLE_DEFAULTS`)."""
    with postgres_server.connect() as conn:
        conn.execute(f"DO $$ BEGIN CREATE ROLE {POOLED_ROLE} LOGIN SUPERUSER; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        for name, value in POOLED_ROLE_DEFAULTS.items():
            conn.execute(f"ALTER ROLE {POOLED_ROLE} SET {name} = '{value}'")
    return POOLED_ROLE


def _bouncer(server: PostgresServer, mode: str, **options: object) -> Iterator[PgBouncer]:
    yield from _serving(PgBouncer(server, mode, users=(POOLED_ROLE,), **options).start(),  # type: ignore[arg-type]
                        lambda bouncer: bouncer.cleanup())


@pytest.fixture(scope="session")
def pgbouncer_transaction(postgres_server: PostgresServer, pooled_role: str) -> Iterator[PgBouncer]:
    """Debian's PgBouncer in transaction mode in front of the session's PostgreSQL (through
    its unix socket, as a pooler on the database's machine)."""
    yield from _bouncer(postgres_server, "transaction")


@pytest.fixture(scope="session")
def pgbouncer_session(postgres_server: PostgresServer, pooled_role: str) -> Iterator[PgBouncer]:
    """PgBouncer in session mode (over TCP), as configured by default: ``server_reset_query``
    ``DISCARD ALL`` when a client leaves."""
    yield from _bouncer(postgres_server, "session", via="tcp")


@pytest.fixture(scope="session")
def pgbouncer_session_noreset(postgres_server: PostgresServer, pooled_role: str) -> Iterator[PgBouncer]:
    """PgBouncer in session mode with ``server_reset_query`` turned off: what a client leaves
    on its server session goes to the next client (so whatever ylock leaves shows)."""
    yield from _bouncer(postgres_server, "session", via="tcp", settings={"server_reset_query": ""})


@pytest.fixture(scope="session")
def pgbouncer_statement(postgres_server: PostgresServer, pooled_role: str) -> Iterator[PgBouncer]:
    """PgBouncer in statement mode: it refuses transactions."""
    yield from _bouncer(postgres_server, "statement")
