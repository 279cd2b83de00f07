"""The handoff shortcut of the ZooKeeper engine (``_wait`` in ylock.engines.zookeeper.engine):
a waiter whose only blocker was deleted takes the lock without reading the children again,
and only then. Each lock below is taken from its own thread (its own owner)."""
from __future__ import annotations

import threading

import ylock
from tests.helpers import Runner, wait_until, waiters


class Owner:
    """One thread holding a ylock.Lock on request (the owner of a hold is its thread)."""

    def __init__(self, engine: ylock.Engine, group: str, name: str) -> None:
        self.lock = ylock.Lock(engine, group, name)
        self.orders: list[tuple[str, float]] = []
        self.results: list[object] = []
        self.ready = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            with self.ready:
                self.ready.wait_for(lambda: self.orders)
                verb, timeout = self.orders.pop(0)
            if verb == "stop":
                return
            try:
                result: object = self.lock.try_lock(timeout) if verb == "try" else self.lock.unlock()
            except Exception as exc:   # noqa: BLE001 - handed to the test
                result = exc
            with self.ready:
                self.results.append(result)
                self.ready.notify_all()

    def ask(self, verb: str, timeout: float = 0.0) -> None:
        with self.ready:
            self.orders.append((verb, timeout))
            self.ready.notify_all()

    def answer(self) -> object:
        with self.ready:
            assert self.ready.wait_for(lambda: self.results, timeout=15), "no answer"
            return self.results.pop(0)

    def do(self, verb: str, timeout: float = 0.0) -> object:
        self.ask(verb, timeout)
        return self.answer()


def test_a_stale_deletion_does_not_let_a_later_attempt_skip_the_check(zookeeper_engine, group):
    holder, a, other = (Owner(zookeeper_engine, group, "stale") for _ in range(3))
    assert holder.do("try") is True
    assert a.do("try", 0.3) is False          # a waited with the holder as its only blocker
    assert holder.do("unlock") is None        # the deletion a watched arrives after a gave up
    assert other.do("try") is True
    assert a.do("try", 0.3) is False          # a new node of a's: blocked by `other`, must wait
    assert other.do("unlock") is None
    assert a.do("try", 2) is True
    assert a.do("unlock") is None
    for o in (holder, a, other):
        o.ask("stop")


def test_a_waiter_that_gives_up_ahead_of_another_does_not_admit_it(zookeeper_engine, group):
    holder, a, b = (Owner(zookeeper_engine, group, "middle") for _ in range(3))
    assert holder.do("try") is True
    a.ask("try", 1.0)                          # second in line, gives up after 1 s
    wait_until(lambda: len(waiters(zookeeper_engine, group, "middle")) == 1, what="a queued")
    b.ask("try", 2.0)                          # third: two nodes ahead, watches a's
    assert a.answer() is False                 # a's node goes: b wakes, but the holder is still there
    assert b.answer() is False                 # so b must not have taken the lock
    assert holder.do("unlock") is None
    for o in (holder, a, b):
        o.ask("stop")


def test_the_second_in_line_takes_the_lock_from_the_release(zookeeper_engine, group):
    holder = ylock.Lock(zookeeper_engine, group, "second")
    holder.lock()
    order: list[str] = []

    def wait(tag: str) -> None:
        lock = ylock.Lock(zookeeper_engine, group, "second")
        lock.lock(timeout=10)
        order.append(tag)
        lock.unlock()

    first = Runner(lambda: wait("first"))
    first.start()
    wait_until(lambda: len(waiters(zookeeper_engine, group, "second")) == 1, what="first queued")
    second = Runner(lambda: wait("second"))
    second.start()
    wait_until(lambda: len(waiters(zookeeper_engine, group, "second")) == 2, what="second queued")
    holder.unlock()
    first.outcome()
    second.outcome()
    assert order == ["first", "second"]
