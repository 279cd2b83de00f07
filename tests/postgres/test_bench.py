"""The PostgreSQL benchmark runs end to end with tiny counts (not a timing test: the shape of
its results, and that its counter catches a missing lock while ylock loses nothing)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_bench_postgres_smoke(tmp_path):
    from bench.postgres import main

    results = main(["--quick", "--runs", "1", "--seconds", "0.05", "--duration", "0.5", "--out", str(tmp_path),
                    "--libs", "ylock postgres,no lock (control)"])
    assert results["round_trips_per_pair"] == 2               # one statement acquires, one releases
    assert all(row["median"] > 0 for row in results["uncontended"].values())
    rows = results["contended"]
    assert rows["4 processes: ylock postgres"]["lost_updates"] == 0
    assert rows["4 processes: no lock (control)"]["lost_updates"] > 0
    assert (tmp_path / "postgres.md").read_text().count("|") > 20
