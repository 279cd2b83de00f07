"""ZooKeeper ACLs from the URL's credentials (issue #25, item 1), on the suite's real server:
with ``zookeeper://user:password@...`` every node ylock creates is the creator's only
(``acl=creator``, the default), readable by anyone but changed by the creator only
(``acl=read``), or open (``acl=open``). Another client, without credentials or with other
ones, cannot delete a holder's node nor queue on a lock; an engine with the same
credentials describes and force-releases as before."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError

import ylock
from tests.helpers import wait_until


@pytest.fixture
def raw() -> Iterator[list[KazooClient]]:
    """Plain kazoo clients (another application's, an operator's tool); closed after the test."""
    clients: list[KazooClient] = []
    yield clients
    for client in clients:
        client.stop()
        client.close()


def _kazoo(hosts: str, clients: list[KazooClient], auth: str | None = None) -> KazooClient:
    client = KazooClient(hosts=hosts, auth_data=[("digest", auth)] if auth else None)
    client.start(timeout=10)
    clients.append(client)
    return client


@pytest.fixture
def owned(zookeeper_server, group) -> Iterator[tuple[str, list[ylock.Engine]]]:
    """The chroot of this test and the engines it builds (closed after it)."""
    engines: list[ylock.Engine] = []
    yield f"/{group}", engines
    for engine in engines:
        engine.close()


def _engine(engines: list[ylock.Engine], url: str) -> ylock.Engine:
    engines.append(ylock.engine_from_url(url + ("&" if "?" in url else "?") + "connect_timeout=5"))
    return engines[-1]


def _holder_node(zookeeper_server, raw, chroot: str, group: str, name: str) -> str:
    """The path of the holder's node, as the owner's credentials see it."""
    admin = _kazoo(zookeeper_server.hosts + chroot, raw, "alice:secret")
    lockpath = f"/ylock/{group}/{name}"
    children = admin.get_children(lockpath)
    assert len(children) == 1, children
    return f"{lockpath}/{children[0]}"


def test_creator_only_by_default(zookeeper_server, owned, raw, group):
    chroot, engines = owned
    url = f"zookeeper://alice:secret@{zookeeper_server.hosts}{chroot}"
    lock = ylock.Lock(_engine(engines, url), group, "n")
    lock.lock()
    node = _holder_node(zookeeper_server, raw, chroot, group, "n")
    acls, _ = raw[0].get_acls(node)                          # raw[0]: authenticated as alice
    assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [("digest", "alice", 31)]
    anonymous = _kazoo(zookeeper_server.hosts + chroot, raw)
    with pytest.raises(NoAuthError):
        anonymous.delete(node)                               # the holder's node stays
    with pytest.raises(NoAuthError):
        anonymous.get_children(f"/ylock/{group}/n")          # not even readable
    with pytest.raises(NoAuthError):
        anonymous.create(f"/ylock/{group}/n/w-intruder-", ephemeral=True, sequence=True)
    # An engine without credentials cannot take a lock in the group, on the held name or a new one.
    stranger = _engine(engines, f"zookeeper://{zookeeper_server.hosts}{chroot}")
    for name in ("n", "other"):
        with pytest.raises(ylock.LockError, match="refused a client without credentials") as refused:
            ylock.Lock(stranger, group, name).try_lock(timeout=1)
        assert not isinstance(refused.value, KazooException) and isinstance(refused.value.__cause__, NoAuthError)
    # Another user: a clear error that names the user, never the password.
    mallory = _engine(engines, f"zookeeper://mallory:hunter2@{zookeeper_server.hosts}{chroot}")
    with pytest.raises(ylock.LockError, match="refused user 'mallory'") as refused:
        ylock.Lock(mallory, group, "n").try_lock(timeout=1)
    assert "hunter2" not in str(refused.value) and "secret" not in str(refused.value)
    # The same credentials, in another engine: describe and force-release work.
    operator = _engine(engines, url)
    info = {i.name: i for i in operator.describe(group)}
    assert info["n"].mode == "write" and len(info["n"].owners) == 1
    assert operator.force_release(group, "n") is True
    _lost_soon(lock)
    with pytest.raises(ylock.LockLost):
        lock.unlock()
    assert lock.try_lock(timeout=5)
    lock.unlock()


def _lost_soon(lock: ylock.Lock) -> None:
    wait_until(lambda: lock.lost, timeout=5, what="the hold reported lost")


def test_read_lets_anyone_list_but_not_change(zookeeper_server, owned, raw, group):
    chroot, engines = owned
    url = f"zookeeper://alice:secret@{zookeeper_server.hosts}{chroot}?acl=read"
    lock = ylock.Lock(_engine(engines, url), group, "n")
    lock.lock()
    node = _holder_node(zookeeper_server, raw, chroot, group, "n")
    acls, _ = raw[0].get_acls(node)
    assert sorted((a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls) == \
        [("digest", "alice", 31), ("world", "anyone", 1)]
    tool = _kazoo(zookeeper_server.hosts + chroot, raw)           # an operator's tool, no credentials
    assert tool.get_children(f"/ylock/{group}/n") == [node.rsplit("/", 1)[1]]
    assert tool.get(node)[1].czxid == lock.token
    with pytest.raises(NoAuthError):
        tool.delete(node)
    with pytest.raises(NoAuthError):
        tool.create(f"/ylock/{group}/n/w-intruder-", ephemeral=True, sequence=True)
    reader = _engine(engines, f"zookeeper://{zookeeper_server.hosts}{chroot}")
    assert [i.name for i in reader.describe(group)] == ["n"]   # ylock's own listing works too
    with pytest.raises(ylock.LockError, match="NoAuth"):
        ylock.Lock(reader, group, "n").try_lock(timeout=1)
    lock.unlock()


def test_open_lets_anyone_do_anything(zookeeper_server, owned, raw, group):
    """``acl=open`` with credentials: the nodes are world-writable (the behaviour before)."""
    chroot, engines = owned
    lock = ylock.Lock(_engine(engines, f"zookeeper://alice:secret@{zookeeper_server.hosts}{chroot}?acl=open"),
                      group, "n")
    lock.lock()
    node = _holder_node(zookeeper_server, raw, chroot, group, "n")
    _kazoo(zookeeper_server.hosts + chroot, raw).delete(node)
    _lost_soon(lock)
    with pytest.raises(ylock.LockLost):
        lock.unlock()


@pytest.mark.parametrize("query", ["acl=creator", "acl=read"])
def test_an_acl_needs_credentials(query):
    with pytest.raises(ylock.ConfigurationError, match=f"{query} needs credentials"):
        ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?{query}")


def test_an_unknown_acl_is_refused_by_name():
    with pytest.raises(ylock.ConfigurationError, match="acl must be one of"):
        ylock.engine_from_url("zookeeper://u:p@127.0.0.1:2181/x?acl=everyone")
