"""celery_ylock.beat with real Celery processes on the session's redis-server (broker and
lock engine): three ``celery beat`` processes through SIGKILL, SIGSTOP past the lease and
SIGTERM of their leader; two ``celery worker -B``; django-celery-beat's DatabaseScheduler
wrapped; and the control, Celery's plain scheduler in two processes, which sends every run
twice. A 2 s schedule of two entries and a 3 s lease.

Every message the beats send is recorded on the receiving side (:mod:`tests.celery.beats`:
a consumer of the test's own queue, or the workers' ``record`` task), with the term's token,
the run's time and the sender from its header, and the checks read those records only:

- no entry sent twice within one period (two sends of one entry less than a period apart,
  less 50 ms for the clocks' rounding: a duplicate is milliseconds apart);
- the largest gap between two sends of an entry is at most the lease plus two periods;
- a leader paused past its lease and resumed sends nothing with its old token after the pause;
- a clean shutdown (SIGTERM) hands over within a period, and no run is skipped across it.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

import celery_ylock.beat
from tests.celery.beats import (
    Beat,
    Record,
    Recorder,
    beat_env,
    gaps,
    of,
    pid_of,
    read_records,
    time_of,
    twice_within,
    wait_for,
)
from tests.celery.conftest import started
from tests.celery.workers import ROOT, Worker

pytestmark = pytest.mark.slow

PERIOD = 2.0
LEASE = 3.0
A, B = "every-2s-a", "every-2s-b"
#: Two sends of one entry closer than this are the same run sent twice.
TWICE = PERIOD - 0.05


@pytest.fixture
def names() -> tuple[str, str]:
    """A beat lock and a queue that no other test uses."""
    tag = uuid.uuid4().hex[:10]
    return f"beat-{tag}", f"beat-{tag}"


@pytest.fixture
def beats(celery_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Beat]]:
    """Start beats (their logs go into the report of a failing test); stop them all at the end."""
    mine: list[Beat] = []

    def start(name: str, env: dict[str, str], app: str = "tests.celery.beat_app") -> Beat:
        beat = Beat(name, tmp_path, env, app=app).start()
        mine.append(beat)
        started.append(beat)            # type: ignore[arg-type]
        return beat

    try:
        yield start
    finally:
        for beat in mine:
            beat.stop()


def status_app(celery_env: dict[str, str], lock: str) -> Celery:
    """An app of this process that reads the beat lock's shared state (celery_ylock.beat.status)."""
    app = Celery("ylock_beat_status", set_as_current=False)
    app.conf.update(ylock_url=celery_env["CELERY_YLOCK_TEST_YLOCK_URL"], ylock_beat={"lock": lock})
    return app


def assert_exactly_one_sender(records: list[Record]) -> None:
    """No entry sent twice within a period, no gap past the lease plus two periods, tokens rising."""
    assert records, "nothing was sent"
    doubles = twice_within(records, TWICE)
    assert not doubles, f"sent twice within one period: {doubles}"
    for entry in (A, B):
        largest = gaps(records, entry)[0]
        assert largest[0] <= LEASE + 2 * PERIOD, f"largest gap of {entry}: {largest}"
    ordered = sorted(records, key=time_of)
    tokens = [r["token"] for r in ordered]
    assert all(isinstance(t, int) for t in tokens), f"a send without the term's token: {ordered}"
    assert tokens == sorted(tokens), "a send of an older term after a newer term's"
    assert len({r["task_id"] for r in records}) == len(records)


