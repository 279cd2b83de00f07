"""A ZooKeeper holder cut off from the quorum while its client link stays up (issue #24,
item 4): it must be told it lost the lock before the quorum can grant it to anyone else.

A 3-server ensemble whose quorum, election and client links all go through fault proxies
(:class:`ylock.testing.zookeeper.PartitionableEnsemble`); the holder's engine reaches one
follower only, the waiter (another process) the two other servers. The follower is cut off
from the other two; it keeps answering its client's pings until it notices (``syncLimit *
tickTime``), but not its syncs, which need the leader: the quorum guard
(:mod:`ylock.engines.zookeeper.guard`) marks the hold lost half a session timeout after the
last answered sync, the leader expires the session a session timeout after its last touch.
Each run records every hold (token, holder, grant, end, told lost) and checks exclusion with
the journal; a control run with the guard off (``suspended=wait``) shows the fault is real:
the waiter is granted while the holder still believes it holds the lock.
"""
from __future__ import annotations

import functools
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import ylock
from tests.faults import hold_until_lost, owners
from tests.faults.partition_workers import queue_then_hold
from tests.helpers import Runner, wait_until
from ylock import events
from ylock.testing.zookeeper import PartitionableEnsemble

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")

SESSION = 3.0          # the holder's session timeout (the server's tick is 200 ms: it is kept)
WAITER_PATIENCE = 30


@pytest.fixture(scope="module")
def partitionable() -> Iterator[PartitionableEnsemble]:
    ensemble = PartitionableEnsemble(tick=200).start()
    try:
        yield ensemble
    finally:
        ensemble.stop()


def _scenario(ensemble: PartitionableEnsemble, engines: Any, journal: Any, group: str,
              suspended: str, role: str = "follower") -> dict[str, Any]:
    """Hold on a server of ``role`` (follower or leader), queue a waiter on the two others,
    cut the holder's server off; return the records and times (monotonic) once the waiter
    was granted and the partition healed."""
    ensemble.wait_serving()
    follower = next(n.sid for n in ensemble.nodes if n.mode() == role)
    others = [n.sid for n in ensemble.nodes if n.sid != follower]
    holder_engine = engines(ensemble.url(follower, chroot=f"/{group}")
                            + f"?session_timeout={SESSION:g}&connect_timeout=1&suspended={suspended}")
    admin = engines(ensemble.url(*others, chroot=f"/{group}"))
    lock = ylock.Lock(holder_engine, group, "n")
    why: list[str] = []                # the details of the holder's loss events

    def on_lost(event: events.Event) -> None:
        if event.kind == events.LOST and event.group == group:
            why.append(event.detail or "")
    events.subscribe(on_lost)
    inside, stop = threading.Event(), threading.Event()
    h = Runner(functools.partial(hold_until_lost, lock, journal, inside, stop=stop, patience=40))
    h.start()
    assert inside.wait(15), "the holder did not get the lock"
    parent, child = spawn.Pipe()
    # connect_timeout=10: the waiter rides out a server of the two that is still finishing
    # its rejoin after the previous run's heal (its call fails if it cannot connect in time).
    waiter = spawn.Process(target=queue_then_hold,
                           args=(ensemble.url(*others, chroot=f"/{group}") + "?connect_timeout=10", group, "n",
                                 journal.checkers, child))
    waiter.start()
    try:
        def queued() -> bool:
            if parent.poll():         # the waiter ended before it queued: say why
                raise AssertionError(f"the waiter ended before it queued: {parent.recv()!r}")
            return bool(owners(admin, group, "n")[1])
        wait_until(queued, timeout=30, what="the waiter queued")
        cut = time.monotonic()
        ensemble.partition(follower)
        assert parent.poll(WAITER_PATIENCE), "the waiter was never granted the lock"
        kind, w_record = parent.recv()
        assert kind == "record", w_record
        stop.set()
        ensemble.heal()
        healed = time.monotonic()
        h_record = h.outcome(30)
    finally:
        events.unsubscribe(on_lost)
        stop.set()
        ensemble.heal()
        waiter.join(30)
        if waiter.is_alive():
            waiter.kill()
    journal.add(w_record)
    return {"cut": cut, "healed": healed, "h": h_record, "w": w_record,
            "follower": follower, "why": why}  # "follower": the sid of the server cut off


@pytest.mark.parametrize("run", range(5))
def test_holder_cut_off_from_the_quorum_is_told_before_anyone_is_granted(partitionable, engines, journal, group,
                                                                         run, figures):
    """The guard (default): the holder is marked lost, and stops, strictly before the waiter
    is granted, and the waiter is granted during the partition (the fault happened)."""
    r = _scenario(partitionable, engines, journal, group, "guard")
    h, w = r["h"], r["w"]
    assert h.outcome == "lost" and h.lost_at is not None, h
    assert h.ended < w.granted, f"the holder stopped {h.ended - w.granted:.3f} s after the waiter's grant"
    assert h.lost_at < w.granted, f"the holder was told {h.lost_at - w.granted:.3f} s after the waiter's grant"
    assert r["cut"] < w.granted < r["healed"], "the waiter was not granted during the partition"
    assert h.token != w.token and w.token > h.token, (h.token, w.token)
    assert h.rejected == 0, "the holder wrote after the waiter was granted"
    assert r["why"] and "quorum not heard" in r["why"][0], r["why"]
    verdict = journal.check()
    figures(f"run {run}: follower {r['follower']} cut off: holder told lost {h.lost_at - r['cut']:.3f} s, "
            f"waiter granted {w.granted - r['cut']:.3f} s after the cut (session {SESSION:g} s); margin "
            f"{w.granted - h.lost_at:.3f} s; {verdict}")


def test_without_the_guard_the_cut_off_holder_overlaps(partitionable, engines, journal, group, figures):
    """The control: with ``suspended=wait`` (the behaviour before the guard) the same fault
    lets the waiter in while the holder still believes it holds the lock, and the fenced
    register rejects the holder's stale writes."""
    r = _scenario(partitionable, engines, journal, group, "wait")
    h, w = r["h"], r["w"]
    assert r["cut"] < w.granted < r["healed"], "the waiter was not granted during the partition"
    assert h.lost_at is None or h.lost_at > w.granted, h
    assert h.ended > w.granted and h.rejected >= 1, h
    verdict = journal.check(strict=False)
    figures(f"guard off: waiter granted {w.granted - r['cut']:.3f} s after the cut while the holder still "
            f"held; holder's stale writes rejected: {h.rejected}; {verdict}")
