"""Faults against the ZooKeeper engine on a real server of this module's own: restarts, a
frozen server, a black-holed network, no server at all, a holder process stopped or killed
(fork: test_fork.py). Every test writes through the fenced register and the unfenced counter inside the lock
and checks exclusion with the journal of holds; every call's time is bounded from both sides.
The force-release with a queued waiter is in test_force_release.py, with Redis's; sessions
that expire, a leader killed and a quorum lost in test_zookeeper_ensemble.py."""
from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import threading
import time

import pytest

import ylock
from tests.faults import SLACK, hold_until_lost, holder_process, owners, take, timed, workers
from tests.helpers import Runner, collect, expect_event, wait_until, waiters
from ylock import events
from ylock.testing import free_port

pytestmark = pytest.mark.slow
spawn = multiprocessing.get_context("spawn")



@pytest.mark.parametrize(("down", "session"), [(1.0, 10), (4.0, 3)], ids=["1s-down", "4s-down-3s-session"])
def test_restart_keeps_the_session_and_the_hold(zookeeper, engines, journal, group, down, session, figures):
    """The server restarts with the same data (1 s down, or 4 s: longer than a 3 s session):
    the holder's session survives (ZooKeeper reloads its sessions with a fresh timeout, and
    the engine reconnects within it), so it is not reported lost, describe() still shows it,
    its release succeeds and deletes its node, and the waiter queued through the restart
    gets the lock then. (A holder is lost only if it stays cut off for a session timeout
    after the server is back: the next test.)

    The waiter's engine has ``connect_timeout=8``; with the default 2 s a queued waiter rides
    out the restart too (next test): it waits for the connection within its deadline."""
    url = zookeeper.url(f"/{group}") + "?session_timeout=10"
    # suspended=wait: a standalone server's restart keeps sessions, so the holder may wait for
    # it; the default guard would call the hold lost after half its session timeout.
    holder_engine = engines(zookeeper.url(f"/{group}") + f"?session_timeout={session}&suspended=wait")
    admin = engines(url)
    waiter_engine = engines(url + "&connect_timeout=8")
    h = ylock.Lock(holder_engine, group, "n")
    h.lock()
    h_record = workers.write_inside(h, "H", journal.checkers, writes=1, release=False)
    w = Runner(lambda: take(ylock.Lock(waiter_engine, group, "n"), journal, "W", timeout=30))
    w.start()
    wait_until(lambda: waiters(admin, group, "n"), what="W queued")
    back = expect_event(events.RECONNECTED, group)
    with collect(events.LOST) as lost:
        zookeeper.restart(down=down)
        restarted = time.monotonic()
        assert back.wait(15), "the holder's engine did not reconnect"
        reconnected = time.monotonic() - restarted
        holders, queued = owners(admin, group, "n")
        assert holders == (h_record.owner,) and len(queued) == 1, (holders, queued)
        assert not h.lost and not lost
        wait_until(lambda: waiter_engine.client.connected, what="the waiter's engine reconnected")
        workers.write_once(h_record, journal.checkers)
        h_record.ended = time.monotonic()
        unlock = timed(h.unlock).within(0, 2.0 + SLACK, "the holder's release")
        assert unlock.error is None, unlock.error                # no LockLost: the hold was never lost
    h_record.outcome, h_record.released = "released", time.monotonic()
    journal.add(h_record)
    w_record = w.outcome(15)
    handed = w_record.granted - unlock.started
    assert 0 <= handed < 1.0, f"the waiter got the lock {handed:.3f} s after the release began"
    verdict = journal.check()
    figures(f"ZooKeeper restart ({down:g} s down, session {session} s, kept): holder reconnected "
            f"{reconnected:.3f} s after the server was back, not lost; waiter in {handed:.3f} s after the "
            f"holder's release began; {verdict}")


def test_queued_waiter_rides_out_a_restart_within_its_deadline(zookeeper, engines, journal, group):
    """A restart 3 s down (the session survives it) with the default connect_timeout (2 s):
    the waiter's lock(timeout=30) should wait for the connection within its deadline ("A
    waiter waits for the connection to come back (within its deadline) and looks again", says
    the engine's docstring)."""
    url = zookeeper.url(f"/{group}") + "?session_timeout=10"
    # suspended=wait: the holder waits out the restart (the guard could call it lost at 5 s).
    holder_engine, waiter_engine, admin = engines(url + "&suspended=wait"), engines(url), engines(url)
    h = ylock.Lock(holder_engine, group, "n")
    h.lock()
    w = Runner(lambda: take(ylock.Lock(waiter_engine, group, "n"), journal, "W", timeout=30))
    w.start()
    wait_until(lambda: waiters(admin, group, "n"), what="W queued")
    zookeeper.restart(down=3.0)
    owners(admin, group, "n")                                     # connected again
    h.unlock()
    assert w.outcome(15).outcome == "released"
    journal.check()