def test_three_beats_send_once_through_sigkill_sigstop_and_sigterm(
        celery_env: dict[str, str], tmp_path: Path, names: tuple[str, str], beats: Callable[..., Beat]) -> None:
    lock, queue = names
    env = beat_env(celery_env, lock=lock, record=tmp_path / "unused", queue=queue, lease=LEASE, period=PERIOD)
    recorder = Recorder(celery_env["CELERY_YLOCK_TEST_BROKER"], queue).start()
    three = [beats(f"b{i}", env) for i in (1, 2, 3)]
    by_pid = {beat.pid: beat for beat in three}
    status = status_app(celery_env, lock)

    # A leader is elected and sends.
    records = recorder.wait("a leader sends entry a twice", lambda r: len(of(r, A)) >= 2, three)
    first = pid_of(of(records, A)[-1])
    assert first in by_pid

    # SIGKILL: another beat takes over when the lease runs out.
    killed_at = time.time()
    by_pid[first].kill()
    records = recorder.wait("a stand-by takes over from the killed leader",
                            lambda r: len(of(r, A, not_pid=first, after=killed_at)) >= 2, three)
    taken_over = of(records, A, after=killed_at)[0]
    second = pid_of(taken_over)
    assert time_of(taken_over) - killed_at <= LEASE + PERIOD      # replaced within the lease (a due run at once)

    # SIGSTOP past the lease: a third beat takes over; SIGCONT: the old leader finds out before it sends.
    second_token = of(records, A, pid=second)[-1]["token"]
    stopped_log = by_pid[second].log_size()
    stopped_at = time.time()
    by_pid[second].send(signal.SIGSTOP)
    records = recorder.wait("a stand-by takes over from the stopped leader",
                            lambda r: len(of(r, A, not_pid=second, after=stopped_at)) >= 1, three)
    third = pid_of(of(records, A, not_pid=second, after=stopped_at)[0])
    resumed_at = time.time()
    by_pid[second].send(signal.SIGCONT)
    by_pid[second].wait_log("no longer leading", after=stopped_log)
    records = recorder.wait("the new leader goes on sending after the old one resumed",
                            lambda r: len(of(r, A, pid=third, after=resumed_at)) >= 2, three)

    # SIGTERM: the leader releases at once; the stand-by (the resumed beat) takes over within a period.
    termed_at = time.time()
    assert by_pid[third].terminate() == 0
    records = recorder.wait("the stand-by takes over from the leader shut down",
                            lambda r: len(of(r, A, not_pid=third, after=termed_at)) >= 2, three)
    fourth = pid_of(of(records, A, after=termed_at)[0])
    state = celery_ylock.beat.status(status)
    listed = subprocess.run([sys.executable, "-m", "ylock.cli", "--url", celery_env["CELERY_YLOCK_TEST_YLOCK_URL"],
                             "list", "--group", lock, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for beat in three:
        beat.stop()
    records = recorder.finish()

    assert_exactly_one_sender(records)
    assert {first, second, third} == set(by_pid) and fourth == second
    assert not of(records, token=second_token, after=stopped_at), "the resumed leader sent with its old token"
    assert not [r for r in of(records, pid=second, after=resumed_at) if time_of(r) < termed_at]
    log = by_pid[second].read_log()[stopped_log:]
    assert "a newer term" in log or "the hold was lost" in log, log
    assert state["leader"]["sender"].endswith(f":{fourth}")
    assert state["leader"]["since"] - termed_at <= PERIOD, (state, termed_at)
    for entry in (A, B):
        before = of(records, entry, pid=third)[-1]
        after = of(records, entry, after=termed_at, pid=fourth)[0]
        assert time_of(after) - time_of(before) < 2 * PERIOD, (before, after)     # no run skipped
    assert state["terms"] >= 4
    [held] = json.loads(listed.stdout)                                  # ylock list: who leads, since when
    [said] = held["context"].values()
    assert (held["mode"], said["what"], said["pid"]) == ("write", "celery beat", fourth), held
    assert said["scheduler"] == "celery.beat.PersistentScheduler" and said["since"] >= termed_at
    assert set(state["entries"]) == {A, B}
    assert all(r["lock"] == f"{lock}/global" and r["header_entry"] == r["entry"] for r in records)


def test_control_celery_plain_beats_send_every_run_twice(
        celery_env: dict[str, str], tmp_path: Path, names: tuple[str, str], beats: Callable[..., Beat]) -> None:
    """The fault the LeaderScheduler removes: two beats of Celery's own scheduler each send."""
    lock, queue = names
    env = beat_env(celery_env, lock=lock, record=tmp_path / "unused", queue=queue, lease=LEASE, period=PERIOD,
                   BEAT_SCHEDULER="celery.beat:PersistentScheduler")
    recorder = Recorder(celery_env["CELERY_YLOCK_TEST_BROKER"], queue).start()
    two = [beats(f"plain{i}", env) for i in (1, 2)]
    recorder.wait("both plain beats send entry a", lambda r: len({pid_of(x) for x in of(r, A)}) == 2
                  and len(of(r, A)) >= 4, two)
    for beat in two:
        beat.stop()
    records = recorder.finish()
    doubles = twice_within(records, TWICE)
    assert doubles, records
    assert any(pid_of(a) != pid_of(b) for a, b in doubles)
    assert all(r["token"] is None for r in records)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[1])


def test_two_workers_with_embedded_beats_hand_over_on_a_warm_shutdown(
        celery_env: dict[str, str], tmp_path: Path, names: tuple[str, str]) -> None:
    lock, queue = names
    path = tmp_path / "records.jsonl"
    env = beat_env(celery_env, lock=lock, record=path, queue=queue, lease=LEASE, period=PERIOD)
    pair = [Worker(f"wb{i}-{lock[-6:]}", tmp_path, app="tests.celery.beat_app", queues=queue, concurrency=1,
                   pool="solo", env=env, options=("-B", "-s", str(tmp_path / f"wb{i}-schedule"))) for i in (1, 2)]
    try:
        for worker in pair:
            started.append(worker.start())
        for worker in pair:
            worker.wait_ready()
        records = wait_for("an embedded beat sends entry a twice", lambda: read_records(path),
                           lambda r: len(of(r, A)) >= 2, pair)
        leading_beat = pid_of(of(records, A)[-1])
        leader = next(w for w in pair if w.proc is not None and w.proc.pid == _parent(leading_beat))
        other = next(w for w in pair if w is not leader)
        termed_at = time.time()
        assert leader.terminate() == 0
        records = wait_for("the other worker's beat takes over", lambda: read_records(path),
                           lambda r: len(of(r, A, not_pid=leading_beat, after=termed_at)) >= 2, pair)
        new_beat = pid_of(of(records, A, after=termed_at)[0])
        assert other.proc is not None and _parent(new_beat) == other.proc.pid
        state = celery_ylock.beat.status(status_app(celery_env, lock))
        assert other.terminate() == 0
    finally:
        for worker in pair:
            worker.stop()
    left = Recorder(celery_env["CELERY_YLOCK_TEST_BROKER"], queue).start().finish()   # what no worker ran
    records = read_records(path) + left

    assert_exactly_one_sender(records)
    assert state["leader"]["since"] - termed_at <= PERIOD, (state, termed_at)
    for entry in (A, B):
        before = of(records, entry, pid=leading_beat)[-1]
        after = of(records, entry, pid=new_beat)[0]
        assert time_of(after) - time_of(before) < 2 * PERIOD, (before, after)


def test_wraps_django_celery_beats_database_scheduler(
        celery_env: dict[str, str], tmp_path: Path, names: tuple[str, str], beats: Callable[..., Beat]) -> None:
    lock, queue = names
    env = beat_env(celery_env, lock=lock, record=tmp_path / "unused", queue=queue, lease=LEASE, period=PERIOD,
                   BEAT_DB=str(tmp_path / "beat.sqlite3"), DJANGO_SETTINGS_MODULE="tests.celery.beat_django_settings")
    subprocess.run([sys.executable, "-m", "tests.celery.beat_django_app", queue, f"{A},{B}", str(int(PERIOD))],
                   cwd=ROOT, env=env, check=True, timeout=120)
    recorder = Recorder(celery_env["CELERY_YLOCK_TEST_BROKER"], queue).start()
    two = [beats(f"db{i}", env, app="tests.celery.beat_django_app") for i in (1, 2)]
    records = recorder.wait("a leader sends entry a twice", lambda r: len(of(r, A)) >= 2, two)
    first = pid_of(of(records, A)[-1])
    leader = next(b for b in two if b.pid == first)
    killed_at = time.time()
    leader.kill()
    recorder.wait("the stand-by takes over", lambda r: len(of(r, A, not_pid=first, after=killed_at)) >= 2, two)
    for beat in two:
        beat.stop()
    records = recorder.finish()

    assert_exactly_one_sender(records)
    assert "LeaderDatabaseScheduler" in leader.read_log()
    assert len({pid_of(r) for r in records}) == 2
