"""Another process that holds locks, for the admin page's tests (tests/dj/test_admin.py)::

    python admin_holder.py URL GROUP hold NAME    the write lock NAME, doing "nightly export"
    python admin_holder.py URL GROUP scene        a read lock with a queued writer, two permits of a semaphore
    python admin_holder.py URL GROUP crash NAME   the write lock NAME, then dies (SIGKILL: nobody releases it)

Each prints ``held TOKEN`` (``ready`` for scene) once its holds are taken, then waits for its
standard input to close, and releases. ``hold`` also watches its lock: once it is told it
lost it (a force-release), it prints ``lost`` and exits with :data:`EXIT_LOST`.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import ylock

EXIT_LOST = 3
LEASE = 3.0          # short, so that the watchdog finds a force-release within a second


def stdin_closed() -> threading.Event:
    closed = threading.Event()

    def wait() -> None:
        sys.stdin.read()
        closed.set()
    threading.Thread(target=wait, daemon=True).start()
    return closed


def hold(engine: ylock.Engine, group: str, name: str) -> int:
    lock = ylock.Lock(engine, group, name, lease=LEASE)
    closed = stdin_closed()
    try:
        with ylock.context("nightly export", job="export-42"), lock.write(timeout=10):
            print("held", lock.token, flush=True)
            while not lock.lost and not closed.wait(0.05):
                pass
    except ylock.LockLost:
        print("lost", flush=True)
        return EXIT_LOST
    return 0


def scene(engine: ylock.Engine, group: str) -> int:
    invoices = ylock.Lock(engine, group, "invoices", lease=LEASE)
    thumbnails = ylock.Semaphore(engine, group, "thumbnails", permits=3, lease=LEASE)
    closed = stdin_closed()
    holding = threading.Barrier(4)

    def read_invoices() -> None:
        with ylock.context("monthly invoices", run=7), invoices.read():
            holding.wait()
            closed.wait()

    def resize(batch: int) -> None:
        with ylock.context("resize images", batch=batch), thumbnails.hold():
            holding.wait()
            closed.wait()

    def close_books() -> None:          # queues behind the reader; gets it once the reader is gone
        with ylock.context("close the books"), invoices.write(timeout=60):
            pass

    threads = [threading.Thread(target=f, args=a) for f, a in
               ((read_invoices, ()), (resize, (12,)), (resize, (13,)))]
    for t in threads:
        t.start()
    holding.wait()
    waiter = threading.Thread(target=close_books)
    waiter.start()
    print("ready", flush=True)
    for t in [*threads, waiter]:
        t.join()
    return 0


def crash(engine: ylock.Engine, group: str, name: str) -> int:
    lock = ylock.Lock(engine, group, name, lease=30.0)
    with ylock.context("warm the cache"):
        lock.lock(timeout=10)
    # A grant lasts a waiter lease (seconds) until the watchdog's first renewal: die after it.
    while (info := engine.describe_lock(group, name)) is None or (info.ttl or 0) < lock.lease / 2:
        time.sleep(0.05)
    print("held", lock.token, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return 1


def main(argv: list[str]) -> int:
    url, group, what, *rest = argv
    engine = ylock.engine_from_url(url)
    if what == "hold":
        return hold(engine, group, rest[0])
    if what == "crash":
        return crash(engine, group, rest[0])
    return scene(engine, group)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
