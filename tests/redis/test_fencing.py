"""Fencing tokens on Redis: at least the server's clock in microseconds and above the last
one, so still increasing after the fence key expired."""
from __future__ import annotations

import redis

import ylock
from tests.helpers import Runner, wait_until, waiters


def test_tokens_follow_the_server_clock_and_rise_across_the_fence_expiring(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url + "?fence_retention=0.3")
    lock = ylock.Lock(engine, group, "fenced")
    client = redis.Redis.from_url(redis_server.url)
    fence = f"ylock:{{{group}:fenced}}:f"
    tokens = []
    before_us = _server_us(client)
    for _ in range(5):
        with lock:
            tokens.append(lock.token)
    after_us = _server_us(client)
    assert tokens == sorted(set(tokens))                 # strictly increasing
    assert before_us <= tokens[0] and tokens[-1] <= after_us    # each one the server clock
    assert int(client.get(fence)) == tokens[-1]
    assert 0 < client.pttl(fence) <= 300                 # bounded from its last token on
    wait_until(lambda: not client.exists(fence), what="the fence key expired")
    with lock:
        after = lock.token
    assert after > tokens[-1]
    assert abs(after - _server_us(client)) < 10 * 1_000_000       # the server clock
    engine.close()


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_a_fence_ahead_of_the_clock_is_respected(redis_server, group):
    # A fence above the clock (a clock stepped back, or more than one token per µs):
    # the next token is one above the fence, not the clock.
    engine = ylock.engine_from_url(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    ahead = _server_us(client) + 3600 * 1_000_000
    client.set(f"ylock:{{{group}:ahead}}:f", ahead)
    lock = ylock.Lock(engine, group, "ahead")
    with lock:
        assert lock.token == ahead + 1
    with lock:
        assert lock.token == ahead + 2
    # the fence holds the last token, for the retention period
    assert int(client.get(f"ylock:{{{group}:ahead}}:f")) == ahead + 2
    assert client.pttl(f"ylock:{{{group}:ahead}}:f") > 0
    engine.close()


def test_a_handoff_token_is_above_the_releasers(redis_server, group):
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
    assert got[0] is not None and got[0] > first
    engine.close()
