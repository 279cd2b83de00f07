"""Fencing tokens on Redis: at least the server's clock in microseconds and above the last
one, so still increasing after the fence expired. The fence is the lock's x key: the
writer's record while one holds, "<token>|0|0|" alone afterwards, for the retention period."""
from __future__ import annotations

import re

import pytest
import redis

import ylock
from tests.helpers import Runner, wait_until, waiters
from ylock.engines.redis.scripts import fill
from ylock.owner import process_id


def test_tokens_follow_the_server_clock_and_rise_across_the_fence_expiring(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url + "?fence_retention=0.3")
    lock = ylock.Lock(engine, group, "fenced")
    client = redis.Redis.from_url(redis_server.url)
    fence = f"ylock:{{{group}:fenced}}:x"
    tokens = []
    before_us = _server_us(client)
    for _ in range(5):
        with lock:
            tokens.append(lock.token)
    after_us = _server_us(client)
    assert tokens == sorted(set(tokens))                 # strictly increasing
    assert before_us <= tokens[0] and tokens[-1] <= after_us    # each one the server clock
    assert client.get(fence).decode() == f"{tokens[-1]}|0|0|"     # the fence alone, once released
    assert 0 < client.pttl(fence) <= 300                 # bounded from its last hold on
    wait_until(lambda: not client.exists(fence), what="the fence key expired")
    with lock:
        after = lock.token
    assert after > tokens[-1]
    assert abs(after - _server_us(client)) < 10 * 1_000_000       # the server clock
    engine.close()


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_the_token_written_with_the_lock_is_the_one_given(redis_server, group):
    # An uncontended grant writes its token (the server clock in µs) as TIME's two parts,
    # the microseconds padded to six digits: the holder's record (the fence) carries the
    # number the caller was given, and its owner.
    engine = ylock.engine_from_url(redis_server.url)
    lock = ylock.Lock(engine, group, "written")
    client = redis.Redis.from_url(redis_server.url)
    for _ in range(20):
        with lock:
            token, deadline, length, rest = client.get(f"ylock:{{{group}:written}}:x").decode().split("|", 3)
            assert token == str(lock.token) and rest[int(length):].startswith(process_id())
            assert int(deadline) > int(token) // 1000
        assert client.get(f"ylock:{{{group}:written}}:x").decode() == f"{token}|0|0|"
    engine.close()


@pytest.mark.parametrize("micros", ["0", "7", "12345", "99999", "100000", "999999"])
def test_the_scripts_write_the_clock_s_microseconds_with_their_leading_zeros(redis_server, micros):
    # The scripts' own clock helpers, with TIME answering ``micros`` (Redis gives them
    # without leading zeros): the token's digits are those of the number.
    from importlib import resources

    common = resources.files("ylock.engines.redis").joinpath("lua", "common.lua").read_text()
    helpers = re.split(r"^--@functions.*$", common, flags=re.M)[0]      # as scripts.py reads it
    fake_time = ("local real = redis\n"
                 "local redis = {call = function(cmd, ...) if cmd == 'TIME' then return {'1764138000', ARGV[1]} end "
                 "return real.call(cmd, ...) end}\n")
    script = (fake_time + fill(helpers, 300000, 0)
              + "\nlocal tok = next_token()\nfence_to(tok)\nreturn {tostring(tok == now_us()), fmt(tok)}")
    client = redis.Redis.from_url(redis_server.url)
    client.delete("ylock:{t:clock}:x")
    same, digits = client.eval(script, 1, "ylock:{t:clock}:x", micros)
    assert same == b"true" and int(digits) == 1764138000 * 1_000_000 + int(micros)
    assert digits.decode() == str(1764138000 * 1_000_000 + int(micros))
    assert client.get("ylock:{t:clock}:x") == digits + b"|0|0|"


def test_a_fence_ahead_of_the_clock_is_respected(redis_server, group):
    # A fence above the clock (a clock stepped back, or more than one token per µs):
    # the next token is one above the fence, not the clock.
    engine = ylock.engine_from_url(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    ahead = _server_us(client) + 3600 * 1_000_000
    client.set(f"ylock:{{{group}:ahead}}:x", f"{ahead}|0|0|")
    lock = ylock.Lock(engine, group, "ahead")
    with lock:
        assert lock.token == ahead + 1
    with lock:
        assert lock.token == ahead + 2
    # the fence holds the last token, for the retention period
    assert client.get(f"ylock:{{{group}:ahead}}:x").decode() == f"{ahead + 2}|0|0|"
    assert client.pttl(f"ylock:{{{group}:ahead}}:x") > 0
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
