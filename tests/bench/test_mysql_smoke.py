"""The MySQL benchmark runs end to end with tiny counts (not a timing test: the shape of its
results, and that its counter catches a missing lock while ylock and the peers lose nothing).
It runs in a process of its own: its peers lock on Django's connections, which the test
session's Django settings (pytest-django) would not let it configure."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_bench_mysql_smoke(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-m", "bench.mysql", "--quick", "--runs", "1", "--seconds", "0.05",
                           "--duration", "0.5", "--out", str(tmp_path),
                           "--libs", "django-mysql Lock,django-pglock advisory,no lock (control)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "mysql.json").read_text())
    rows = results["uncontended"]
    for name in ("ylock mysql ÷ django-mysql Lock", "ylock postgres ÷ django-pglock advisory"):
        assert rows[name]["ylock_pairs_per_s"] > 0 and rows[name]["peer_pairs_per_s"] > 0
        assert rows[name]["ratio"]["median"] > 0
    contended = results["contended"]
    pairing = contended["ylock mysql ÷ django-mysql Lock"]
    assert pairing["ylock"]["lost_updates"] == 0 and pairing["peer"]["lost_updates"] == 0
    assert pairing["ylock"]["acq_per_s"] > 0 and pairing["peer"]["acq_per_s"] > 0
    assert contended["no lock (control)"]["lost_updates"] > 0
    assert (tmp_path / "mysql.md").read_text().count("|") > 20