def test_holder_cut_off_past_its_session_across_a_restart_is_lost(zookeeper, engines, proxy_to, journal, group,
                                                                  figures):
    """A restart keeps every session, with a fresh timeout (a plain restart of any length
    keeps the holder: ZooKeeper reloads its sessions). Here the holder also stays cut off
    (a black-holed proxy) for longer than its session timeout after the server is back:
    its session expires, the waiter (reconnected) gets the lock, and the holder, which kept
    writing meanwhile, is fenced off and told it lost the lock once it can reach the server."""
    proxy = proxy_to(zookeeper.port)
    # suspended=wait: the loss learnt on reconnection (with the default guard the holder is
    # told before the waiter's grant: tests/faults/test_zookeeper_guard.py)
    holder_engine = engines(f"zookeeper://{proxy.address}/{group}?session_timeout=2&suspended=wait")
    waiter_engine = engines(zookeeper.url(f"/{group}") + "?session_timeout=10&connect_timeout=8")
    admin = engines(zookeeper.url(f"/{group}"))
    inside = threading.Event()
    h = Runner(lambda: hold_until_lost(ylock.Lock(holder_engine, group, "n"), journal, inside))
    h.start()
    assert inside.wait(10)
    w = Runner(lambda: take(ylock.Lock(waiter_engine, group, "n"), journal, "W", timeout=30))
    w.start()
    wait_until(lambda: waiters(admin, group, "n"), what="W queued")
    proxy.drop()
    zookeeper.restart(down=1.0)
    restarted = time.monotonic()
    w_record = w.outcome(30)                                      # the holder's session expired meanwhile
    healed = time.monotonic()            # before heal(): the holder may learn within it (CI saw -0.2 ms)
    proxy.heal()
    h_record = h.outcome(30)
    assert w_record.outcome == "released" and h_record.outcome == "lost", (w_record, h_record)
    taken = w_record.granted - restarted
    # The restarted server reloads the holder's session with a fresh 2 s timeout, some time
    # after its process is launched (restart() returns later still, once it serves: on a busy
    # machine that was 1.3 s after the reload): not expired before launch + 2 s.
    kept = w_record.granted - zookeeper.launched
    assert kept >= 2.0, f"the waiter got the lock {kept:.3f} s after the server was launched again"
    assert taken < 2.0 * 1.5 + 1.0 + SLACK, f"the waiter got the lock {taken:.3f} s after the restart"
    told = h_record.lost_at - healed
    assert 0 <= told < 4.0, f"the holder was told {told:.3f} s after it could reach the server again"
    assert h_record.rejected >= 1, "the cut-off holder's writes after the new holder's were not rejected"
    verdict = journal.check()
    figures(f"ZooKeeper restart, holder cut off past its 2 s session: waiter in {taken:.3f} s after the "
            f"restart; holder told lost {told:.3f} s after reconnecting; {verdict}")


@pytest.mark.parametrize("fault", ["frozen", "dropped"])
def test_queued_lock_returns_within_its_timeout(zookeeper, engines, proxy_to, journal, group, fault, figures):
    """A queued lock(timeout=2) while the server is frozen (SIGSTOP) or the network drops
    everything: it returns LockTimeout or EngineUnavailable within 2 s + connect_timeout (1 s),
    never later; afterwards the lock works again (the bound is asserted last)."""
    url = zookeeper.url(f"/{group}")
    proxy = proxy_to(zookeeper.port)
    holder_engine, admin = engines(url), engines(url)
    waiter_engine = engines(f"zookeeper://{proxy.address}/{group}?connect_timeout=1")
    h = ylock.Lock(holder_engine, group, "n")
    h.lock()
    h_record = workers.write_inside(h, "H", journal.checkers, writes=1, release=False)
    w = Runner(lambda: timed(ylock.Lock(waiter_engine, group, "n").lock, timeout=2))
    w.start()
    wait_until(lambda: waiters(admin, group, "n"), what="W queued")
    faulted = time.monotonic()
    if fault == "frozen":
        zookeeper.pause()
    else:
        proxy.drop()
    try:
        outcome = w.outcome(2 + 2 * 1 + 5)
    finally:
        _end(fault, zookeeper, proxy)
    assert isinstance(outcome.error, (ylock.LockTimeout, ylock.EngineUnavailable)), outcome
    workers.write_once(h_record, journal.checkers)
    h_record.ended = time.monotonic()
    journal.add(workers.finish(h, h_record))
    assert h_record.outcome == "released", h_record
    again = timed(take, ylock.Lock(engines(url), group, "n"), journal, "W2", timeout=10)
    assert again.error is None, again.error
    verdict = journal.check()
    figures(f"ZooKeeper {fault}: queued lock(timeout=2) -> {type(outcome.error).__name__} after "
            f"{outcome.elapsed:.3f} s (overrun {outcome.elapsed - 2:+.3f} s, bound 2 + connect_timeout 1); "
            f"lock works again {again.elapsed:.3f} s after; {verdict}")
    low = 2.0 if isinstance(outcome.error, ylock.LockTimeout) else faulted - outcome.started
    outcome.within(low, 2.0 + 1.0 + SLACK, f"lock(timeout=2) with the server {fault}")


