"""What one release hands on, read from the server right after the release returns:
a fair writer at the head, or the whole run of fair readers at the head (and nobody
behind the first queued writer), with dead waiters inside the run evicted; and the release
pushes the lock to its waiter, who does not wait for its next poll."""
from __future__ import annotations

import asyncio
import threading
import time

import redis

import ylock
from tests.helpers import Runner, collect, expect_event, wait_until, waiters

SLOW = ylock.Polling.constant(1.5)     # no poll during the test: every entry is a grant


def _queue(engine, group, name, mode, tokens, release):
    def run() -> None:
        lock = ylock.Lock(engine, group, name, polling=SLOW)
        (lock.rlock if mode == "read" else lock.lock)(timeout=10)
        tokens.append(lock.token)
        release.wait(10)
        (lock.runlock if mode == "read" else lock.unlock)()
    runner = Runner(run)
    before = len(waiters(engine, group, name))
    runner.start()
    wait_until(lambda: len(waiters(engine, group, name)) == before + 1, what=f"{mode} waiter queued")
    return runner


def _info(engine, group, name):
    return next(i for i in engine.describe(group) if i.name == name)


def test_one_release_admits_the_run_of_readers_and_stops_at_a_writer(redis_engine, group):
    writer = ylock.Lock(redis_engine, group, "run")
    writer.lock()
    release = threading.Event()
    tokens: list[int] = []
    runners = [_queue(redis_engine, group, "run", "read", tokens, release) for _ in range(5)]
    runners.append(_queue(redis_engine, group, "run", "write", tokens, release))
    runners += [_queue(redis_engine, group, "run", "read", tokens, release) for _ in range(3)]
    first = writer.token
    writer.unlock()
    info = _info(redis_engine, group, "run")              # as the release left it
    assert info.mode == "read" and len(info.owners) == 5
    assert [w.split(":")[0] for w in info.waiters] == ["write", "read", "read", "read"]
    wait_until(lambda: len(tokens) == 5, what="the five readers running")
    # one token each, consecutive: one next_token call for the run
    assert min(tokens) > first and sorted(tokens) == list(range(min(tokens), min(tokens) + 5))
    release.set()
    for runner in runners:
        runner.outcome()
    assert len(tokens) == 9


def test_a_dead_reader_inside_the_run_is_evicted_with_it(redis_server, redis_engine, group):
    writer = ylock.Lock(redis_engine, group, "dead")
    writer.lock()
    release = threading.Event()
    tokens: list[int] = []
    runners = [_queue(redis_engine, group, "dead", "read", tokens, release) for _ in range(3)]
    # The middle reader "dies": its request goes, as if its process had been killed and its
    # liveness had run out (a request past its "alive until" reads the same).
    middle = waiters(redis_engine, group, "dead")[1].split(":", 1)[1]
    client = redis.Redis.from_url(redis_server.url)
    assert client.hdel(f"ylock:{{{group}:dead}}:w", middle) == 1
    with collect(ylock.events.WAITER_EVICTED) as evicted:
        writer.unlock()
    assert [e.owner for e in evicted] == [middle]
    info = _info(redis_engine, group, "dead")
    assert info.mode == "read" and len(info.owners) == 2 and middle not in info.owners
    assert info.waiters == ()
    wait_until(lambda: len(tokens) == 2, what="the two live readers running")
    release.set()
    runners[0].outcome()
    runners[2].outcome()
    # the evicted reader finds itself out of the queue at its next poll and queues again
    runners[1].outcome()
    assert len(tokens) == 3


