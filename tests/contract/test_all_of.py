"""ylock.all_of on every engine of the contract suite: several locks and semaphores taken in one
order, and given back when one of them is busy."""
from __future__ import annotations

import threading

import pytest

import ylock
from tests.contract import other, sem
from tests.helpers import Runner, collect


def test_all_of_takes_locks_and_semaphores_in_one_order(engine, group):
    a = ylock.Lock(engine, group, "a")
    b = ylock.Lock(engine, group, "b")
    s = sem(engine, group, permits=1)
    with ylock.all_of(b.write(), s.hold(), a.read(), timeout=5):
        assert a.held("read") and b.held("write") and s.held()
        busy = other(lambda: ylock.Lock(engine, group, "b").try_lock(0))
        assert busy is False
    assert not (a.held() or b.held() or s.held())


def test_all_of_releases_what_it_took_when_one_is_busy(engine, group):
    a, b = ylock.Lock(engine, group, "a"), ylock.Lock(engine, group, "b")
    release = threading.Event()
    held = threading.Event()

    def hold_b() -> None:
        with ylock.Lock(engine, group, "b").write():
            held.set()
            release.wait(10)
    runner = Runner(hold_b)
    runner.start()
    assert held.wait(5)
    with collect("released") as released:
        with pytest.raises(ylock.LockTimeout) as info:
            with ylock.all_of(a.write(), b.write(), timeout=0.3):
                pytest.fail("entered although b is held")
    assert info.value.name == "b" and "b" in str(info.value)
    assert not a.held() and [e.name for e in released if e.group == group] == ["a"]
    release.set()
    runner.outcome()