def _end(fault: str, zookeeper, proxy) -> None:
    if fault == "frozen":
        zookeeper.resume()
    else:
        proxy.heal()


@pytest.mark.parametrize("fault", ["frozen", "dropped"])
def test_unlock_while_unreachable_deletes_the_node_once_back(zookeeper, engines, proxy_to, journal, group, fault,
                                                             figures):
    """The holder releases while the server is frozen, or its network drops everything: the
    release returns within connect_timeout (EngineUnavailable), and once the server is
    reachable again its node is deleted, with its session still alive (nothing leaks until
    the session would expire): the waiter gets the lock within a bound."""
    proxy = proxy_to(zookeeper.port)
    holder_url = (zookeeper.url(f"/{group}") if fault == "frozen" else f"zookeeper://{proxy.address}/{group}")
    holder_engine = engines(holder_url + "?session_timeout=6&connect_timeout=1")
    waiter_engine = engines(zookeeper.url(f"/{group}") + "?session_timeout=6&connect_timeout=8")
    admin = engines(zookeeper.url(f"/{group}"))
    h = ylock.Lock(holder_engine, group, "n")
    h.lock()
    h_record = workers.write_inside(h, "H", journal.checkers, writes=2, release=False)
    session = holder_engine.client.client_id
    w = Runner(lambda: take(ylock.Lock(waiter_engine, group, "n"), journal, "W", timeout=30))
    w.start()
    wait_until(lambda: waiters(admin, group, "n"), what="W queued")
    if fault == "frozen":
        zookeeper.pause()
    else:
        proxy.drop()
    try:
        unlock = timed(h.unlock)
    finally:
        back = time.monotonic()
        _end(fault, zookeeper, proxy)
    assert unlock.error is None or isinstance(unlock.error, ylock.EngineUnavailable), unlock.error
    unlock.within(0.0 if unlock.error is None else 1.0 - 0.05, 1.0 + SLACK, f"unlock with the server {fault}")
    h_record.outcome = "release unavailable" if unlock.error else "released"
    journal.add(h_record)
    w_record = w.outcome(20)
    taken = w_record.granted - back
    assert 0 <= taken < 4.0, f"the waiter got the lock {taken:.3f} s after the server was back"
    assert holder_engine.client.client_id == session, "the node went with the session, not with a delete"
    assert owners(admin, group, "n") == ((), ())
    verdict = journal.check()
    figures(f"ZooKeeper {fault} during unlock: unlock -> {type(unlock.error).__name__} after {unlock.elapsed:.3f} s "
            f"(connect_timeout 1); node deleted, waiter in {taken:.3f} s after the server was back; {verdict}")


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_waiter_cancelled_before_its_queue_node_is_answered_leaves_no_node(zookeeper, engines, proxy_to, group,
                                                                             kind, caplog, figures):
    """An asyncio waiter is cancelled after its create reached the server but before the
    answer came back (every byte through the proxy takes 1.5 s each way): the node the
    create made is found and deleted all the same, so it does not stay queued, in front of
    everyone, for as long as the process's session lives; and asyncio logs nothing about it."""
    proxy = proxy_to(zookeeper.port)
    waiter_engine = engines(f"zookeeper://{proxy.address}/{group}?session_timeout=20&connect_timeout=8")
    admin = engines(zookeeper.url(f"/{group}"))

    def target(engine: ylock.Engine) -> ylock.Guard:
        if kind == "lock":
            return ylock.Lock(engine, group, "n").guard("write")
        return ylock.Semaphore(engine, group, "n", permits=1).guard("permit")

    holder = target(admin)
    holder.acquire()
    assert waiter_engine.describe(group)        # connected before the delay starts
    proxy.delay(1.5)

    seen: list[list[str]] = []

    def watch_queue() -> None:      # the control: the create did make a node (within 10 s)
        end = time.monotonic() + 10
        while not any(seen) and time.monotonic() < end:
            seen.append(waiters(admin, group, "n"))
            time.sleep(0.05)
    watcher = threading.Thread(target=watch_queue)

    async def cancelled_wait() -> float:
        sent = proxy.counters()["bytes_from_client"]
        wait = asyncio.ensure_future(target(waiter_engine).aacquire(timeout=30))
        while proxy.counters()["bytes_from_client"] < sent + 60:    # the create is on its way
            await asyncio.sleep(0.01)
        watcher.start()
        cancelled = time.monotonic()
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        return time.monotonic() - cancelled
    try:
        took = asyncio.run(cancelled_wait())
    finally:
        watcher.join()
    gc.collect()        # asyncio logs a future's unread exception when the future is collected
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert any(seen), "the create never made the waiter's node: the fault did not happen"
    assert took < 8 + SLACK, f"the cancelled call took {took:.2f} s to clean up (budget: connect_timeout 8 s)"
    wait_until(lambda: not waiters(admin, group, "n"), timeout=10, what="the cancelled waiter's node deleted")
    proxy.heal()
    holder.release()
    assert other_owner_gets(target(admin)), "the lock is blocked after the holder released"
    figures(f"ZooKeeper {kind}: a waiter cancelled before its create was answered (1.5 s each way): "
            f"its node deleted, the cancelled call returned after {took:.2f} s")


