"""The quorum guard of the ZooKeeper engine on a server of this module's own
(:mod:`ylock.engines.zookeeper.guard`): the negotiated session timeout it reckons with, a
frozen server making the holder lose its locks within half a session timeout (and its node
deleted once the session is back, so a lost hold neither goes on nor blocks others), the
strict ``suspended=lost`` mode, and the old ``suspended=wait``. The partition of a
follower from its quorum is in ``test_zookeeper_partition``."""
from __future__ import annotations

import time

import pytest

import ylock
from tests.faults import SLACK, owners
from tests.helpers import wait_until
from ylock.testing.zookeeper import four_letter

pytestmark = pytest.mark.slow


def _server_timeouts(port: int) -> list[float]:
    """The session timeouts (seconds) of the server's open connections, from ``cons``."""
    found = []
    for line in four_letter(port, "cons").splitlines():
        for field in line.replace("(", ",").replace(")", ",").split(","):
            if field.startswith("to="):
                found.append(int(field[3:]) / 1000)
    return found


@pytest.mark.parametrize(("asked", "granted"), [(0.1, 0.4), (3.0, 3.0), (100.0, 60.0)])
def test_the_guard_reckons_with_the_timeout_the_server_negotiated(zookeeper, engines, group, asked, granted):
    """The server's bounds are 400 ms and 60 s (ylock.testing's config): a timeout below or
    above them is changed, and the engine knows it, as the server's own ``cons`` says."""
    engine = engines(zookeeper.url(f"/{group}") + f"?session_timeout={asked:g}")
    assert engine.negotiated_session_timeout is None
    engine.ping()
    assert engine.negotiated_session_timeout == pytest.approx(granted)
    assert granted in [pytest.approx(t) for t in _server_timeouts(zookeeper.port)]


def test_a_frozen_server_makes_the_holder_lose_within_half_its_session(zookeeper, engines, group, figures):
    """The server is frozen (SIGSTOP): nothing answers the holder's syncs, so half its
    session timeout after the last answered one the hold is marked lost (flag, event,
    LockLost at release), though kazoo still calls the connection up. Resumed before the
    session timeout, the session lives on: the engine deletes its abandoned node, so the
    lock is free at once for another client."""
    session = 2.0
    holder = engines(zookeeper.url(f"/{group}") + f"?session_timeout={session:g}")
    other = engines(zookeeper.url(f"/{group}"))
    lock = ylock.Lock(holder, group, "n")
    lock.lock()
    lost: list[ylock.events.Event] = []
    ylock.events.subscribe(lambda e: lost.append(e) if e.kind == ylock.events.LOST and e.group == group else None)
    time.sleep(session / 3)          # a few syncs answered: the guard runs on its own rhythm
    zookeeper.pause()
    frozen = time.monotonic()
    try:
        wait_until(lambda: lock.lost, timeout=session, what="the hold marked lost")
        told = time.monotonic() - frozen
    finally:
        zookeeper.resume()
    # The last answered sync was sent at most one sync interval (T/6) and a reply before the freeze.
    assert session / 6 <= told <= session / 2 + SLACK, told
    assert lost and "quorum not heard" in (lost[0].detail or ""), lost
    with pytest.raises(ylock.LockLost):
        lock.unlock()
    # The session survived (resumed within its timeout): the abandoned node is deleted.
    wait_until(lambda: owners(other, group, "n") == ((), ()), timeout=10, what="the abandoned node deleted")
    taker = ylock.Lock(other, group, "n")
    assert taker.try_lock(timeout=5)
    taker.unlock()
    assert lock.try_lock(timeout=5) and not lock.lost       # the same engine locks again
    lock.unlock()
    figures(f"frozen server, {session:g} s session: holder told lost {told:.3f} s after the freeze")


def test_strict_mode_loses_the_holds_as_soon_as_the_connection_is_suspended(zookeeper, engines, proxy_to, group):
    """``suspended=lost``: the connection reset (a proxy cut) suspends it, and the hold is
    lost at once, long before the guard's half session timeout (5 s here); the node goes
    once the engine reconnects (to the same session)."""
    proxy = proxy_to(zookeeper.port)
    holder = engines(f"zookeeper://{proxy.address}/{group}?session_timeout=10&suspended=lost")
    other = engines(zookeeper.url(f"/{group}"))
    lock = ylock.Lock(holder, group, "n")
    lock.lock()
    cut = time.monotonic()
    proxy.cut()
    wait_until(lambda: lock.lost, timeout=5, what="the hold marked lost")
    assert time.monotonic() - cut < 1.0 + SLACK
    wait_until(lambda: owners(other, group, "n") == ((), ()), timeout=10, what="the abandoned node deleted")
    with pytest.raises(ylock.LockLost):
        lock.unlock()


def test_wait_mode_keeps_a_hold_across_a_short_silence(zookeeper, engines, proxy_to, group):
    """``suspended=wait`` (the behaviour before the guard, for a standalone server whose
    restarts keep sessions): a silence within the session timeout loses nothing; the guard
    (here with ``lost_after=0.25``: 2 s) loses the hold in the same silence."""
    proxy = proxy_to(zookeeper.port)
    url = f"zookeeper://{proxy.address}/{group}?session_timeout=8"
    waiting, guarded = engines(url + "&suspended=wait"), engines(url + "&lost_after=0.25")
    kept, dropped = ylock.Lock(waiting, group, "a"), ylock.Lock(guarded, group, "b")
    kept.lock()
    dropped.lock()
    proxy.drop()
    dropped_at = time.monotonic()
    wait_until(lambda: dropped.lost, timeout=4, what="the guarded hold lost")
    assert time.monotonic() - dropped_at <= 2 + SLACK
    assert not kept.lost
    proxy.heal()
    wait_until(lambda: waiting.client.connected, timeout=5, what="reconnected")
    kept.unlock()                    # no LockLost: the session and the hold lived on
    with pytest.raises(ylock.LockLost):
        dropped.unlock()


@pytest.mark.parametrize(("query", "message"), [
    ("suspended=never", "suspended must be one of 'guard', 'lost', 'wait'"),
    ("lost_after=0.9", "lost_after must be a number"),
    ("lost_after=0", "lost_after must be a number"),
])
def test_guard_options_are_checked(query, message):
    with pytest.raises(ylock.ConfigurationError, match=message):
        ylock.engine_from_url(f"zookeeper://127.0.0.1:2181/x?{query}")
