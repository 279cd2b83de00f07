"""The stats every process publishes (ylock.metrics.aggregator): histograms that merge
exactly across processes, percentiles within a bucket, a bounded window. Publishing them
on a real server and reading them back with the CLI is in tests/test_cli.py."""
from __future__ import annotations

import json
import math
import random
import time

import pytest

from ylock.events import Event
from ylock.metrics import shared
from ylock.metrics.aggregator import MAX_GROUPS, OTHER, Aggregator, Histogram


def test_histograms_merge_exactly_and_percentiles_stay_within_a_bucket() -> None:
    rng = random.Random(11)
    values = [rng.lognormvariate(-6, 2) for _ in range(5000)] + [0.0, 1e-9, 5e6]
    parts = [Histogram() for _ in range(3)]
    whole = Histogram()
    for i, value in enumerate(values):
        parts[i % 3].add(value)
        whole.add(value)
    merged = Histogram()
    for part in parts:
        merged.merge(Histogram.from_dict(json.loads(json.dumps(part.as_dict()))))   # as published
    assert merged.buckets == whole.buckets and merged.count == whole.count == len(values)
    assert merged.maximum == max(values) and merged.total == pytest.approx(sum(values), rel=1e-12)
    ordered = sorted(values)
    for p in (1, 50, 90, 99, 99.9):
        exact = ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]
        estimate = merged.percentile(p)
        assert exact <= estimate <= max(exact * 1.0906, 1e-6), (p, exact, estimate)
    assert merged.percentile(100) == max(values)
    with pytest.raises(ValueError):
        Histogram.from_dict({"count": 1, "sum": 1.0, "max": 1.0, "buckets": {"9999": 1}})
    assert shared.merge([{"groups": {"g": {"counts": {"acquired": "x"}, "wait": {"buckets": 3}}}}]) == {}


def test_the_window_is_bounded() -> None:
    aggregator = Aggregator(reservoir_size=8)
    now = time.time()
    for i in range(MAX_GROUPS + 50):
        aggregator(Event("acquired", f"g{i}", "n", "redis", "write", wait=0.001, timestamp=now))
    aggregator(Event("acquired", "old", "n", "redis", "write", wait=0.001, timestamp=now - 3600))
    window = aggregator.window()
    assert len(window["groups"]) == MAX_GROUPS + 1 and window["groups"][OTHER]["counts"] == {"acquired": 50}
    assert "old" not in window["groups"] and window["schemes"] == ["redis"]
    assert sum(len(groups) for groups in aggregator._slices.values()) <= MAX_GROUPS + 1
    assert aggregator.snapshot()["old"]["counts"] == {"acquired": 1}    # since start: all of it
