"""``python -m bench.aio`` runs end to end with tiny counts (not a timing test: it checks
the shape of the results, that ylock's asyncio lock loses no update, in one process and
across processes, that the counter catches a missing lock, and that the contended
pairing with redis.asyncio's Lock gives a ratio per round)."""
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


def test_aio_contended_pairing_smoke(tmp_path):
    """The contended rows of ylock and redis.asyncio's Lock come from rounds of it, ylock,
    ylock, it: a ratio per shape with the CPU stolen and the quiet rounds, and each side's
    row the median of its runs (two a round)."""
    from bench.aio import main

    results = main(["--runs", "1", "--rounds", "1", "--duration", "0.5", "--max-ops", "200", "--tasks", "3",
                    "--procs", "2", "--tasks-per-process", "2", "--out", str(tmp_path), "--only", "contended",
                    "--libs", "ylock redis (asyncio),redis.asyncio Lock"])
    paired = results["contended_paired"]
    assert set(paired) == {"3 tasks in 1 process", "2 processes × 2 tasks"}
    for shape, v in paired.items():
        assert v["rounds"] == 1 and 0 < v["min"] <= v["median"] <= v["max"], v
        assert 0 <= v["steal_pct"]["max"] <= 100 and 0 <= v["quiet"]["rounds"] <= 1, v
        ours = results["contended"][f"{shape}: ylock redis (asyncio)"]
        peer = results["contended"][f"{shape}: redis.asyncio Lock"]
        assert ours["lost_updates"] == 0 and peer["lost_updates"] == 0
        assert 0 <= ours["steal_pct"] <= 100             # each run's own, the median of the round's two
    assert "ylock ÷ redis.asyncio Lock in acquisitions/s, 1 rounds" in (tmp_path / "aio.md").read_text()
