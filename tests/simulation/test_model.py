"""The command model answers as a real ``redis-server`` does: the same commands (every one
the scripts call, with the arguments and edge cases they use) sent to both, every answer
compared; and the Lua host converts values as Redis's scripting does."""
from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.simulation.lua import ScriptError, ScriptHost
from tests.simulation.model import CommandError, Keyspace, Status
from ylock.testing.redis import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.stop()


def _real(client: redis.Redis, *command: Any) -> Any:
    try:
        reply = client.execute_command(*command)
    except redis.ResponseError:
        return "error"       # (redis-py drops the error's code: compared as an error only)
    return "OK" if reply == b"OK" else reply


def _model(keyspace: Keyspace, *command: Any) -> Any:
    try:
        reply = keyspace.call(command[0], *(str(a).encode() if not isinstance(a, bytes) else a for a in command[1:]))
    except CommandError:
        return "error"
    return "OK" if isinstance(reply, Status) else reply


def _commands(rng: random.Random) -> Iterator[tuple[Any, ...]]:
    keys = [b"k:s", b"k:l", b"k:z", b"k:h", b"k:x", b"k:e"]
    members = [b"a", b"b", b"c", b"d"]
    for _ in range(400):
        k, m = rng.choice(keys), rng.choice(members)
        yield rng.choice([
            ("SET", k, m), ("SET", k, m, "PX", 100000), ("SET", k, m, "PX", 100000, "GET"),
            ("SET", k, m, "KEEPTTL"), ("SET", k, m, "PX", 0), ("GET", k), ("MGET", k, b"k:s", b"nope"),
            ("DEL", k, b"k:l"), ("EXISTS", k, b"k:z", k),
            ("PEXPIRE", k, 50000), ("PEXPIRE", k, 0), ("RENAME", k, b"k:x"),
            ("RPUSH", b"k:l", m, m), ("LPUSH", b"k:l", m), ("LPOP", b"k:l"), ("LLEN", b"k:l"), ("LPOS", b"k:l", m),
            ("LINDEX", b"k:l", rng.randint(-3, 3)), ("LRANGE", b"k:l", rng.randint(-4, 3), rng.randint(-4, 3)),
            ("LREM", b"k:l", rng.randint(-2, 2), m), ("LTRIM", b"k:l", rng.randint(-3, 2), rng.randint(-3, 3)),
            ("ZADD", b"k:z", rng.choice([1, 2.5, 1700000000123, -3]), m), ("ZSCORE", b"k:z", m),
            ("ZREM", b"k:z", m, b"e"),
            ("ZCARD", b"k:z"), ("ZRANGE", b"k:z", 0, -1, "WITHSCORES"), ("ZRANGE", b"k:z", -1, -1),
            ("ZRANGEBYSCORE", b"k:z", "-inf", rng.choice([2, 2.5, 1700000000123])),
            ("ZRANGEBYSCORE", b"k:z", "(1", "+inf", "WITHSCORES"), ("ZCOUNT", b"k:z", "(2", "+inf"),
            ("ZREMRANGEBYSCORE", b"k:z", "-inf", 2), ("HSET", b"k:h", m, b"1", b"e", b"2"), ("HGET", b"k:h", m),
            ("HDEL", b"k:h", m, b"e"), ("HGETALL", b"k:h"), ("GET", b"k:l"), ("LLEN", b"k:s"),
            ("HMGET", b"k:h", m, b"e", b"nope"), ("HMGET", k, m),
            ("SADD", b"k:e", m, rng.choice(members)), ("SREM", b"k:e", m, b"e"), ("SMEMBERS", b"k:e"),
            ("SCARD", b"k:e"), ("SISMEMBER", b"k:e", m), ("SADD", k, m), ("EXISTS", b"k:e", b"k:l"),
            ("PEXPIRE", b"k:e", 40000),
        ])


def test_commands_answer_as_redis(server: RedisServer) -> None:
    client = redis.Redis(port=server.port, protocol=2)   # RESP2: what a script's redis.call gets
    client.flushall()
    client.response_callbacks = {}  # type: ignore[assignment]  # the server's own answers, not redis-py's readings of them
    keyspace = Keyspace()
    compared = 0
    for command in _commands(random.Random(43)):
        seconds, micros = client.execute_command("TIME")
        keyspace.now_ms = int(seconds) * 1000 + int(micros) // 1000
        real, model = _real(client, *command), _model(keyspace, *command)
        if command[0] == "HGETALL" and isinstance(real, dict):
            real = [x for pair in real.items() for x in pair]
        if command[0] == "SMEMBERS" and isinstance(real, (list, set)):
            real = sorted(real)     # (a set's order is Redis's encoding's, not part of its answer)
        assert model == real, f"{command}: model {model!r}, redis {real!r}"
        compared += 1
        for key in (b"k:s", b"k:l", b"k:z", b"k:h", b"k:x", b"k:e"):
            real_ttl, model_ttl = client.execute_command("PTTL", key), keyspace.pttl(key)
            assert (real_ttl < 0) == (model_ttl < 0) and abs(real_ttl - model_ttl) < 2000, (command, key)
    assert compared == 400


_CONVERSIONS = """
local t = {}
table.insert(t, redis.call('SET', KEYS[1], ARGV[1]))
table.insert(t, redis.call('GET', 'missing'))
table.insert(t, redis.call('ZADD', KEYS[1] .. 'z', 1700000000000 + 0.0, 'm'))
table.insert(t, redis.call('ZSCORE', KEYS[1] .. 'z', 'm'))
table.insert(t, redis.pcall('LLEN', KEYS[1]))
table.insert(t, 3.9)
table.insert(t, true)
return {t[1]['ok'], t[2], t[3], t[4], t[5]['err'] ~= nil, t[6], t[7], 'end', false, 'after'}
"""


def test_scripts_convert_as_redis(server: RedisServer) -> None:
    client = redis.Redis(port=server.port, protocol=2)   # RESP2: what a script's redis.call gets
    client.flushall()
    real = client.eval(_CONVERSIONS, 1, "c:k", "v")
    host = ScriptHost({"t": _CONVERSIONS})
    model = host.run("t", Keyspace(), 1_700_000_000_000_000, [b"c:k"], [b"v"])
    assert model == real
    with pytest.raises(ScriptError):
        ScriptHost({"e": "return redis.call('LLEN', KEYS[1])"}).run("e", _string(), 0, [b"s"], [])
    with pytest.raises(redis.ResponseError):
        client.set("s", "x")
        client.eval("return redis.call('LLEN', KEYS[1])", 1, "s")


def _string() -> Keyspace:
    keyspace = Keyspace()
    keyspace.call("SET", b"s", b"x")
    return keyspace
