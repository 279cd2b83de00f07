"""``python -m bench.scale``: its checker of the journal of holds catches what it must (an
overlap, a token given twice, tokens out of grant order), and its table renders from the
published results (the full run takes minutes: the suite's own tests of the four at small
sizes are ``tests/redis/test_scale.py`` and ``tests/redis/test_cluster_migration.py``)."""
from __future__ import annotations

import json
from pathlib import Path

from bench.scale import check_holds, markdown

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "scale.json"


def test_the_checker_catches_overlaps_repeated_tokens_and_regressions():
    clean = [("n", "a", 10, 0.0, 1.0), ("n", "b", 11, 1.5, 2.0), ("m", "c", 10, 0.5, 3.0)]
    assert check_holds(clean) == {"overlaps": 0, "duplicate_tokens": 0, "token_regressions": 0}
    overlap = [("n", "a", 10, 0.0, 1.0), ("n", "b", 11, 0.5, 2.0)]
    assert check_holds(overlap)["overlaps"] == 1
    twice = [("n", "a", 10, 0.0, 1.0), ("n", "b", 10, 1.5, 2.0)]
    assert check_holds(twice)["duplicate_tokens"] == 1 and check_holds(twice)["token_regressions"] == 1
    backwards = [("n", "a", 12, 0.0, 1.0), ("n", "b", 11, 1.5, 2.0)]
    assert check_holds(backwards) == {"overlaps": 0, "duplicate_tokens": 0, "token_regressions": 1}


def test_the_published_results_render_and_hold_their_promises():
    results = json.loads(RESULTS.read_text())
    text = markdown(results)
    for heading in ("Cluster slots migrated", "write holds in one process", "Listing in a Redis", "Waiters on one"):
        assert heading in text
    load = results["cluster"]["load"]
    assert load["holds"] > 1000 and load["errors"] == load["lost"] == load["overlaps"] == 0
    assert load["duplicate_tokens"] == load["token_regressions"] == 0
    assert results["holds"]["ylock"]["bytes_per_hold"] <= 300 and results["holds"]["ylock"]["lost"] == 0
    assert results["listing"]["describe_one_lock_group_ms"] < 100
    assert results["waiters"]["asyncio"]["fifo"] and results["waiters"]["threads"]["fifo"]