def other_owner_gets(target: ylock.Guard) -> bool:
    """Whether another owner (a thread of its own) gets ``target`` within 5 s (released then)."""
    def attempt() -> bool:
        got = target.try_acquire(timeout=5)
        if got:
            target.release()
        return got
    runner = Runner(attempt)
    runner.start()
    return bool(runner.outcome(10))


def test_unreachable_server_fails_each_call_within_its_timeout_quietly(engines, caplog, group, figures):
    """Nothing listens: after the first call (which may wait connect_timeout), each
    lock(timeout=0.5) fails within about 0.5 s, and kazoo's reconnection attempts do not log
    a page per call."""
    caplog.set_level(logging.DEBUG, logger="ylock.engines.zookeeper.kazoo")
    engine = engines(f"zookeeper://127.0.0.1:{free_port()}/{group}?connect_timeout=1")
    lock = ylock.Lock(engine, group, "n")
    first = timed(lock.lock, timeout=0.5).within(0.5 - 0.05, 1.0 + SLACK, "the first call")
    assert isinstance(first.error, ylock.EngineUnavailable), first
    caplog.clear()
    calls = [timed(lock.lock, timeout=0.5) for _ in range(20)]
    for call in calls:
        assert isinstance(call.error, (ylock.EngineUnavailable, ylock.LockTimeout)), call
        call.within(0.5 - 0.05, 0.5 + SLACK, "a call with timeout=0.5")
    lines = [r for r in caplog.records if r.name.startswith("ylock.engines.zookeeper.kazoo")]
    assert len(lines) <= 5, f"{len(lines)} kazoo log records over 20 calls: {[r.getMessage() for r in lines[:8]]}"
    figures(f"ZooKeeper unreachable: first call {first.elapsed:.3f} s, then max "
            f"{max(c.elapsed for c in calls):.3f} s per lock(timeout=0.5); {len(lines)} kazoo log records in 20 calls")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_holder_process_killed_or_stopped_past_its_session(zookeeper, engines, journal, group, how, figures):
    """A holder process is killed, or stopped (SIGSTOP) past its 2 s session, inside the lock:
    a waiter gets the lock once the session expired (not before: exclusion holds while it
    lives); a stopped holder, resumed, writes at once with its stale token, which the fenced
    register rejects, and is told it lost the lock."""
    url = zookeeper.url(f"/{group}") + "?session_timeout=2"
    with holder_process(url, group, 30.0, journal, how) as holder:
        w = ylock.Lock(engines(url), group, "n")
        taking = timed(w.lock, timeout=20)
        assert taking.error is None, taking.error
        taken = taking.started + taking.elapsed - holder.stopped
        assert 2.0 / 2 <= taken <= 2.0 * 1.5 + 1.0, f"the waiter got the lock {taken:.3f} s after the {how}"
        w_record = journal.hold(w, "W", writes=2)
    assert w_record.token > holder.record.token
    verdict = journal.check()
    figures(f"ZooKeeper holder {how} (session 2 s): waiter in {taken:.3f} s; {verdict}")
