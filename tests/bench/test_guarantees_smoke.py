"""``python -m bench.guarantees`` runs end to end with tiny counts (not a timing test: it
checks the shape of the results, that every ratio is a finite positive number with CPU per
pair on both sides, that the no-lock control loses updates while ylock and the fair-handoff
floor lose none, and that the pinning is recorded)."""
from __future__ import annotations

import json
import math
import os

import pytest

pytestmark = pytest.mark.slow


def _finite_ratio(row: dict) -> None:
    assert math.isfinite(row["median"]) and 0 < row["min"] <= row["median"] <= row["max"], row
    for side in ("a", "b"):
        assert row[side]["rate"] > 0 and row[side]["cpu_us"] > 0 and row[side]["server_us"] >= 0, row
        assert 0 <= row[side]["steal_pct"] <= 100, row
    # the CPU the hypervisor stole, per round, and the ratio over the rounds where it stole little
    assert 0 <= row["steal_pct"]["min"] <= row["steal_pct"]["max"] <= 100, row
    quiet = row["quiet"]
    assert 0 <= quiet["rounds"] <= row["rounds"], row
    assert quiet["rounds"] == 0 or quiet["min"] <= quiet["median"] <= quiet["max"], row


def test_guarantees_quick_smoke(tmp_path):
    from bench.guarantees import main

    affinity = os.sched_getaffinity(0)
    results = main(["--quick", "--seconds", "0.005", "--duration", "0.3", "--hold", "0.3", "--out", str(tmp_path),
                    "--only", "ratios,floor,zk_suspended,acl,tls"])
    assert os.sched_getaffinity(0) == affinity                     # the pinning is undone
    assert "CPU" in results["placement"] or "not pinned" in results["placement"]
    assert set(results["ratios"]) == {"ylock fair write pair / sherlock", "ylock fair write pair / redis-py Lock",
                                      "asyncio alock/aunlock / redis.asyncio Lock",
                                      "ylock ZooKeeper write pair / kazoo WriteLock"}
    for row in results["ratios"].values():
        assert row["rounds"] >= 10
        _finite_ratio(row)
    _finite_ratio(results["zk_suspended"]["pair: suspended=guard / wait"])
    rows = results["floor"]["rows"]
    assert rows["fair-handoff floor (ticket lock)"]["lost_updates"] == 0
    assert rows["ylock redis (notify)"]["lost_updates"] == 0
    assert rows["no lock (control)"]["lost_updates"] > 0
    # the ticket lock: 3 commands to take a free lock, 4 to release, 1 BLPOP when it waits; and,
    # once per process, what loading its scripts costs (NOSCRIPT, SCRIPT LOAD, the retry: about
    # ten commands of 4 processes), spread over few acquisitions when a loaded machine runs few
    floor = rows["fair-handoff floor (ticket lock)"]
    acquisitions = floor["acq_per_s"] * 0.3                   # its --duration
    assert 6 <= floor["redis_cmds_per_acq"] <= 9 + 40 / acquisitions, floor
    paired = results["floor"]["ylock / floor"]                 # rounds of floor, ylock, ylock, floor
    assert paired["rounds"] == 1 and 0 < paired["min"] <= paired["median"] <= paired["max"], paired
    assert 0 <= paired["steal_pct"]["max"] <= 100 and 0 <= paired["quiet"]["rounds"] <= 1, paired
    for section in ("acl", "tls"):
        assert all(row["handoffs"] > 0 and row["p50_ms"] > 0 for row in results[section]["rows"].values())
    assert math.isfinite(results["tls"]["p50 TLS / plaintext"])
    saved = json.loads((tmp_path / "guarantees.json").read_text())
    assert saved["ratios"].keys() == results["ratios"].keys()
    md = (tmp_path / "guarantees.md").read_text()
    assert md.count("|") > 50 and "| stolen | quiet |" in md
