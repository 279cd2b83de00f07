"""The simulation's slower variant: the same checker over histories of real client processes
(:mod:`tests.simulation.worker`) on a real ``redis-server``, with real faults: a holder
stopped (``SIGSTOP``) past its lease while this process takes its lock, and a process
killed (``SIGKILL``) at a moment drawn from the seed.

:func:`run_schedule` runs one schedule and returns its configuration and :class:`History`,
built from the processes' logs exactly as the simulated world builds its own (and this
process's own acquisitions, recorded by the same recorder). Real processes do not replay:
the seed draws the programs and the faults, not the interleaving, so the checker judges
only what holds whatever the timing (exclusion, permits, tokens, told-in-time, errors), not
fairness or idle time (:func:`~tests.simulation.checker.exact` is False for them).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ylock
from tests.simulation import worker
from tests.simulation.history import Acquisition, History, HoldRecord, Try
from tests.simulation.world import Config

__all__ = ["Faults", "run_schedule"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Faults:
    """What the nemesis did to one schedule (monotonic times)."""

    stopped: list[tuple[str, float, float, int]] = field(default_factory=list)   # proc, stop, cont, its hold
    killed: dict[str, float] = field(default_factory=dict)
    taken: list[int] = field(default_factory=list)       # this process's holds taken from a stopped holder


def run_schedule(url: str, seed: int, processes: int = 4, patience: float = 90.0) -> tuple[Config, History, Faults]:
    """Run schedule ``seed``: ``processes`` workers, one of them stopped while it holds a lock
    (past its lease: this process takes the lock meanwhile) and maybe one killed."""
    rng = random.Random(f"real:{seed}")
    group = f"simreal{seed}-{os.getpid()}"
    faults = Faults()
    with tempfile.TemporaryDirectory(prefix="ylock-sim-") as directory:
        logs = [os.path.join(directory, f"p{i}.log") for i in range(processes)]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs = [subprocess.Popen([sys.executable, "-m", "tests.simulation.worker", url, group, str(seed), str(i),
                                   logs[i]], stdin=subprocess.PIPE, cwd=ROOT, env=env)
                 for i in range(processes)]
        mine = os.path.join(directory, "this.log")
        try:
            _wait_started(logs, procs, patience)
            for p in procs:                              # go
                assert p.stdin is not None
                p.stdin.write(b"\n")
                p.stdin.flush()
            start = time.monotonic()
            kill_at = start + rng.uniform(0.5, 4.0) if rng.random() < 0.6 else None
            victim = rng.randrange(processes)
            stop_after = start + rng.uniform(0.3, 2.0)
            stopped = False
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if now - start > patience:
                    raise AssertionError(f"schedule {seed}: processes still running after {patience} s")
                if kill_at is not None and now >= kill_at:
                    kill_at = None
                    if procs[victim].poll() is None:
                        faults.killed[f"p{victim}"] = time.monotonic()
                        procs[victim].send_signal(signal.SIGKILL)
                if not stopped and now >= stop_after:
                    stopped = _stop_a_holder(url, group, logs, procs, faults, mine)
                time.sleep(0.01)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                p.wait()
        config = Config(seed=seed, engine="redis-real", processes=processes, lease=worker.LEASE,
                        socket_timeout=worker.SOCKET_TIMEOUT, poll_max=worker.POLLING.maximum, permits=worker.PERMITS,
                        semaphore=True, locks=("a", "b"), exact=False)
        history = _history(logs + [mine], faults)
    return config, history, faults


def _wait_started(logs: list[str], procs: list[subprocess.Popen[bytes]], patience: float) -> None:
    deadline = time.monotonic() + patience
    while not all(os.path.exists(log) and os.path.getsize(log) for log in logs):
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a worker exited before it started (exit status {p.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError("the workers did not start")
        time.sleep(0.02)


def _stop_a_holder(url: str, group: str, logs: list[str], procs: list[subprocess.Popen[bytes]], faults: Faults,
                   mine: str) -> bool:
    """Stop a process that holds a lock (not a permit) now, take that lock here in write mode
    (once its lease ran out on the server), give it back, and let the process go on; False
    if no process holds a lock at this moment."""
    for i, path in enumerate(logs):
        if procs[i].poll() is not None:
            continue
        hold = _open_hold(path)
        if hold is None or hold["kind"] != "lock":
            continue
        procs[i].send_signal(signal.SIGSTOP)
        stop = time.monotonic()
        if _open_hold(path) != hold:           # it let go just before it stopped: try later
            procs[i].send_signal(signal.SIGCONT)
            return False
        taken = _take(url, group, hold["name"], mine)
        # stopped past its lease whatever happened here: its first look at lock.lost must say so
        time.sleep(max(0.0, stop + 1.2 * worker.LEASE - time.monotonic()))
        cont = time.monotonic()
        procs[i].send_signal(signal.SIGCONT)
        faults.stopped.append((f"p{i}", stop, cont, hold["hold"]))
        if taken is not None:
            faults.taken.append(taken)
        return True
    return False


def _open_hold(path: str) -> dict[str, Any] | None:
    """The hold the log says its process holds now (the last one begun and not ended)."""
    holds: dict[int, dict[str, Any]] = {}
    for event in _events(path):
        if event["e"] == "hold":
            holds[event["hold"]] = event
        elif event["e"] == "end":
            holds.pop(event["hold"], None)
    return next(reversed(holds.values()), None) if holds else None


def _take(url: str, group: str, name: str, path: str) -> int | None:
    """Take ``name`` in write mode as a recorded process of its own ("this"), hold it briefly
    and release it; the id of its hold, or None if it timed out."""
    log = worker.Recorder(path)
    engine = ylock.engine_from_url(url, socket_timeout=worker.SOCKET_TIMEOUT)
    worker.wrap(engine, log)
    lock = ylock.Lock(engine, group, name, fair=name == "a", lease=worker.LEASE, polling=worker.POLLING)
    out: list[int | None] = [None]

    def run() -> None:         # in a thread of its own: its owner id is that thread's
        log.write(e="start", owner=ylock.owner.current_owner(), pid=os.getpid())
        log.acquisition = 1
        invoked = time.monotonic()
        log.write(e="invoke", acq=1, kind="lock", name=name, mode="write", fair=lock.fair, t=invoked,
                  deadline=invoked + 3 * worker.LEASE)
        got = lock.try_lock(3 * worker.LEASE)
        log.write(e="done", acq=1, t=time.monotonic(), outcome="token" if got else "timeout",
                  token=lock.token if got else None)
        log.acquisition = None
        if got:
            log.write(e="hold", hold=2, acq=1, how="acquire", kind="lock", name=name, mode="write", token=lock.token,
                      t=time.monotonic())
            worker._work(lock, 2, log, 0.2)
            worker._release(lock, "write", 2, log)
            out[0] = 2

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    engine.close()
    return out[0]


def _events(path: str) -> Iterator[dict[str, Any]]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        if line.endswith("}"):            # (a line cut by a SIGKILL is not one)
            yield json.loads(line)


def _history(logs: list[str], faults: Faults) -> History:
    """The processes' logs as one :class:`History` (ids made unique across processes)."""
    history = History(permits={"s": worker.PERMITS})
    calls = iter(range(1, 10**9))
    first_lease = min(worker.LEASE, worker.POLLING.waiter_lease)
    end = 0.0
    for index, path in enumerate(logs):
        proc = "this" if path.endswith("this.log") else f"p{index}"
        owner = ""
        acqs: dict[int, Acquisition] = {}
        holds: dict[int, HoldRecord] = {}
        renewals: list[dict[str, Any]] = []
        for event in _events(path):
            kind = event["e"]
            end = max(end, event.get("t") or event.get("done") or 0.0)
            if kind == "start":
                owner = event["owner"]
            elif kind in ("invoke", "downgrade"):
                # (a downgrade asks with its deadline now: the steps make its first try)
                a = Acquisition(len(history.acquisitions) + 1000 * (index + 1), proc, owner,
                                (event.get("kind", "lock"), event.get("name", "")), event.get("mode", "read"),
                                bool(event.get("fair", True)), event["t"], event.get("deadline", event["t"]))
                acqs[event["acq"]] = a
                if kind == "invoke":
                    history.acquisitions.append(a)
            elif kind == "try":
                a = acqs[event["acq"]]
                # the engine's own first try: made unless the deadline had passed
                first = not a.tries and (a.deadline is None or a.deadline > event["sent"])
                a.tries.append(Try(event["sent"], event["flags"], event["done"], event["status"], next(calls),
                                   first=first))
            elif kind == "done":
                a = acqs[event["acq"]]
                a.done, a.outcome, a.token = event["t"], event["outcome"], event["token"]
            elif kind == "hold":
                a = acqs[event["acq"]]
                parent = holds[event["parent"]].id if event.get("parent") in holds else None
                h = HoldRecord(len(history.holds) + 1, proc, owner, (event["kind"], event["name"]), event["mode"],
                               event["token"], event["t"], first_lease, worker.LEASE, event["how"], parent,
                               a.id if event["how"] == "acquire" else None)
                if event["how"] == "downgrade":
                    h.tries = a.tries
                holds[event["hold"]] = h
                history.holds.append(h)
            elif kind == "read":
                h = holds[event["hold"]]
                h.reads.append((event["t"], event["held"]))
                if not event["held"] and h.told_lost is None:
                    h.told_lost = event["t"]
            elif kind == "end":
                h = holds[event["hold"]]
                h.end, h.why = event["t"], event["why"]
            elif kind == "released":
                h = holds[event["hold"]]
                h.released = event["held"]
                if not event["held"] and h.told_lost is None:
                    h.told_lost = event["t"]
            elif kind == "renew":
                renewals.append(event)
        for r in renewals:          # to the latest hold of that lock and mode begun before its answer
            kind_of = "semaphore" if r["mode"] == "permit" else "lock"
            mine = [h for h in holds.values() if h.lock == (kind_of, r["name"]) and h.mode == r["mode"]
                    and h.start <= r["done"]]
            if mine:
                mine[-1].renewals.append((r["sent"], r["done"], r["result"], next(calls), r["lease"]))
        if proc in faults.killed:
            history.crashes[proc] = faults.killed[proc]
    history.pauses = [(proc, stop, cont) for proc, stop, cont, _ in faults.stopped]
    history.end = end
    return history
