"""``python -m bench.cpu_pairs``'s worker runs end to end with tiny counts (not a timing test:
it checks that every case is measured, in CPU per pair and pairs per second)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_cpu_pairs_worker_measures_every_case(redis_server):
    from bench.cpu_pairs import CASES, worker

    results = worker(redis_server.url, 0.02)
    assert isinstance(results.pop("hiredis"), bool)
    assert set(results) == set(CASES)
    assert all(cpu > 0 and rate > 0 for cpu, rate in results.values()), results
