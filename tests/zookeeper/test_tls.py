"""ZooKeeper over TLS (issue #25, item 2), against a TLS-only server this module starts
(:class:`ylock.testing.zookeeper_tls.TlsZooKeeperServer`: Netty, ``secureClientPort`` only,
client certificates required): the URL's ``tls``, ``ca``, ``certfile``, ``keyfile`` and
``verify_certs`` reach kazoo; a client that cannot complete the handshake gets
EngineUnavailable that says why, within its connect timeout."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import ylock
from ylock.testing.zookeeper_tls import TlsZooKeeperServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsZooKeeperServer]:
    server = TlsZooKeeperServer(client_auth="need").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def engines() -> Iterator[list[ylock.Engine]]:
    built: list[ylock.Engine] = []
    yield built
    for engine in built:
        engine.close()


def elsewhere(call: Callable[[], Any]) -> Any:
    """Run ``call`` in another thread (another owner) and return its result or raise its error."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(30)


def _engine(engines: list[ylock.Engine], url: str) -> ylock.Engine:
    engines.append(ylock.engine_from_url(url))
    return engines[-1]


def test_mutual_tls_locks_and_describes(tls_server, engines, group):
    a = _engine(engines, tls_server.url(f"/{group}"))
    b = _engine(engines, tls_server.url(f"/{group}"))
    lock = ylock.Lock(a, group, "n")
    lock.lock(timeout=10)
    assert not elsewhere(lambda: ylock.Lock(b, group, "n").try_lock(timeout=0.2))
    assert [i.name for i in b.describe(group)] == ["n"]
    lock.unlock()
    assert ylock.Lock(b, group, "n").try_lock(timeout=5)


def test_credentials_and_acl_over_tls(tls_server, engines, group):
    """Digest credentials travel inside TLS; the ACL holds as in plaintext."""
    url = tls_server.url(f"/{group}").replace("zookeeper://", "zookeeper://alice:secret@")
    lock = ylock.Lock(_engine(engines, url), group, "n")
    lock.lock(timeout=10)
    stranger = _engine(engines, tls_server.url(f"/{group}"))
    with pytest.raises(ylock.LockError, match="NoAuth"):
        elsewhere(lambda: ylock.Lock(stranger, group, "n").try_lock(timeout=1))
    lock.unlock()


@pytest.mark.parametrize("how", ["no client certificate", "another CA", "plaintext", "wrong host name"])
def test_a_client_that_cannot_complete_the_handshake_is_unavailable(tls_server, engines, group, how):
    if how == "no client certificate":
        url = tls_server.url(f"/{group}", client_cert=False)
    elif how == "another CA":
        url = tls_server.url(f"/{group}").replace(f"ca={tls_server.certs.ca}", f"ca={tls_server.certs.other_ca}")
    elif how == "wrong host name":        # the certificate names 127.0.0.1 only
        url = tls_server.url(f"/{group}").replace("127.0.0.1", "localhost")
    else:
        url = f"zookeeper://{tls_server.hosts}/{group}"
    engine = _engine(engines, url + ("&" if "?" in url else "?") + "connect_timeout=2")
    started = time.monotonic()
    with pytest.raises(ylock.EngineUnavailable) as refused:
        ylock.Lock(engine, group, "n").lock(timeout=5)
    assert time.monotonic() - started < 2 + 1.5
    if how in ("no client certificate", "another CA"):      # kazoo's handshake error is in the message
        assert "SSL" in str(refused.value) or "certificate" in str(refused.value), refused.value


def test_verify_certs_off_accepts_an_unknown_ca(tls_server, engines, group):
    """``verify_certs=0`` (never in production; it also turns ``check_hostname`` off): the
    server's certificate is not checked, so a wrong CA still connects; the default refuses
    it (previous test)."""
    url = tls_server.url(f"/{group}").replace(f"ca={tls_server.certs.ca}", f"ca={tls_server.certs.other_ca}")
    lock = ylock.Lock(_engine(engines, url + "&verify_certs=0"), group, "n")
    assert lock.try_lock(timeout=10)
    lock.unlock()


@pytest.mark.parametrize(("query", "message"), [
    ("ca=/no/such/ca.pem", "ca: no such file"),
    ("tls=1&certfile=/no/such/cert.pem", "certfile: no such file"),
    ("tls=maybe", "tls=.* is invalid"),
])
def test_tls_options_are_checked(query, message):
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?{query}")


def test_tls_file_options_need_tls_and_a_certificate_for_a_key(tls_server):
    certs = tls_server.certs
    with pytest.raises(ylock.ConfigurationError, match="need tls=1"):
        ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?tls=0&ca={certs.ca}")
    for only in (f"keyfile={certs.client_key}", f"certfile={certs.client_cert}"):
        with pytest.raises(ylock.ConfigurationError, match="certfile and keyfile go together"):
            ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?{only}")
    with pytest.raises(ylock.ConfigurationError, match="check_hostname=1 needs verify_certs=1"):
        ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?ca={certs.ca}&verify_certs=0&check_hostname=1")
    engine = ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?ca={certs.ca}")   # a CA implies TLS
    assert engine.settings.tls and engine.settings.tls_options()["ca"] == certs.ca
    assert engine.settings.check_hostname                                            # by default


def test_check_hostname_off_accepts_a_name_the_certificate_lacks(tls_server, engines, group):
    """The same "localhost" URL that fails its host name check above connects with
    ``check_hostname=0`` (the certificate is still checked against the CA)."""
    url = tls_server.url(f"/{group}").replace("127.0.0.1", "localhost")
    lock = ylock.Lock(_engine(engines, url + "&check_hostname=0&connect_timeout=5"), group, "n")
    assert lock.try_lock(timeout=10)
    lock.unlock()
