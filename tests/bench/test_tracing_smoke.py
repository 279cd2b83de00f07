"""``python -m bench.tracing`` runs end to end with tiny counts (not a timing test: it
checks the shape of the results, that a traced pair makes its two spans and that a lock
pair with tracing off imports no OpenTelemetry)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_tracing_bench_smoke(tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    from bench.tracing import MODES, main

    results = main(["--runs", "1", "--seconds", "0.05", "--out", str(tmp_path)])
    rows = results["uncontended"]
    assert set(rows) == {"floor: Redis EVALSHA round trip"} | {f"{e}: {m}" for e in ("local", "redis") for m in MODES}
    assert all(row["median"] > 0 for row in rows.values())
    assert rows["local: off"]["vs_off"] == 1.0 and rows["local: extra not installed"]["vs"] == "off (child)"
    assert results["spans_per_pair"] == 2                # a wait span and a hold span
    assert results["ylock_imports_opentelemetry_when_off"] is False
    assert json.loads((tmp_path / "tracing.json").read_text())["uncontended"].keys() == rows.keys()
    assert (tmp_path / "tracing.md").read_text().count("|") > 20
