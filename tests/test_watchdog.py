"""The process's renewal thread with many holds (issue 41): the schedule is a heap (finding
what is due does not walk every hold), a crowd of holds is renewed in batches spread over
the coalescing window, and a thread that falls behind says so, in the log and in the
metrics. On the local engine: its leases are enforced, and its renewals can be slowed
down to make the thread fall behind, which no real server does on demand."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import pytest

import ylock
from tests.helpers import wait_until
from ylock import watchdog
from ylock.engines.local import LocalEngine
from ylock.holds import Hold, HoldTable, RenewItem


class SlowEngine(LocalEngine):
    """A local engine whose renewals take ``delay`` seconds a batch (a server that answers
    slowly, a process short of CPU)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.batches: list[int] = []

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        self.batches.append(len(items))
        time.sleep(self.delay)
        return super().renew(items)


def test_the_schedule_finds_what_is_due_without_walking_every_hold():
    table = HoldTable()
    engine = LocalEngine()
    holds = [Hold(engine, "g", f"n{i}", "o", 30.0, i) for i in range(5000)]
    # One grant time for all (the adds take a while on a busy machine): due 1 s .. 6 s from it.
    granted = time.monotonic()
    for i, hold in enumerate(holds):
        table.add(hold, "write", first_renewal=1.0 + i / 1000, granted=granted)
    with table.changed:
        assert table.earliest_due() == pytest.approx(granted + 1.0, abs=1e-6)
        # 30 s leases: a batch takes along what is due within 5 s (a sixth)...
        batches = table.due(granted + 1.5)
        assert sum(len(b) for b in batches.values()) == 5000
    # ... but no more than ``spread`` of those not due yet, earliest first.
    granted = time.monotonic()
    for i, hold in enumerate(holds):
        table.add(hold, "write", first_renewal=1.0 + i / 1000, granted=granted)
    with table.changed:
        batch = table.due(granted + 1.0005, spread=300)[engine]
        assert len(batch) in (300, 301), len(batch)       # n0 is due; 300 more at most
        assert [h.name for h, _ in batch] == [f"n{i}" for i in range(len(batch))]      # in due order
    # a released hold leaves a stale entry, dropped when it comes up
    for hold in holds:
        table.remove(hold)
    with table.changed:
        assert table.earliest_due() is None


def test_a_thread_that_falls_behind_says_so_in_the_log_and_the_metrics(caplog, monkeypatch):
    """Renewals that take longer than a sixth of the holds' lease go out late: each is
    counted (``WATCHDOG.stats()``, ``ylock_watchdog_late_renewals_total``) and a warning
    says what to do. The control: the same holds on a fast engine are never late."""
    from ylock.metrics.prometheus import PrometheusExporter

    monkeypatch.setattr(watchdog, "WARN_EVERY", 0.0)
    exporter = PrometheusExporter()
    fast = LocalEngine()
    before = ylock.WATCHDOG.stats()["late"]
    locks = ylock.Locks(fast, "fast", lease=1.2)
    for i in range(50):
        locks.lock(f"n{i}")
    time.sleep(1.2)
    for i in range(50):
        assert not locks[f"n{i}"].lost
        locks.unlock(f"n{i}")
    assert ylock.WATCHDOG.stats()["late"] == before, "late on a fast engine: the test cannot tell"
    slow = SlowEngine(delay=0.7)    # a batch takes 0.7 s, so each goes out 0.3 s late: over a sixth of the lease
    locks = ylock.Locks(slow, "slow", lease=1.2)
    with caplog.at_level(logging.WARNING, logger="ylock.watchdog"):
        for i in range(50):
            locks.lock(f"n{i}")
        wait_until(lambda: ylock.WATCHDOG.stats()["late"] > before, timeout=30, what="renewals counted late")
        wait_until(lambda: "falling behind" in caplog.text, timeout=30, what="the warning")
    for i in range(50):
        try:
            locks.unlock(f"n{i}")
        except ylock.LockLost:
            pass                                    # late enough to lose it: what the warning is about
    assert ylock.WATCHDOG.stats()["lag"] >= 0.0
    families = {f.name: f for f in exporter.families()}
    late = families["ylock_watchdog_late_renewals"].samples
    assert any(s.name.endswith("_total") and s.value > 0 for s in late), late
    assert "ylock_watchdog_lag_seconds" in families
    exporter.close()
