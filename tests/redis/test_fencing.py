"""Fencing tokens on Redis: one more per acquisition, and still increasing after the
fence key expired (the next token restarts from the server's clock in microseconds)."""
from __future__ import annotations

import redis

import ylock
from tests.helpers import Runner, wait_until, waiters


def test_tokens_increase_by_one_and_across_the_fence_expiring(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url + "?fence_retention=0.3")
    lock = ylock.Lock(engine, group, "fenced")
    client = redis.Redis.from_url(redis_server.url)
    fence = f"ylock:{{{group}:fenced}}:f"
    tokens = []
    for _ in range(5):
        with lock:
            tokens.append(lock.token)
    assert tokens == list(range(tokens[0], tokens[0] + 5))
    assert 0 < client.pttl(fence) <= 300                 # bounded from its first token on
    wait_until(lambda: not client.exists(fence), what="the fence key expired")
    with lock:
        after = lock.token
    assert after > tokens[-1]
    server_us = int(client.time()[0]) * 1_000_000
    assert abs(after - server_us) < 10 * 1_000_000       # restarted from the server clock
    engine.close()


def test_a_handoff_token_is_one_above_the_releasers(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "handoff")
    lock.lock()
    first = lock.token
    got: list[int | None] = []

    def wait() -> None:
        with lock:
            got.append(lock.token)

    runner = Runner(wait)
    runner.start()
    wait_until(lambda: waiters(engine, group, "handoff"), what="queued")
    lock.unlock()                          # the release grants the lock to the queued waiter
    runner.outcome()
    assert got == [first + 1]
    engine.close()
