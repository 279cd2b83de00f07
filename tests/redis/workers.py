"""Code run in child processes (spawned, so each is a fresh interpreter)."""
from __future__ import annotations

import os
import time
from typing import Any

import redis

import ylock


def counter(url: str, group: str, iterations: int, use_lock: bool, fair: bool = True,
            start: Any = None) -> dict[str, Any]:
    """Increment a Redis counter non-atomically (GET, pause, SET), inside the lock or not;
    with ``start`` (a barrier), every process begins at once."""
    engine = ylock.engine_from_url(url)
    lock = ylock.Lock(engine, group, "counter", fair=fair, lease=5)
    client = redis.Redis.from_url(url)
    client.ping()
    if start is not None:
        start.wait(60)
    tokens = []
    for _ in range(iterations):
        if use_lock:
            lock.lock(timeout=30)
        try:
            value = int(client.get(f"{group}:counter") or 0)
            time.sleep(0.0005)              # widen the race window a lock must close
            client.set(f"{group}:counter", value + 1)
            if use_lock:
                tokens.append(lock.token)
        finally:
            if use_lock:
                lock.unlock()
    return {"pid": os.getpid(), "tokens": tokens}



def wait_in_queue(url: str, group: str, conn: Any) -> None:
    """Queue for the write lock (it is held elsewhere) and never get it: we get killed."""
    engine = ylock.engine_from_url(url)
    conn.send(("owner", ylock.current_owner()))
    ylock.Lock(engine, group, "n", polling=ylock.Polling.constant(0.2)).lock(timeout=60)
    conn.send(("acquired", None))


def hammer(url: str, group: str, names: list[str], directory: str, stop_path: str, timeout: float,
           conn: Any, threads: int = 3) -> None:
    """Take the write locks of ``names`` (a random one at a time) in ``threads`` threads until
    ``stop_path`` exists, writing inside each hold through its name's fenced register and
    counter (:class:`tests.faults.workers.Checkers`, under ``directory``); send the records,
    every lock and release call's outcome and duration, and the Cluster redirections met."""
    import random
    import threading

    from tests.faults.workers import Checkers, write_inside

    engine = ylock.engine_from_url(url)
    checkers = {n: Checkers(os.path.join(directory, n)) for n in names}
    records: list[Any] = []
    calls: list[tuple[str, float, str]] = []          # (verb, seconds, outcome)
    mutex = threading.Lock()

    def run(who: str) -> None:
        rng = random.Random(f"{os.getpid()}:{who}")
        while not os.path.exists(stop_path):
            name = rng.choice(names)
            lock = ylock.Lock(engine, group, name, lease=5.0)
            started = time.monotonic()
            try:
                lock.lock(timeout=timeout)
            except ylock.LockError as exc:
                with mutex:
                    calls.append(("lock", time.monotonic() - started, type(exc).__name__))
                continue
            acquired = time.monotonic()
            record = write_inside(lock, who, checkers[name], writes=2)
            with mutex:
                calls.append(("lock", acquired - started, "ok"))
                calls.append(("unlock", (record.released or record.ended) - record.ended, record.outcome))
                records.append((name, record))

    workers = [threading.Thread(target=run, args=(f"{os.getpid()}-{i}",)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    conn.send((records, calls, engine.cluster_redirections()))
    engine.close()


def queue_threads(url: str, group: str, name: str, count: int, conn: Any) -> None:
    """Queue ``count`` threads for one fair lock (the parent holds it); each takes it once,
    bumps a non-atomic counter inside (GET, then SET) and releases at once. Send what each
    saw: (owner, token, granted, released), and the errors."""
    import threading

    engine = ylock.engine_from_url(url)
    counter = redis.Redis.from_url(url)
    seen: list[tuple[str, int, float, float]] = []
    errors: list[str] = []

    def run() -> None:
        lock = ylock.Lock(engine, group, name, fair=True, lease=30.0)
        try:
            lock.lock(timeout=120)
        except ylock.LockError as exc:
            errors.append(repr(exc))
            return
        granted = time.monotonic()
        value = int(counter.get(f"{group}:counter") or 0)
        counter.set(f"{group}:counter", value + 1)
        token = int(lock.token or 0)
        released = time.monotonic()
        lock.unlock()
        seen.append((ylock.current_owner(), token, granted, released))

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    conn.send(("started", None))
    for t in threads:
        t.join()
    conn.send(("done", seen, errors))
    engine.close()
