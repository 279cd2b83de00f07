"""One client process of the simulation's slower variant (:mod:`tests.simulation.processes`):
``python -m tests.simulation.worker URL GROUP SEED INDEX LOG`` runs its program, drawn from the
seed, through ylock's public API on a real ``redis-server``, and appends what it sent, heard
and did to LOG, one JSON object a line, written at once (a SIGKILL loses nothing written).

What it records is what the simulated processes record (:mod:`tests.simulation.history`):
every acquire script call of an acquisition (sent, answered, status), every renewal the
watchdog sends (sent, answered, result), every hold from the moment its owner learned it to
the moment it stopped acting on it, and each time the owner asked ``lock.lost`` before a
step of its work. The engine is wrapped, never replaced: the calls are its own.
Times are ``time.monotonic()``, one clock for every process of the machine.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import ylock
from ylock.owner import current_owner
from ylock.waiting import Polling

LEASE = 1.5
SOCKET_TIMEOUT = 0.5
POLLING = Polling(initial=0.02, maximum=0.1, jitter=0.5)     # waiter lease 1 s
PERMITS = 2


class Recorder:
    """The log: one JSON line per event, written with one ``os.write`` (atomic, unbuffered)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.mutex = threading.Lock()
        self.acquisition: int | None = None      # the acquisition under way (its tries)

    def write(self, **event: Any) -> None:
        line = (json.dumps(event) + "\n").encode()
        with self.mutex:
            os.write(self.fd, line)


def wrap(engine: Any, log: Recorder) -> None:
    """Record the acquire scripts' calls and the renewals (the engine's own methods, timed)."""
    run = engine._run
    renew = engine.renew

    def recorded_run(name: str, key: str, args: list[Any], end: float | None = None) -> Any:
        if name not in ("acquire", "sem_acquire") or log.acquisition is None:
            return run(name, key, args, end)
        sent = time.monotonic()
        try:
            reply = run(name, key, args, end)
        except Exception:
            log.write(e="try", acq=log.acquisition, sent=sent, done=None, status=None, flags=str(args[2]))
            raise
        status = 1 if reply.__class__ is int else int(reply[0])
        log.write(e="try", acq=log.acquisition, sent=sent, done=time.monotonic(), status=status, flags=str(args[2]))
        return reply

    def recorded_renew(items: Any) -> list[bool | None]:
        sent = time.monotonic()
        results: list[bool | None] = renew(items)
        done = time.monotonic()
        for item, result in zip(items, results):
            log.write(e="renew", owner=item.owner, name=item.name, mode=item.mode, lease=item.lease, sent=sent,
                      done=done, result=result)
        return results

    engine._run = recorded_run
    engine.renew = recorded_renew


def main(url: str, group: str, seed: int, index: int, path: str) -> None:
    log = Recorder(path)
    engine = ylock.engine_from_url(url, socket_timeout=SOCKET_TIMEOUT)
    wrap(engine, log)
    rng = random.Random(f"real:{seed}:{index}")
    ids = itertools.count(1)
    log.write(e="start", owner=current_owner(), pid=os.getpid())
    sys.stdin.readline()                               # the go: every process starts together
    for _ in range(rng.randint(3, 5)):
        if rng.random() < 0.3:
            target: Any = ylock.Semaphore(engine, group, "s", permits=PERMITS, fair=rng.random() < 0.7, lease=LEASE,
                                          polling=POLLING)
            kind, name, mode = "semaphore", "s", "permit"
        else:
            name = rng.choice(("a", "b"))
            target = ylock.Lock(engine, group, name, fair=name == "a", lease=LEASE, polling=POLLING)
            kind, mode = "lock", rng.choice(("write", "write", "read"))
        timeout = rng.choice((None, None, 0.0, 0.5, 2.0))
        acq = next(ids)
        log.acquisition = acq
        invoked = time.monotonic()
        log.write(e="invoke", acq=acq, kind=kind, name=name, mode=mode, fair=target.fair, t=invoked,
                  deadline=None if timeout is None else invoked + timeout)
        try:
            got = _acquire(target, mode, timeout)
        except ylock.EngineUnavailable:
            got = None
            log.write(e="done", acq=acq, t=time.monotonic(), outcome="unavailable", token=None)
        else:
            log.write(e="done", acq=acq, t=time.monotonic(), outcome="token" if got else "timeout",
                      token=target.token if got else None)
        log.acquisition = None
        if not got:
            time.sleep(rng.uniform(0, 0.2))
            continue
        hold = next(ids)
        log.write(e="hold", hold=hold, acq=acq, how="acquire", kind=kind, name=name, mode=mode, token=target.token,
                  t=time.monotonic())
        held = _work(target, hold, log, rng.uniform(0.05, 1.5 * LEASE))
        if held and mode == "write" and rng.random() < 0.25:
            down = next(ids)
            log.acquisition = down
            log.write(e="downgrade", acq=down, t=time.monotonic())
            try:
                target.rlock()
            except ylock.LockError:
                log.acquisition = None
            else:
                log.acquisition = None
                down_hold = next(ids)
                log.write(e="hold", hold=down_hold, acq=down, how="downgrade", kind=kind, name=name, mode="read",
                          token=target.token, t=time.monotonic(), parent=hold)
                _release(target, "write", hold, log)
                _work(target, down_hold, log, rng.uniform(0.05, LEASE))
                _release(target, "read", down_hold, log)
                continue
        _release(target, mode, hold, log)
        time.sleep(rng.uniform(0, 0.2))
    log.write(e="exit", t=time.monotonic())


def _acquire(target: Any, mode: str, timeout: float | None) -> bool:
    if mode == "permit":
        return bool(target.try_acquire(timeout)) if timeout is not None else (target.acquire() or True)
    if mode == "write":
        return bool(target.try_lock(timeout)) if timeout is not None else (target.lock() or True)
    return bool(target.try_rlock(timeout)) if timeout is not None else (target.rlock() or True)


def _work(target: Any, hold: int, log: Recorder, seconds: float) -> bool:
    """Work for ``seconds``, asking ``lost`` before every step; whether it still holds."""
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        held = not target.lost
        log.write(e="read", hold=hold, t=now, held=held)
        if not held or now >= end:
            return held
        time.sleep(min(0.03, end - now))


def _release(target: Any, mode: str, hold: int, log: Recorder) -> None:
    held = not target.lost
    log.write(e="read", hold=hold, t=time.monotonic(), held=held)
    log.write(e="end", hold=hold, t=time.monotonic(), why="release" if held else "lost")
    release: Callable[[], None] = (target.release if mode == "permit" else
                                   target.unlock if mode == "write" else target.runlock)
    try:
        release()
    except ylock.LockLost:
        log.write(e="released", hold=hold, t=time.monotonic(), held=False)
    except ylock.EngineUnavailable:
        pass
    else:
        log.write(e="released", hold=hold, t=time.monotonic(), held=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
