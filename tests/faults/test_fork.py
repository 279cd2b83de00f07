"""A process forked while its parent holds a lock (gunicorn's and uWSGI's pre-fork, a
``multiprocessing`` fork), on every engine whose holds a fork can meet: the child inherits
no hold and no connection, waits for the lock like any other process, and the parent's hold
stays valid (and renewed, where the engine renews) meanwhile. Exclusion is checked with the
journal of holds (the fenced register and the unfenced counter)."""
from __future__ import annotations

import multiprocessing
import time

import pytest

import ylock
from tests.faults import owners, workers
from tests.helpers import collect, wait_until
from ylock import events

pytestmark = pytest.mark.slow
fork = multiprocessing.get_context("fork")


@pytest.fixture(params=["redis", "zookeeper"])
def engine_url(request, group) -> str:
    """The URL of an engine of each kind, on the session's Redis and this directory's ZooKeeper."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_server").url)
    return str(request.getfixturevalue("zookeeper").url(f"/{group}"))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_fork_while_holding(engine_url, engines, journal, group):
    """A child forked while the parent holds does not inherit the hold: held() is False in
    the child, and its lock() waits (queued, on connections or a session of its own) until
    the parent releases; meanwhile the parent's hold stays valid, and on an engine whose holds
    need renewing it is renewed (lease 1 s: every third of a second) while the child waits."""
    engine = engines(engine_url)
    lock = ylock.Lock(engine, group, "n", lease=1.0)
    lock.lock()
    h_record = workers.write_inside(lock, "parent", journal.checkers, writes=1, release=False)
    parent, child = fork.Pipe()
    with collect(events.RENEWED) as renewals:
        proc = fork.Process(target=workers.forked_child, args=(lock, journal.checkers, child))
        proc.start()
        try:
            assert parent.poll(20)
            _, held, token, lost, child_owner = parent.recv()
            assert (held, token, lost) == (False, None, False) and child_owner != h_record.owner
            wait_until(lambda: owners(engine, group, "n") == ((h_record.owner,), (f"write:{child_owner}",)),
                       what="the child queued behind the parent")
            if engine.needs_renewal:
                queued = time.time()
                wait_until(lambda: sum(e.name == "n" and e.group == group and e.timestamp > queued
                                       for e in renewals) >= 3,
                           timeout=5, what="three renewals of the parent's hold while the child waits")
            assert lock.held() and not lock.lost
            workers.write_once(h_record, journal.checkers)
            h_record.ended = time.monotonic()
            journal.add(workers.finish(lock, h_record))
            assert h_record.outcome == "released", h_record
            assert parent.poll(20), "the child never got the lock"
            message = parent.recv()
            assert message[0] == "record", message
            _, c_record, asked = message
            journal.add(c_record)
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert asked < h_record.ended < c_record.granted          # it asked, then waited for the parent
    journal.check()
