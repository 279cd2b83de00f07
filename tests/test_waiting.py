"""The waiters' poll intervals (ylock.waiting): jittered from a generator of their own, which
leaves the application's ``random`` alone and differs in every forked worker."""
from __future__ import annotations

import itertools
import json
import os
import random

from ylock.waiting import Polling


def _intervals(count: int) -> list[float]:
    return list(itertools.islice(Polling.exponential(initial=0.1, maximum=0.1).intervals(), count))


def test_jitter_leaves_the_application_s_seeded_random_alone():
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    drawn = _intervals(50)
    assert [random.random() for _ in range(3)] == expected
    assert len(set(drawn)) > 1 and all(0.08 <= d <= 0.1 for d in drawn)     # jittered by up to 20 %


def test_forked_workers_draw_different_jitter():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: its intervals, then out
        try:
            os.write(write, json.dumps(_intervals(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    # Without a new seed in the child, both would draw the next values of the same generator.
    assert len(json.loads(child)) == 8 and json.loads(child) != _intervals(8)
