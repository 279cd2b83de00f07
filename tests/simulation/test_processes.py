"""The simulation's slower variant: real client processes on a real ``redis-server``, a holder
stopped (SIGSTOP) past its lease while another process takes its lock, a process killed
(SIGKILL), and the same checker over their recorded history (:mod:`tests.simulation.processes`).

``YLOCK_SIM_REAL_SCHEDULES`` (default 2) schedules run, from ``YLOCK_SIM_START``; a failure
prints the schedule's seed (its programs and faults; real timing does not replay)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.simulation.checker import check
from tests.simulation.processes import run_schedule
from ylock.testing.redis import RedisServer

SCHEDULES = int(os.environ.get("YLOCK_SIM_REAL_SCHEDULES", "2"))
START = int(os.environ.get("YLOCK_SIM_START", "0"))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


@pytest.mark.parametrize("seed", range(START, START + SCHEDULES))
def test_real_processes(server: RedisServer, seed: int) -> None:
    """Exclusion, permits, tokens and told-in-time hold over real processes and faults; the
    control: a holder was stopped past its lease and, resumed, was told it lost the lock."""
    config, history, faults = run_schedule(server.url, seed)
    problems = check(config, history)
    summary = (f"schedule {seed} (real processes): {len(history.acquisitions)} acquisitions, {len(history.holds)} "
               f"holds, stopped {faults.stopped}, killed {faults.killed}, taken meanwhile {faults.taken}")
    assert not problems, summary + "\n" + "\n".join(problems[:10])
    assert faults.stopped, summary + ": no process held a lock to stop"
    proc, _stop, cont, _ = faults.stopped[0]
    stopped = [h for h in history.holds if h.proc == proc and h.start <= _stop and (h.end is None or h.end >= cont)]
    assert stopped, summary + ": the stopped hold is not in the history"
    told = stopped[0].told_lost
    assert told is not None and told >= cont, summary + f": the stopped holder was not told it lost ({told})"
