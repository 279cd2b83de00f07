"""The MySQL benchmark runs end to end with tiny counts (not a timing test: the shape of its
results, and that its counter catches a missing lock while ylock loses nothing)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_bench_mysql_smoke(tmp_path):
    from bench.mysql import main

    results = main(["--quick", "--runs", "1", "--seconds", "0.05", "--duration", "0.5", "--out", str(tmp_path),
                    "--libs", "django-mysql Lock,django-pglock advisory,no lock (control)"])
    rows = results["uncontended"]
    for name in ("ylock mysql ÷ django-mysql Lock", "ylock postgres ÷ django-pglock advisory"):
        assert rows[name]["ylock_pairs_per_s"] > 0 and rows[name]["peer_pairs_per_s"] > 0
        assert rows[name]["ratio"]["median"] > 0
    contended = results["contended"]
    pairing = contended["ylock mysql ÷ django-mysql Lock"]
    assert pairing["ylock"]["lost_updates"] == 0 and pairing["peer"]["lost_updates"] == 0
    assert contended["no lock (control)"]["lost_updates"] > 0
    assert (tmp_path / "mysql.md").read_text().count("|") > 20
