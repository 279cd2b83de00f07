"""The asyncio lock path's direct connections (``AsyncDirectCalls``), which write without
redis-py's per-command ``asyncio.wait_for``: a call still ends within its timeout (a frozen
server, a write the server does not take), never leaves a stale reply behind, replaces a
dropped connection once and keeps one after an error reply."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

from ylock.engines.redis.asockets import aread
from ylock.engines.redis.calls import AsyncDirectCalls
from ylock.testing.redis import RedisServer


def test_a_timeout_leaves_no_stale_reply_and_is_not_retried():
    async def main(server: RedisServer) -> None:
        pool = redis.asyncio.ConnectionPool.from_url(server.url, socket_timeout=0.3)
        call = AsyncDirectCalls(pool)
        assert await call("ECHO", "warm") == b"warm"
        server.pause()
        try:
            for timeout, bound in ((0.15, 0.15), (None, 0.3)):     # the call's own, else the socket's
                started = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError):
                    await call("ECHO", f"late-{timeout}", end=None if timeout is None else time.monotonic() + timeout)
                elapsed = time.monotonic() - started
                assert bound - 0.02 <= elapsed < bound * 2, (timeout, elapsed)   # no second try
        finally:
            server.resume()
        # The server answers the late ECHOs now; the next calls must read their own replies.
        assert await call("ECHO", "second", end=time.monotonic() + 1.0) == b"second"
        assert await call("ECHO", "third") == b"third"
        await pool.disconnect()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_read_deadlines_hold_with_one_timer_for_many_reads():
    """A connection's reads share one timer, re-armed only when it fires: a call with a
    shorter timeout than the armed timer still ends at its own deadline, a read after the
    timer fired and re-armed ends at its socket timeout, and a cancellation from outside
    stays a cancellation (never a TimeoutError)."""
    async def main(server: RedisServer) -> None:
        pool = redis.asyncio.ConnectionPool.from_url(server.url, socket_timeout=0.5)
        call = AsyncDirectCalls(pool)
        for i in range(50):                      # quick reads: the first armed the timer (+0.5 s)
            assert await call("ECHO", f"quick-{i}") == f"quick-{i}".encode()
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                await call("ECHO", "short", end=time.monotonic() + 0.1)      # earlier than the armed timer
            assert 0.08 <= time.monotonic() - started < 0.4
        finally:
            server.resume()
        until = time.monotonic() + 0.8           # past a timer's time, reads in flight or not
        while time.monotonic() < until:
            assert await call("ECHO", "again") == b"again"
        server.pause()
        try:
            # cancelled from outside while it waits for the reply: a cancellation
            conn = call.idle[-1]                 # connected: the call waits in its read
            task = asyncio.ensure_future(call("ECHO", "cancelled"))
            give_up = time.monotonic() + 10
            while getattr(conn, "ylock_watch", None) is None or conn.ylock_watch.task is None:
                assert not task.done() and time.monotonic() < give_up, "the call never waited for its reply"
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            server.resume()
        assert await call("ECHO", "reconnected", end=time.monotonic() + 5.0) == b"reconnected"
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                await call("ECHO", "late")
            assert 0.48 <= time.monotonic() - started < 1.2
        finally:
            server.resume()
        assert await call("ECHO", "after", end=time.monotonic() + 5.0) == b"after"     # its own reply
        await pool.disconnect()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_a_write_the_frozen_server_does_not_take_times_out_within_the_call():
    async def main(server: RedisServer) -> None:
        pool = redis.asyncio.ConnectionPool.from_url(server.url, socket_timeout=0.3)
        call = AsyncDirectCalls(pool)
        assert await call("PING") == b"PONG"
        server.pause()
        try:
            # Far more than loopback's socket buffers hold (a few MiB): the write itself has to
            # wait. Not 64 MiB: packing and buffering copy the value several times, CPU time
            # that a loaded machine stretches past any bound (CI saw 1.27 s at load 6).
            value = b"x" * (16 << 20)
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                await call("SET", "ylock-async-direct-big", value, end=time.monotonic() + 0.2)
            elapsed = time.monotonic() - started
            # within its timeout plus one socket timeout, plus the copies and the loop's turns
            # on a loaded machine; a write that waited for the server would wait for the
            # resume below, which never comes while it waits
            assert elapsed < 0.2 + 0.3 + 1.0, elapsed
        finally:
            server.resume()
        assert await call("ECHO", "after", end=time.monotonic() + 5.0) == b"after"
        await pool.disconnect()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_a_connection_the_server_dropped_is_replaced_once(redis_server):
    async def main() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(redis_server.url, client_name="ylock-async-direct-drop")
        call = AsyncDirectCalls(pool)
        assert await call("ECHO", "before") == b"before"
        admin = redis.Redis.from_url(redis_server.url)
        killed = [c for c in admin.client_list() if c.get("name") == "ylock-async-direct-drop"]
        assert len(killed) == 1
        admin.client_kill_filter(_id=killed[0]["id"])
        assert await call("ECHO", "after", end=time.monotonic() + 2.0) == b"after"   # found dead, replaced, sent again
        assert [c["name"] for c in admin.client_list()].count("ylock-async-direct-drop") == 1
        assert call.made == 1
        await pool.disconnect()

    asyncio.run(main())


def test_an_error_reply_keeps_the_connection(redis_server):
    async def main() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(redis_server.url)
        call = AsyncDirectCalls(pool)
        assert await call("SET", "ylock-async-direct-k", "v") == b"OK"
        conn = call.idle[0]
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await call("LPUSH", "ylock-async-direct-k", "x", end=time.monotonic() + 1.0)
        assert call.idle == [conn] and conn.is_connected
        assert await call("GET", "ylock-async-direct-k", end=time.monotonic() + 1.0) == b"v"   # its own reply
        assert await call.many(("ECHO", "a"), ("ECHO", "b"), end=time.monotonic() + 1.0) == [b"a", b"b"]
        await pool.disconnect()

    asyncio.run(main())


@pytest.mark.parametrize("args", [
    ("EVALSHA", "a" * 40, 1, "ylock:{orders:global}:x", "host:1:ab:42", "write", 1, 30000, 1500, ""),
    ("SET", "ключ", "значение ✓", -7, 0, 2.5, b"\x00\r\n", bytearray(b"ba"), memoryview(b"mv")),
    ("BLPOP", "k1", "k2", "wake", 5.0),
])
def test_the_lock_paths_packer_packs_as_redis_py(args):
    from ylock.engines.redis.resp import pack, packer

    conn = redis.Connection()
    assert packer(conn) is pack                          # redis-py's Python serializer, UTF-8
    assert b"".join(pack(*args)) == b"".join(conn.pack_command(*args))
    assert b"".join(pack(*args)) == b"".join(redis.asyncio.Connection().pack_command(*args))


def test_the_lock_paths_packer_refuses_what_redis_py_refuses_and_defers_to_other_encodings():
    from ylock.engines.redis.resp import pack, packer

    for bad in (True, None, object()):
        with pytest.raises(redis.exceptions.DataError):
            pack("SET", "k", bad)
    latin = redis.Connection(encoding="latin-1")
    assert packer(latin) == latin.pack_command            # not UTF-8: the connection's own
    assert packer(redis.asyncio.Connection(encoding_errors="replace")) != pack


def test_with_hiredis_the_lock_path_keeps_its_ownpacker():
    """With hiredis installed redis-py packs through hiredis, which encodes every str as UTF-8:
    the bytes :func:`pack` makes, so the lock path keeps it and its remembered script calls
    (a latin-1 connection still gets the connection's own packer). The suite runs without
    hiredis: a connection is given hiredis's serializer as redis-py would give it."""
    from ylock.engines.redis.resp import pack, packer

    conn = redis.Connection()
    conn._command_packer = redis.connection.HiredisRespSerializer()
    assert packer(conn) is pack
    latin = redis.Connection(encoding="latin-1")
    latin._command_packer = redis.connection.HiredisRespSerializer()
    assert packer(latin) == latin.pack_command


def test_script_calls_are_packed_once_and_the_memory_of_them_is_bounded(monkeypatch):
    from ylock.engines.redis import resp

    monkeypatch.setattr(resp, "PACKED_CALLS", {})
    monkeypatch.setattr(resp, "PACKED", 3)
    conn = redis.Connection()
    call = ("EVALSHA", "a" * 40, 1, "ylock:{g:n}:x", "host:1:ab:42", "write", "110", 30000, 1500, "")
    first = resp.pack(*call)
    assert resp.pack(*call) is first                     # remembered, not packed again
    assert b"".join(first) == b"".join(conn.pack_command(*call))
    # A float, a buffer, or a command other than a script call is packed every time.
    for args in (call[:7] + (2.5,) + call[8:], ("EVALSHA", "a" * 40, 0, bytearray(b"x")), ("BLPOP", "k", 1)):
        assert resp.pack(*args) is not resp.pack(*args)
        assert b"".join(resp.pack(*args)) == b"".join(conn.pack_command(*args))
    assert list(resp.PACKED_CALLS) == [call]
    long = call[:9] + ("x" * resp.PACKED_SIZE,)             # a long context: packed, not kept
    assert resp.pack(*long) is not resp.pack(*long) and list(resp.PACKED_CALLS) == [call]
    for lease in range(10):                                 # many locks: it starts again, never grows past 3
        resp.pack(*call[:7], lease, *call[8:])
        assert 1 <= len(resp.PACKED_CALLS) <= 3


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_asyncio_lock_path_reads_every_reply_as_redis_asyncio_does(redis_server, protocol):
    from tests.redis.test_direct import _SHAPES

    async def main() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(redis_server.url, protocol=protocol)
        call = AsyncDirectCalls(pool)
        client = redis.asyncio.Redis(connection_pool=pool)
        sha = await client.script_load(_SHAPES)
        for shape in ("int", "status", "nil", "empty", "nested", "big", "map", "set", "double"):
            mine = await call("EVALSHA", sha, 1, "ylock-adirect-set", shape)
            conn = await pool.get_connection()
            try:
                await conn.send_command("EVALSHA", sha, 1, "ylock-adirect-set", shape)
                theirs = await conn.read_response()
            finally:
                await pool.release(conn)
            if shape == "set":
                mine, theirs = sorted(mine), sorted(theirs)
            if shape == "nested":    # exceptions compare by identity: compare their class and text
                assert (type(mine[3]), str(mine[3])) == (type(theirs[3]), str(theirs[3])) == \
                    (redis.exceptions.ResponseError, "inner"), shape
                mine, theirs = mine[:3], theirs[:3]
            assert mine == theirs, shape
            assert await call("ECHO", "next") == b"next"     # nothing of it left for the next call
        with pytest.raises(redis.exceptions.NoScriptError):
            await call("EVALSHA", "0" * 40, 0)
        with pytest.raises(redis.exceptions.ResponseError, match="NOSUCH"):
            await call.many(("SET", "ylock-adirect-p", "1"), ("EVAL", _SHAPES, 0, "error"),
                            ("INCR", "ylock-adirect-p"))
        assert await call.many(("GET", "ylock-adirect-p"), ("ECHO", "after")) == [b"2", b"after"]
        assert len(call.idle) == 1 and call.idle[0].protocol in (protocol, str(protocol))
        assert "ylock_in" in call.idle[0].__dict__      # read by the lock path's reader, not redis.asyncio's
        await pool.disconnect()

    asyncio.run(main())


def test_integer_replies_read_whole_split_or_several_to_a_read(redis_server):
    """The asyncio reader's shortcut for a lone integer reply hands every other arrangement to
    the parser (as the threads' reader does: see tests/redis/test_direct.py)."""
    from tests.redis.test_direct import INTEGER_READS

    async def main() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(redis_server.url)
        call = AsyncDirectCalls(pool)
        assert await call("SET", "ylock-adirect-i", "0") == b"OK"
        conn = call.idle[0]
        real = conn._reader
        try:
            for chunks, expected in INTEGER_READS:
                stream = conn._reader = asyncio.StreamReader()
                reading = asyncio.ensure_future(asyncio.gather(*[aread(conn, None) for _ in expected]))
                for i, chunk in enumerate(chunks):
                    deadline = time.monotonic() + 10
                    while i and conn.__dict__.get("ylock_in", [None, b""])[1] != chunks[0]:
                        assert time.monotonic() < deadline, f"the first part of {chunks} was not read alone"
                        await asyncio.sleep(0)     # the first part read alone: the rest comes in a read of its own
                    stream.feed_data(chunk)
                got = await asyncio.wait_for(reading, 10)
                assert got == expected and conn.ylock_in[1] == b"", (chunks, got)
        finally:
            conn._reader = real
            await conn.disconnect()
        # and against the server: pipelined INCRs, their replies mostly in one read
        assert await call.many(*[("INCR", "ylock-adirect-i")] * 50) == list(range(1, 51))
        assert await call("INCR", "ylock-adirect-i") == 51
        await pool.disconnect()

    asyncio.run(main())