def test_notify_hands_the_lock_over_without_waiting_for_a_poll(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    holder = ylock.Lock(engine, group, "n")
    holder.lock()
    slow_polling = ylock.Polling.constant(1.5)     # a poll would take up to 1.5 s
    acquired_at: list[float] = []

    def wait() -> None:
        lock = ylock.Lock(engine, group, "n", polling=slow_polling)
        lock.lock(timeout=10)
        acquired_at.append(time.monotonic())
        lock.unlock()
    runner = Runner(wait)
    runner.start()
    wait_until(lambda: waiters(engine, group, "n"), what="queued")
    # Queued is enough: a grant pushed before the waiter blocks waits in its list.
    released = time.monotonic()
    holder.unlock()
    runner.outcome()
    assert acquired_at[0] - released < 0.3         # the release pushed the lock to it


def test_asyncio_tasks_on_a_cluster_are_handed_the_lock_without_waiting_for_a_poll(redis_cluster_engine, group):
    """A Cluster has no shared BLPOP (keys of several slots): each waiting task blocks on its
    own notify key, as a Cluster thread does. With a 4 s poll interval a polling waiter
    would take seconds after the release (its wait is the poll interval or the lock's time to
    live, whichever is shorter: the holder is renewed to its 30 s lease first); a notified
    one takes a round trip or two."""
    engine = redis_cluster_engine
    polling = ylock.Polling.constant(4.0)
    renewed = expect_event(ylock.events.RENEWED, group)

    async def main() -> float:
        holder = ylock.Lock(engine, group, "n")
        await holder.alock()
        assert await asyncio.to_thread(renewed.wait, 10)       # its key now lives 30 s
        acquired = asyncio.Event()

        async def wait() -> None:
            lock = ylock.Lock(engine, group, "n", polling=polling)
            await lock.alock(timeout=20)
            acquired.set()
            await lock.aunlock()
        task = asyncio.create_task(wait())
        while not await asyncio.to_thread(waiters, engine, group, "n"):
            await asyncio.sleep(0.01)
        released = time.monotonic()
        await holder.aunlock()
        await asyncio.wait_for(acquired.wait(), 20)
        took = time.monotonic() - released
        await task
        return took
    took = asyncio.run(main())
    assert took < 2.0, f"the queued task got the lock {took:.2f} s after the release (a poll is 4 s)"


def test_a_writer_that_downgraded_keeps_saying_what_it_does(redis_engine, group):
    # Releasing the write lock while still reading (no queue): the release must see the
    # reader (itself) and keep its note, which describe() shows; once it stops reading, the
    # note goes.
    lock = ylock.Lock(redis_engine, group, "down")
    with ylock.context("rebuilding the index"):
        lock.lock()
    lock.rlock()
    lock.unlock()

    def said() -> dict:
        info = next(i for i in redis_engine.describe(group) if i.name == "down")
        return dict(info.context.get(ylock.current_owner(), {}))
    assert said().get("what") == "rebuilding the index" and lock.held("read")
    lock.runlock()
    assert not any(i.name == "down" for i in redis_engine.describe(group))


def test_what_a_waiter_said_is_described_while_it_waits_and_kept_by_its_grant(redis_engine, group):
    """A waiter's description travels in its request: describe() shows what it said while
    it waits, and the release that hands it the lock (to a fair writer; then to a run of
    readers) makes it the holder's description, since the grant."""
    holder = ylock.Lock(redis_engine, group, "said")
    holder.lock()
    release = {"write": threading.Event(), "read": threading.Event()}
    tokens: list[int] = []

    def queue(mode: str, what: str) -> Runner:
        def run() -> None:
            with ylock.context(what):
                lock = ylock.Lock(redis_engine, group, "said", polling=SLOW)
                (lock.rlock if mode == "read" else lock.lock)(timeout=10)
                tokens.append(lock.token)
                release[mode].wait(10)
                (lock.runlock if mode == "read" else lock.unlock)()
        runner = Runner(run)
        before = len(waiters(redis_engine, group, "said"))
        runner.start()
        wait_until(lambda: len(waiters(redis_engine, group, "said")) == before + 1, what=f"{what} queued")
        return runner

    said = ("the writer", "reader 1", "reader 2")
    runners = [queue("write", said[0]), queue("read", said[1]), queue("read", said[2])]
    owner = {what: w.split(":", 1)[1] for what, w in zip(said, waiters(redis_engine, group, "said"))}
    waiting = _info(redis_engine, group, "said")
    assert {what: waiting.context[o]["what"] for what, o in owner.items()} == {w: w for w in said}
    holder.unlock()                                        # hands the lock to the writer
    granted = _info(redis_engine, group, "said")
    writer = owner["the writer"]
    assert granted.owners == (writer,)
    assert granted.context[writer]["what"] == "the writer"
    assert granted.context[writer]["since"] >= waiting.context[writer]["since"]
    assert {granted.context[owner[r]]["what"] for r in said[1:]} == set(said[1:])   # still waiting
    wait_until(lambda: len(tokens) == 1, what="the writer running")
    release["write"].set()
    runners[0].outcome()                                   # its release granted the two readers
    readers = _info(redis_engine, group, "said")
    assert sorted(readers.owners) == sorted(owner[r] for r in said[1:]) and readers.waiters == ()
    assert {readers.context[owner[r]]["what"] for r in said[1:]} == set(said[1:])
    assert writer not in readers.context
    release["read"].set()
    for runner in runners[1:]:
        runner.outcome()
    assert len(tokens) == 3


def test_a_waiter_that_says_nothing_costs_no_note_and_is_described_from_its_grant(redis_server, redis_engine, group):
    """A waiter with no ylock.context: queueing writes its request only (no note), and the
    release that hands it the lock writes none either (the holder's record says nothing);
    describe() still shows the holder, since its grant (from its token)."""
    client = redis.Redis.from_url(redis_server.url)
    holder = ylock.Lock(redis_engine, group, "quiet")
    holder.lock()
    release = threading.Event()
    tokens: list[int] = []
    runner = _queue(redis_engine, group, "quiet", "write", tokens, release)
    (waiter,) = [w.split(":", 1)[1] for w in waiters(redis_engine, group, "quiet")]
    base = f"ylock:{{{group}:quiet}}"
    assert client.hget(f"{base}:w", waiter).decode().endswith("|1||"), "a request that says nothing ends with fair||"
    assert sorted(k.decode() for k in client.scan_iter(match=f"{base}:*")) == \
        sorted(f"{base}:{k}" for k in ("x", "q", "w")), "queueing wrote a key beyond the queue and its request"
    assert _info(redis_engine, group, "quiet").context[waiter]["since"] > 0      # described from its request
    before = time.time()
    holder.unlock()                                        # hands the lock to the waiter
    granted = _info(redis_engine, group, "quiet")
    assert granted.owners == (waiter,)
    token, _, length, rest = client.get(f"{base}:x").decode().split("|", 3)
    assert (length, rest) == ("0", waiter), "the handoff wrote a note for a holder that said nothing"
    assert abs(granted.context[waiter]["since"] - before) < 5      # from its token, the server's clock
    wait_until(lambda: len(tokens) == 1, what="the waiter running")
    assert tokens == [granted.token]
    release.set()
    runner.outcome()
