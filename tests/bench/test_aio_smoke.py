"""``python -m bench.aio`` runs end to end with tiny counts (not a timing test: it checks
the shape of the results, that ylock's asyncio lock loses no update, in one process and
across processes, and that the counter catches a missing lock)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_aio_bench_smoke(tmp_path):
    from bench.aio import main

    results = main(["--runs", "1", "--seconds", "0.05", "--duration", "0.5", "--max-ops", "300", "--tasks", "4",
                    "--procs", "2", "--tasks-per-process", "2", "--out", str(tmp_path),
                    "--libs", "ylock redis (asyncio),no lock (control)"])
    rows = results["uncontended"]
    assert set(rows) >= {"ylock redis alock/aunlock (asyncio)", "redis.asyncio Lock acquire/release",
                         "ylock redis lock/unlock (blocking)", "floor: EVALSHA round trip (redis.asyncio)"}
    assert all(row["median"] > 0 for row in rows.values())
    assert results["round_trips_per_async_pair"] == 2
    contended = results["contended"]
    for shape in ("4 tasks in 1 process", "2 processes × 2 tasks"):
        ours = contended[f"{shape}: ylock redis (asyncio)"]
        assert ours["acquisitions"] > 0 and ours["lost_updates"] == 0
        assert contended[f"{shape}: no lock (control)"]["lost_updates"] > 0
    saved = json.loads((tmp_path / "aio.json").read_text())
    assert saved["contended"].keys() == contended.keys()
    assert (tmp_path / "aio.md").read_text().count("|") > 20
