"""``python -m bench.semaphore`` runs end to end with tiny counts (not a timing test: it
checks the shape of the results, that ylock's semaphores never admit more holders than
permits, and that the holders counter catches a missing semaphore)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_semaphore_bench_smoke(tmp_path):
    from bench.semaphore import main

    # 2 permits and 4 processes: without a semaphore, 3 holders at once show up at once.
    results = main(["--runs", "1", "--seconds", "0.05", "--duration", "0.5", "--max-ops", "400", "--procs", "4",
                    "--permits", "2", "--out", str(tmp_path),
                    "--libs", "ylock redis,ylock local (threads),no semaphore (control)"])
    rows = results["uncontended"]
    assert set(rows) >= {"floor: Redis EVALSHA round trip", "ylock redis Lock (write)",
                         "ylock redis Semaphore (3 permits)", "ylock local Semaphore (3 permits)"}
    assert all(row["median"] > 0 for row in rows.values())
    assert results["ratios"]["redis sem/lock"] > 0
    assert results["per_pair"]["semaphore"]["round_trips"] == 2       # one script to take, one to give back
    contended = results["contended"]
    for lib in ("ylock redis", "ylock local (threads)"):
        row = contended[f"4 {'threads' if 'threads' in lib else 'processes'}, 2 permits: {lib}"]
        assert row["acquisitions"] > 0 and row["max_holders"] <= 2 and not row["over_permits"]
        assert row["handoffs"] > 0 and row["gap_p50_ms"] is not None
    assert contended["4 processes, 2 permits: no semaphore (control)"]["max_holders"] > 2
    saved = json.loads((tmp_path / "semaphore.json").read_text())
    assert saved["contended"].keys() == contended.keys()
    assert (tmp_path / "semaphore.md").read_text().count("|") > 20


def test_handoff_analysis():
    """A release while someone waits is matched with the next holder admitted after it."""
    from bench.semaphore import analyse

    ms = 1_000_000
    # One permit: process 0 holds 0-10 ms; process 1 asks at 1 ms and gets it at 12 ms;
    # process 0 asks again at 11 ms and gets it at 25 ms, after process 1's release at 20.
    fair = analyse([[(0, 0, 10 * ms), (11 * ms, 25 * ms, 30 * ms)], [(1 * ms, 12 * ms, 20 * ms)]], 1)
    assert fair["acquisitions"] == 3 and fair["handoffs"] == 2          # the last release: nobody waited
    assert fair["gap_p99_ms"] == pytest.approx(5.0) and fair["wait_p99_ms"] == pytest.approx(14.0)
    assert fair["self_handoff"] == 0 and fair["barged"] == 0 and fair["fairness_max_min"] == 2
    # Process 0 releases at 10 ms and takes the permit back at 11.5 ms while process 1 waits.
    unfair = analyse([[(0, 0, 10 * ms), (11 * ms, 11_500_000, 15 * ms)], [(1 * ms, 16 * ms, 20 * ms)]], 1)
    assert unfair["handoffs"] == 2 and unfair["self_handoff"] == 0.5 and unfair["barged"] == 0.5
