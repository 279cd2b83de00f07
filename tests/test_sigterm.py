"""``kill PID`` (SIGTERM) of a plain script gives its holds back at once, and the script
still dies of SIGTERM; a script with its own SIGTERM handler keeps it (as gunicorn and
Celery do); a script whose main thread never took a lock keeps Python's default, and its
holds their lease (the control). Real Redis, real processes (ylock.sigterm)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

import ylock
from ylock.testing.redis import RedisServer

pytestmark = pytest.mark.timeout(120)

SCRIPT = r"""
import signal, sys, threading
import ylock

url, group, how = sys.argv[1], sys.argv[2], sys.argv[3]
if how == "own":
    def own(signum, frame):
        print("own handler", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, own)
engine = ylock.engine_from_url(url)
take = lambda: (ylock.Lock(engine, group, "write", lease=60).lock(),
                ylock.Lock(engine, group, "read", lease=60).rlock(),
                ylock.Semaphore(engine, group, "permits", permits=1, lease=60).acquire())
if how == "thread":
    worker = threading.Thread(target=take)
    worker.start(); worker.join()
else:
    take()
    worker = threading.Thread(target=lambda: ylock.Lock(engine, group, "thread", lease=60).lock())
    worker.start(); worker.join()
handler = signal.getsignal(signal.SIGTERM)
print("holding", getattr(handler, "__module__", handler), flush=True)
sys.stdin.read()
"""


def free(engine: ylock.Engine, group: str) -> dict[str, bool]:
    """Which of the script's locks another process can take at once."""
    out = {}
    for name in ("write", "read"):
        lock = ylock.Lock(engine, group, name)
        out[name] = lock.try_lock(0)
        if out[name]:
            lock.unlock()
    permit = ylock.Semaphore(engine, group, "permits", permits=1)
    out["permits"] = permit.try_acquire(0)
    if out["permits"]:
        permit.release()
    return out


def kill_holder(url: str, group: str, how: str) -> tuple[int, str]:
    """Start the script, wait until it holds its locks, SIGTERM it; return its exit status
    and what it printed."""
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", SCRIPT, url, group, how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()                 # type: ignore[union-attr]
        assert line.startswith("holding"), proc.stderr.read()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(30)
        except subprocess.TimeoutExpired:
            # Say where it hung: Python's faulthandler prints every thread's stack on SIGABRT.
            proc.send_signal(signal.SIGABRT)
            proc.wait(10)
            raise AssertionError(f"still running 30 s after SIGTERM; it said: {proc.stdout.read()!r}; "  # type: ignore[union-attr]
                                 f"stderr: {proc.stderr.read()[-6000:]}") from None  # type: ignore[union-attr]
        return status, line + proc.stdout.read()      # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def redis() -> object:
    with RedisServer() as server:
        yield server


def test_sigterm_gives_holds_back_and_still_kills(redis: RedisServer, group: str) -> None:
    engine = ylock.engine_from_url(redis.url)
    try:
        status, said = kill_holder(redis.url, group, "plain")
        assert said.startswith("holding ylock.sigterm"), said
        assert status == -signal.SIGTERM, (status, said)        # died of SIGTERM, as by default
        assert free(engine, group) == {"write": True, "read": True, "permits": True}
        assert engine.describe_lock(group, "thread") is None    # a finished thread's hold too
    finally:
        engine.close()


def test_the_applications_own_handler_is_left_alone(redis: RedisServer, group: str) -> None:
    engine = ylock.engine_from_url(redis.url)
    try:
        status, said = kill_holder(redis.url, group, "own")
        assert said.startswith("holding __main__"), said        # ylock did not replace it
        assert "own handler" in said and status == 7, (status, said)
        # its handler exits normally, so the release at exit gives the holds back
        assert free(engine, group) == {"write": True, "read": True, "permits": True}
    finally:
        engine.close()


def test_without_a_lock_in_the_main_thread_the_default_stays(redis: RedisServer, group: str) -> None:
    engine = ylock.engine_from_url(redis.url)
    try:
        status, said = kill_holder(redis.url, group, "thread")
        assert said.startswith("holding signal"), said          # the enum Handlers.SIG_DFL
        assert status == -signal.SIGTERM
        assert free(engine, group) == {"write": False, "read": False, "permits": False}   # their lease, still
        for name, kind in (("write", "lock"), ("read", "lock"), ("permits", "semaphore")):
            engine.force_release(group, name, kind=kind)
    finally:
        engine.close()


def _blocked(native_id: int) -> set[int]:
    """The signals the thread ``native_id`` of this process blocks (/proc's SigBlk mask)."""
    with open(f"/proc/self/task/{native_id}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_ylocks_threads_leave_signals_to_the_applications_threads(redis: RedisServer, group: str) -> None:
    """A signal the kernel hands to one of ylock's threads would not wake a main thread
    blocked in a system call, so its handler would wait (a clean-clone CI run saw a
    script's own SIGTERM handler not run 30 s after kill): ylock's threads (here the
    watchdog, and whatever else a waiting acquisition started) block the asynchronous
    signals; the application's threads do not."""
    import threading

    engine = ylock.engine_from_url(redis.url)
    try:
        holder = ylock.Lock(engine, group, "n")
        holder.lock()                                    # the watchdog renews it
        waited = threading.Thread(target=lambda: ylock.Lock(engine, group, "n").try_lock(1.0))
        waited.start()
        waited.join()                                    # it waited through the notify hub
        holder.unlock()
        ours = {t.name: t.native_id for t in threading.enumerate() if t.name.startswith("ylock-")}
        assert "ylock-watchdog" in ours, ours
        for name, native_id in ours.items():
            assert native_id is not None
            blocked = _blocked(native_id)
            assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1} <= blocked, (name, blocked)
            assert signal.SIGSEGV not in blocked and signal.SIGABRT not in blocked, (name, blocked)
        assert signal.SIGTERM not in _blocked(threading.main_thread().native_id or 0)   # the control
    finally:
        engine.close()
