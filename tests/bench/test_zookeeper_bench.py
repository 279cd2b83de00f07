"""``python -m bench.zookeeper`` runs end to end with tiny counts (not a timing test: it
checks the shape of the results, the request counts, and that the counter catches a missing
lock while ylock and kazoo lose nothing)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_zookeeper_bench_quick_smoke(tmp_path):
    from bench.zookeeper import main

    results = main(["--quick", "--runs", "1", "--seconds", "0.1", "--duration", "0.7", "--out", str(tmp_path)])
    rows = results["uncontended"]
    assert set(rows) >= {"floor: kazoo create+delete", "floor: kazoo get_children", "ylock zookeeper (write)",
                         "ylock zookeeper (read)", "kazoo WriteLock", "kazoo ReadLock", "kazoo Lock"}
    assert all(row["median"] > 0 and row["cpu_us"] > 0 for row in rows.values())
    # Packets the server received per pair (an idle client's ping may add a fraction).
    assert rows["ylock zookeeper (write)"]["requests"] == pytest.approx(3, abs=0.1)   # create+children, delete
    assert rows["ylock zookeeper (read)"]["requests"] == pytest.approx(3, abs=0.1)
    assert rows["kazoo WriteLock"]["requests"] == pytest.approx(4, abs=0.1)
    assert rows["floor: kazoo create+delete"]["requests"] == pytest.approx(2, abs=0.1)
    assert set(results["ratios"]["ylock write / kazoo WriteLock"]) == {"of_medians", "per_run_median", "per_run_min",
                                                                       "per_run_max"}
    contended = results["contended"]
    assert contended["4 processes: ylock zookeeper"]["lost_updates"] == 0
    assert contended["4 processes: kazoo Lock"]["lost_updates"] == 0
    assert contended["4 processes: no lock (control)"]["lost_updates"] > 0      # the counter catches a broken lock
    for lib in ("ylock zookeeper", "kazoo Lock"):
        row = contended[f"4 processes: {lib}"]
        # Fair: handed to the queue. A releaser that finds nobody queued takes it back, common
        # on a loaded machine in a 0.7 s run (see tests/bench/test_smoke.py): a sanity bound.
        assert row["acquisitions"] > 4 and row["self_reacquire"] < 0.5
        assert 4 <= row["zk_requests_per_acq"] < 10 and row["cpu_ms_per_acq"] > 0
    saved = json.loads((tmp_path / "zookeeper.json").read_text())
    assert saved["contended"].keys() == contended.keys()
    assert (tmp_path / "zookeeper.md").read_text().count("|") > 40
