"""The engine's kazoo handler (ylock.engines.zookeeper.handler.Handler): its select answers as
kazoo's own does, the engine's watches run in kazoo's connection thread, and nothing else
does (a user's watch on ``engine.client``, a "lost" event's subscribers), so either may
block or call kazoo synchronously without stopping the connection."""
from __future__ import annotations

import socket
import threading

import pytest
from kazoo.handlers.threading import SequentialThreadingHandler

import ylock
from tests.helpers import wait_until, waiters
from ylock import events
from ylock.engines.zookeeper.handler import Handler


@pytest.fixture
def sockets():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_select_answers_as_kazoos_own(sockets):
    a, b = sockets
    ours, theirs = Handler(), SequentialThreadingHandler()
    cases = [([a], [], 0.01), ([], [a], 0.01), ([b, a], [], 0.01)]
    before = [theirs.select(r, w, [], t) for r, w, t in cases]
    assert before == [([], [], []), ([], [a], []), ([], [], [])]
    assert [ours.select(r, w, [], t) for r, w, t in cases] == before
    b.send(b"x")                                       # a is readable now
    cases.append(([a], [], None))
    after = [theirs.select(r, w, [], t) for r, w, t in cases]
    assert after[0] == ([a], [], []) and after[2] == ([a], [], [])
    assert [ours.select(r, w, [], t) for r, w, t in cases] == after
    b.close()                                          # a hung-up peer: readable (recv says so)
    assert ours.select([a], [], [], 0.01) == theirs.select([a], [], [], 0.01) == ([a], [], [])
    a.close()                                          # a closed socket: kazoo's own error
    for handler in (ours, theirs):
        with pytest.raises(TypeError):
            handler.select([a], [], [], 0.01)


def test_a_users_watch_runs_off_the_connection_thread(zookeeper_engine, group):
    """A watch set through engine.client that calls kazoo synchronously (which would
    deadlock in the connection thread) completes."""
    zookeeper_engine.ping()                            # connected
    client = zookeeper_engine.client
    path = f"/user-watch-{group}"
    client.ensure_path(path)
    seen: list[object] = []
    done = threading.Event()

    def watch(event: object) -> None:
        seen.append((threading.current_thread().name, client.exists(path) is not None))
        done.set()
    client.get(path, watch=watch)
    client.set(path, b"changed")
    assert done.wait(10), "the user's watch did not complete"
    assert seen[0][1] is True and "zk_loop" not in seen[0][0]
    client.delete(path)


def test_a_loss_is_reported_off_the_connection_thread(zookeeper_server, zookeeper_engine, group):
    """The force-release is seen by the holder's watch on its own node (set once a waiter
    queued) in kazoo's connection thread; the "lost" event's subscribers run elsewhere, so
    one that calls kazoo synchronously works."""
    other = ylock.engine_from_url(zookeeper_server.url("/contract"))
    lock = ylock.Lock(zookeeper_engine, group, "n")
    answered: list[object] = []

    def on_lost(event: events.Event) -> None:
        if event.kind == events.LOST and event.group == group:
            answered.append((threading.current_thread().name, zookeeper_engine.client.exists("/") is not None))
    events.subscribe(on_lost)
    try:
        lock.lock()
        waiter = threading.Thread(target=_take_and_give_back, args=(other, group))
        waiter.start()
        wait_until(lambda: waiters(other, group, "n"), what="a waiter")
        assert other.force_release(group, "n") is True
        wait_until(lambda: lock.lost and answered, what="the loss, reported to a subscriber that calls kazoo")
        assert answered[0][1] is True and "zk_loop" not in str(answered[0][0])
        with pytest.raises(ylock.LockLost):
            lock.unlock()
        waiter.join(10)
    finally:
        events.unsubscribe(on_lost)
        other.close()


def _take_and_give_back(engine: ylock.Engine, group: str) -> None:
    """A waiter: dropped by the force-release, it queues again and gets the lock."""
    lock = ylock.Lock(engine, group, "n")
    if lock.try_lock(5):
        lock.unlock()
