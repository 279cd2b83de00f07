"""Sentinel and Cluster over TLS: ``rediss+sentinel://`` (TLS to the sentinels and the
master alike) and ``rediss+cluster://``, against servers that require client certificates
(mutual TLS), with the TLS options in the URL."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

import ylock
from ylock.testing.redis import RedisCluster, RedisSentinel, TlsFiles, make_tls_files

HOLDER = """
import sys, ylock
engine = ylock.engine_from_url(sys.argv[1])
lock = ylock.Lock(engine, sys.argv[2], "n")
lock.lock(timeout=20)
print("held", lock.token, flush=True)
sys.stdin.readline()
lock.unlock()
print("released", flush=True)
"""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_sentinel(tls: TlsFiles) -> Iterator[RedisSentinel]:
    sentinel = RedisSentinel(tls=tls).start()
    yield sentinel
    sentinel.stop()


@pytest.fixture(scope="module")
def tls_cluster(tls: TlsFiles) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tls=tls).start()
    yield cluster
    cluster.stop()


def _url(base: str, tls: TlsFiles, **extra: str) -> str:
    return f"{base}?{urlencode({**tls.client_options(), **extra})}"


def _handoff_between_processes(url: str, group: str) -> None:
    """Another process holds the lock over TLS; this one waits for it and gets it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, group], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        held = holder.stdout.readline().split()
        assert held[0] == "held", held
        engine = ylock.engine_from_url(url)
        lock = ylock.Lock(engine, group, "n")
        assert lock.try_lock() is False
        assert [i.owners for i in engine.describe(group)] != []
        holder.stdin.write("\n")
        holder.stdin.flush()
        lock.lock(timeout=20)                 # handed over by the other process's release
        assert lock.token > int(held[1])
        lock.unlock()
        engine.close()
        assert holder.wait(20) == 0
    finally:
        if holder.poll() is None:
            holder.kill()


def test_sentinel_over_tls(tls_sentinel: RedisSentinel, tls: TlsFiles, group: str) -> None:
    url = _url(tls_sentinel.tls_url, tls)
    _handoff_between_processes(url, group)
    engine = ylock.engine_from_url(url)

    async def take() -> int | None:
        lock = ylock.Lock(engine, group, "async")
        await lock.alock(timeout=5)
        token = lock.token
        await lock.aunlock()
        return token
    assert asyncio.run(take())
    # A failover: the replica, reached over TLS, becomes the master the sentinels name.
    lock = ylock.Lock(engine, group, "after-failover")
    tls_sentinel.failover()
    lock.lock(timeout=20)
    assert lock.held()
    lock.unlock()
    engine.close()


def test_sentinel_over_tls_refuses_without_the_client_certificate(tls_sentinel: RedisSentinel, tls: TlsFiles,
                                                                  group: str) -> None:
    no_cert = f"{tls_sentinel.tls_url}?{urlencode({'ssl_ca_certs': str(tls.ca)})}"
    with pytest.raises(ylock.EngineUnavailable):
        ylock.Lock(ylock.engine_from_url(no_cert), group, "n").try_lock()
    with pytest.raises(ylock.EngineUnavailable):    # and plain text to a TLS port fails too
        ylock.Lock(ylock.engine_from_url(tls_sentinel.tls_url.replace("rediss+", "redis+")), group, "n").try_lock()


def test_cluster_over_tls(tls_cluster: RedisCluster, tls: TlsFiles, group: str) -> None:
    url = _url(tls_cluster.tls_url, tls)
    _handoff_between_processes(url, group)
    engine = ylock.engine_from_url(url)
    names = [f"n{i}" for i in range(6)]            # spread over the nodes' slots
    for name in names:
        with ylock.Lock(engine, group, name):
            pass
    sem = ylock.Semaphore(engine, group, "s", permits=2)
    with sem:
        assert [i.name for i in engine.describe(group)] == ["s"]
    engine.close()
    untrusted = ylock.engine_from_url(tls_cluster.tls_url)
    with pytest.raises(ylock.EngineUnavailable):
        ylock.Lock(untrusted, group, "n").try_lock()


def test_tls_options_in_urls_are_checked(tls: TlsFiles) -> None:
    with pytest.raises(ylock.ConfigurationError, match="TLS options need a rediss\\+sentinel"):
        ylock.engine_from_url(f"redis+sentinel://127.0.0.1:1/m?ssl_ca_certs={tls.ca}")
    with pytest.raises(ylock.ConfigurationError, match="ssl_bogus"):
        ylock.engine_from_url("rediss+cluster://127.0.0.1:1?ssl_bogus=1")
    with pytest.raises(ylock.ConfigurationError, match="ssl_check_hostname"):
        ylock.engine_from_url("rediss+sentinel://127.0.0.1:1/m?ssl_check_hostname=maybe")
    engine = ylock.engine_from_url(f"rediss+sentinel://u:secret@127.0.0.1:1/m?ssl_ca_certs={Path(tls.ca)}")
    assert "secret" not in engine.url_for_display() and "secret" not in repr(engine)
