"""A force-release with a queued waiter, on each engine whose holders can be told: the one
scenario, with each engine's bounds (Redis tells the holder at its next renewal, ZooKeeper
at once through the deleted node's watch). PostgreSQL's force-release ends the holder's
session instead (tests/faults/test_postgres.py)."""
from __future__ import annotations

import dataclasses
import functools
import threading

import pytest

import ylock
from tests.faults import SLACK, hold_until_lost, server_has, take, timed
from tests.helpers import Runner, wait_until, waiters

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class Case:
    """One engine's setting of the scenario and its bounds."""

    url: str
    lease: float | None         # the holder's (None: the engine's default)
    release_within: float       # force_release()'s own time
    told_within: float          # from the force-release to the holder told it lost the lock (median)
    told_why: str
    #: The same, for every one of the 30 tries: on a busy machine one renewal may come late
    #: (the renewal thread waits for the CPU), but never past the lease after which the
    #: holder counts itself lost anyway.
    told_at_worst: float


@pytest.fixture(params=["redis", "zookeeper"])
def case(request: pytest.FixtureRequest, group: str) -> Case:
    if request.param == "redis":
        lease = 1.2
        return Case(request.getfixturevalue("redis_server").url, lease, 0.1 + SLACK, lease / 3 + SLACK / 2,
                    f"lease {lease} s: a third is {lease / 3:.1f} s", lease + SLACK)
    return Case(request.getfixturevalue("zookeeper").url(f"/{group}"), None, 2.0 + SLACK, 2.0,
                "the deleted node's watch", 2.0)


def test_force_release_with_a_queued_waiter(case, engines, journal, group, figures):
    """H holds, W is queued, an operator force-releases the lock, a newcomer C asks for it: H
    is told it lost the lock (Redis: at its next renewal, a third of its lease; ZooKeeper: at
    once), W (on ZooKeeper: whose node went first, so it queues again) and C get the lock one
    after the other, never both, each the server's holder while inside; H's writes after
    theirs are rejected by the fenced register (no deleted node is ever granted). Repeated,
    since it is a race (between the deletes and the watches, on ZooKeeper)."""
    admin, holder, waiter, newcomer = (engines(case.url) for _ in range(4))
    lease = {} if case.lease is None else {"lease": case.lease}
    handover: list[float] = []
    told: list[float] = []
    for i in range(30):
        name = f"n{i}"
        confirm = server_has(admin, group, name)
        inside = threading.Event()
        h = Runner(functools.partial(hold_until_lost, ylock.Lock(holder, group, name, **lease), journal, inside))
        h.start()
        assert inside.wait(10)
        w = Runner(functools.partial(take, ylock.Lock(waiter, group, name), journal, "W", confirm))
        w.start()
        wait_until(lambda name=name: waiters(admin, group, name), what="W queued")
        released = timed(admin.force_release, group, name).within(0, case.release_within, "force_release")
        assert released.result is True
        c = Runner(functools.partial(take, ylock.Lock(newcomer, group, name), journal, "C", confirm))
        c.start()
        h_record, w_record, c_record = h.outcome(20), w.outcome(20), c.outcome(20)
        assert h_record.outcome == "lost", h_record
        assert (w_record.outcome, c_record.outcome) == ("released", "released"), (w_record, c_record)
        told.append(h_record.lost_at - released.started)
        handover.append(min(w_record.granted, c_record.granted) - released.started)
    verdict = journal.check()
    assert min(handover) >= 0, "W or C got the lock before the force-release"
    median_told = sorted(told)[len(told) // 2]
    assert median_told < case.told_within, f"the force-released holder was told late: median {median_told:.3f} s"
    assert max(told) < case.told_at_worst, f"the force-released holder was told late: after {max(told):.3f} s"
    figures(f"force-release -> holder told lost after max {max(told):.3f} s ({case.told_why}); next holder in "
            f"after median {sorted(handover)[len(handover) // 2]:.3f} s, max {max(handover):.3f} s; {verdict}")
