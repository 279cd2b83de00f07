"""Faults on a real PostgreSQL: processes that die or freeze past their lease; a network
that drops everything. Every test checks exclusion (the fenced register) or that the lock
is free again, and notes the figures it measured. The racing counter and the server
restart are test_sql.py's, run on both SQL engines."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

import ylock
from tests.faults import workers as fault_workers
from tests.helpers import Runner, expect_event, wait_until, waiters
from tests.postgres import workers
from ylock import events
from ylock.testing.fencing import FencedRegister
from ylock.testing.proxy import TcpProxy

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")


def start_holder(url: str, group: str, lease: float, register: str) -> tuple[multiprocessing.Process, object, int]:
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=fault_workers.hold, args=(url, group, child, lease, register), daemon=True)
    proc.start()
    assert parent.poll(30), "the holder did not start"
    kind, token, _ = parent.recv()
    assert kind == "acquired"
    return proc, parent, token


def freed_after_sigkill(engine: ylock.Engine, group: str, pid: int) -> float:
    """Queue a waiter for ``group``/n (held by process ``pid``), SIGKILL that process, and
    return the seconds from the kill to the waiter's acquisition."""
    def wait() -> float:
        waiter = ylock.Lock(engine, group, "n")
        waiter.lock(timeout=10)
        got = time.monotonic()
        waiter.unlock()
        return got
    runner = Runner(wait)
    runner.start()
    wait_until(lambda: len(waiters(engine, group, "n")) == 1, what="a queued waiter")
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    return runner.outcome() - killed  # type: ignore[no-any-return]


def test_a_killed_holder_frees_the_lock_at_once(postgres_server, group, tmp_path, figures):
    proc, pipe, _ = start_holder(postgres_server.url, group, 30.0, str(tmp_path / "r.json"))  # keep the pipe:
    engine = ylock.engine_from_url(postgres_server.url)                                      # it exits without it
    freed = freed_after_sigkill(engine, group, proc.pid)
    engine.close()
    proc.join(5)
    pipe.close()
    figures(f"holder SIGKILLed (lease 30 s): lock free after {freed * 1000:.1f} ms")
    assert freed < 0.5


def test_a_killed_waiter_leaves_the_queue(postgres_server, group, figures):
    engine = ylock.engine_from_url(postgres_server.url)
    holder = ylock.Lock(engine, group, "n")
    holder.lock()
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=workers.wait_forever, args=(postgres_server.url, group, child), daemon=True)
    proc.start()
    assert parent.poll(30)
    _, owner = parent.recv()
    wait_until(lambda: waiters(engine, group, "n") == [f"write:{owner}"], what="the child queued")
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: waiters(engine, group, "n") == [], timeout=5, what="the dead waiter left the queue")
    figures(f"waiter SIGKILLed: out of the server's queue after {time.monotonic() - killed:.2f} s "
           "(client_connection_check_interval 1 s)")
    holder.unlock()
    engine.close()
    proc.join(5)


@pytest.mark.parametrize("scope", ["session", "transaction"])
def test_a_holder_paused_past_its_lease_is_fenced_off_and_told(postgres_server, group, tmp_path, figures, scope):
    url = f"{postgres_server.url}?scope={scope}"
    register = str(tmp_path / "register.json")
    fenced = FencedRegister(register)
    proc, pipe, stale_token = start_holder(url, group, 1.0, register)
    pipe.send("write")
    assert pipe.recv() == ("written", True)
    engine = ylock.engine_from_url(url)
    os.kill(proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        successor = ylock.Lock(engine, group, "n")
        successor.lock(timeout=10)                      # the server ended the frozen holder's session
        freed = time.monotonic() - paused
        assert successor.token > stale_token
        assert fenced.write(successor.token, "successor")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    pipe.send("write")                                   # the stale holder wakes up and writes
    assert pipe.recv() == ("written", False)             # fenced off
    deadline = time.monotonic() + 5
    lost = False
    while not lost and time.monotonic() < deadline:
        pipe.send("status")
        lost = pipe.recv()[1]
        time.sleep(0.05)
    assert lost, "the paused holder was not told it lost the lock"
    pipe.send("unlock")
    assert pipe.recv()[0] == "lost"
    successor.unlock()
    proc.join(5)
    state = fenced.state()
    assert state.value == "successor" and state.rejected == 1
    engine.close()
    figures(f"holder SIGSTOPped, scope={scope}, lease 1 s: lock taken over after {freed:.2f} s; "
           "the stale holder's write was rejected and it was told lost")
    assert 0.6 <= freed < 2.5


def test_a_network_that_drops_everything_bounds_every_call(postgres_server, group, figures):
    with TcpProxy(postgres_server.port) as proxy:
        url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        engine = ylock.engine_from_url(url + "?socket_timeout=1&connect_timeout=1&idle_connections=4")
        direct = ylock.engine_from_url(postgres_server.url)
        lost = expect_event(events.LOST, group)
        holding, let_go = threading.Event(), threading.Event()
        outcome: list[object] = []

        def hold() -> None:
            held = ylock.Lock(engine, group, "held", lease=2.0)
            held.lock()
            holding.set()
            let_go.wait(30)
            started = time.monotonic()
            try:
                held.unlock()
                outcome.append("released")
            except ylock.LockError as exc:
                outcome.append(type(exc).__name__)
            outcome.append(time.monotonic() - started)
        holder = Runner(hold)
        holder.start()
        assert holding.wait(10)
        with ylock.Lock(engine, group, "warm").write(timeout=5):   # a second connection, pooled idle
            pass
        proxy.drop()
        dropped = time.monotonic()
        try:
            for timeout in (0.0, 0.5):
                started = time.monotonic()
                with pytest.raises(ylock.EngineUnavailable):
                    ylock.Lock(engine, group, "other").try_lock(timeout)
                took = time.monotonic() - started
                assert took < timeout + 1.0 + 1.0 + 0.5, took       # timeout + socket_timeout (+ a reconnection)
            # The server ends the cut-off holder's session after its lease: the lock is free.
            taken = ylock.Lock(direct, group, "held")
            assert taken.try_lock(10)
            freed = time.monotonic() - dropped
            taken.unlock()
            assert lost.wait(5), "the cut-off holder was not told"
            let_go.set()
            holder.outcome(10)
            assert outcome[0] in ("LockLost", "EngineUnavailable") and outcome[1] < 1.5, outcome
        finally:
            proxy.heal()
        with ylock.Lock(engine, group, "after").write(timeout=10):
            pass
        figures(f"network dropped (lease 2 s): calls failed within timeout + socket_timeout (1 s); "
               f"the cut-off holder's lock was free after {freed:.2f} s")
        engine.close()
        direct.close()
