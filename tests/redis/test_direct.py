"""The lock path's direct connections (ylock.engines.redis.calls): a dropped socket is
replaced once, an error reply keeps the connection, a timeout never leaves a stale reply
behind, and threads that come and go do not grow the number of connections."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

import ylock
from tests.helpers import wait_until
from ylock.engines.redis import sockets
from ylock.engines.redis.calls import DirectCalls
from ylock.testing.redis import RedisServer


def _clients(admin: redis.Redis, name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def _clients_once_settled(admin: redis.Redis, name: str, expected: int, timeout: float = 5.0) -> int:
    """The server drops a closed client when its event loop next sees the socket's EOF, not
    when ``close()`` returns: read CLIENT LIST until it shows ``expected`` or time is up."""
    deadline = time.monotonic() + timeout
    while (count := _clients(admin, name)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return count


def test_a_connection_the_server_dropped_is_replaced_once(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url, client_name="ylock-direct-drop")
    lock = ylock.Lock(engine, group, "drop")
    lock.lock()
    lock.unlock()
    admin = redis.Redis.from_url(redis_server.url)
    assert admin.client_kill_filter(_type="normal", skipme=True, laddr=None, user=None) >= 1
    lock.lock()                          # the dead socket is found, replaced, the call succeeds
    assert lock.held()
    lock.unlock()
    assert _clients(admin, "ylock-direct-drop") == 1
    engine.close()


def test_an_error_reply_keeps_the_connection(redis_server):
    pool = redis.ConnectionPool.from_url(redis_server.url)
    call = DirectCalls(pool)
    assert call("SET", "ylock-direct-k", "v") == b"OK"
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        call("LPUSH", "ylock-direct-k", "x")
    assert len(call.idle) == 1 and call.idle[0].is_connected
    assert call("GET", "ylock-direct-k") == b"v"     # the same connection, reading its own reply
    pool.disconnect()


def test_a_timeout_leaves_no_stale_reply_and_is_not_retried():
    with RedisServer() as server:
        pool = redis.ConnectionPool.from_url(server.url, socket_timeout=0.3)
        call = DirectCalls(pool)
        assert call("ECHO", "warm") == b"warm"
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                call("ECHO", "first")
            assert time.monotonic() - started < 0.3 * 2      # one socket timeout, no second try
        finally:
            server.resume()
        # The server answers "first" now; the next call must read its own reply.
        assert call("ECHO", "second") == b"second"
        pool.disconnect()


def test_threads_that_come_and_go_reuse_connections(redis_server, group):
    engine = ylock.engine_from_url(redis_server.url, client_name="ylock-direct-threads")
    admin = redis.Redis.from_url(redis_server.url)
    admin.script_flush()    # the first wave's threads all find the scripts missing at once: they load
    #                         them on the lock path's connections, not on one more each from the pool
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            lock = ylock.Lock(engine, group, f"t{i % 4}")
            for _ in range(20):
                with lock:
                    pass
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    for _ in range(10):                # ten waves of four short-lived threads (a threaded server)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert _clients(admin, "ylock-direct-threads") <= 4
    engine.close()
    assert _clients_once_settled(admin, "ylock-direct-threads", 0) == 0


def test_a_server_no_longer_master_drops_every_parked_connection():
    # A READONLY reply on one lock-path connection (its server became a replica, as a
    # failover makes of an old master) makes every parked connection reconnect before its
    # next use, so that none keeps talking to that server.
    server, other = RedisServer().start(), RedisServer().start()
    pool = redis.ConnectionPool.from_url(server.url)
    calls = DirectCalls(pool)
    try:
        held = [calls.checkout(None) for _ in range(3)]
        for conn in held:
            calls.checkin(conn)
        assert calls("PING") == b"PONG"
        assert all(c._sock is not None for c in calls.idle)
        sockets = {id(c): c._sock for c in calls.idle}
        admin = redis.Redis.from_url(server.url)
        admin.replicaof("127.0.0.1", other.port)
        with pytest.raises(redis.exceptions.ReadOnlyError):
            calls("EVAL", "return redis.call('SET', KEYS[1], 'v')", 1, "k")
        admin.replicaof("NO", "ONE")
        for _ in range(len(held)):                    # each parked connection in turn
            conn = calls.idle.pop(0)
            calls.idle.append(conn)
            assert calls("EVAL", "return redis.call('SET', KEYS[1], 'v')", 1, "k") == b"OK"
        assert all(c._sock is not None and c._sock is not sockets[id(c)] for c in calls.idle)
    finally:
        pool.disconnect()
        server.stop()
        other.stop()


# -- the lock path's own reply reader (sockets.Replies) -------------------------------------------

#: Replies of every RESP2 kind, nested, empty and nil, an error inside an array, and one far
#: larger than a socket read (so that it is parsed from many reads).
_SHAPES = """
local big = string.rep('x', 300000)
if ARGV[1] == 'int' then return -42 end
if ARGV[1] == 'status' then return redis.status_reply('FINE') end
if ARGV[1] == 'nil' then return false end
if ARGV[1] == 'empty' then return {} end
if ARGV[1] == 'nested' then return {1, 'two', {3, {'', 'x'}, {}}, redis.error_reply('ERR inner')} end
if ARGV[1] == 'big' then return {big, 7, big} end
if ARGV[1] == 'map' then
  redis.setresp(3) redis.call('HSET', KEYS[1] .. 'h', 'a', '1', 'b', '2') return redis.call('HGETALL', KEYS[1] .. 'h')
end
if ARGV[1] == 'set' then
  redis.setresp(3) redis.call('SADD', KEYS[1], 'a', 'b') return redis.call('SMEMBERS', KEYS[1])
end
if ARGV[1] == 'double' then redis.setresp(3) return {double = 1.5} end
return redis.error_reply('NOSUCH thing')
"""


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("shape", ["int", "status", "nil", "empty", "nested", "big", "map", "set", "double"])
def test_the_lock_path_reads_every_reply_as_redis_py_does(redis_server, shape, protocol):
    pool = redis.ConnectionPool.from_url(redis_server.url, protocol=protocol)
    call = DirectCalls(pool)
    sha = redis.Redis(connection_pool=pool).script_load(_SHAPES)
    mine = call("EVALSHA", sha, 1, "ylock-direct-set", shape)
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", sha, 1, "ylock-direct-set", shape)
        theirs = conn.read_response()
    finally:
        pool.release(conn)
    assert conn.protocol in (protocol, str(protocol)) and call.idle[0].ylock_read.__class__.__name__ == "Replies"
    if shape == "set":
        mine, theirs = sorted(mine), sorted(theirs)
    if shape == "nested":      # exceptions compare by identity: compare their class and text
        assert (type(mine[3]), str(mine[3])) == (type(theirs[3]), str(theirs[3])) == \
            (redis.exceptions.ResponseError, "inner")
        mine, theirs = mine[:3], theirs[:3]
    assert mine == theirs
    assert call("ECHO", "next") == b"next"       # nothing of it was left to be read as the next reply
    pool.disconnect()


def test_error_replies_raise_redis_py_s_exceptions_and_pipelines_read_every_reply(redis_server):
    pool = redis.ConnectionPool.from_url(redis_server.url)
    call = DirectCalls(pool)
    with pytest.raises(redis.exceptions.NoScriptError):
        call("EVALSHA", "0" * 40, 0)
    with pytest.raises(redis.exceptions.ResponseError, match="NOSUCH thing"):
        call("EVAL", _SHAPES, 0, "error")
    # Several replies in one read: each parsed in turn, the error one raised after all are read.
    with pytest.raises(redis.exceptions.ResponseError, match="NOSUCH"):
        call.many(("SET", "ylock-direct-p", "1"), ("EVAL", _SHAPES, 0, "error"), ("INCR", "ylock-direct-p"))
    assert call.many(("GET", "ylock-direct-p"), ("ECHO", "after")) == [b"2", b"after"]
    assert len(call.idle) == 1 and call.idle[0].is_connected
    pool.disconnect()


def test_a_reconnection_starts_with_no_bytes_of_the_old_socket(redis_server):
    pool = redis.ConnectionPool.from_url(redis_server.url, socket_timeout=0.3)
    call = DirectCalls(pool)
    sha = redis.Redis(connection_pool=pool).script_load(_SHAPES)
    assert len(call("EVALSHA", sha, 0, "big")[0]) == 300000
    conn = call.idle[0]
    # Two replies in one read: the second stays in the reader's buffer after the first.
    conn._sock.sendall(b"*2\r\n$4\r\nECHO\r\n$5\r\nstale\r\n*2\r\n$4\r\nECHO\r\n$8\r\nleftover\r\n")
    assert conn.ylock_read() == b"stale"
    if not conn.ylock_read.buf:      # the second came in a read of its own: put it there
        conn.ylock_read.buf = b"$8\r\nleftover\r\n"
    conn.disconnect()                # e.g. a call interrupted before it read its reply
    assert call("ECHO", "fresh") == b"fresh"      # a new socket: not the rest of the old reply
    pool.disconnect()


#: What the server sends, in reads of their own, and the replies they make: an integer whole,
#: cut in two, two to a read, an integer then a bulk string, cut inside its CRLF.
INTEGER_READS: list[tuple[list[bytes], list[object]]] = [
    ([b":-42\r\n"], [-42]),
    ([b":12", b"34\r\n"], [1234]),
    ([b":5\r\n:6\r\n"], [5, 6]),
    ([b":7\r\n$2\r\nab\r\n"], [7, b"ab"]),
    ([b":8\r", b"\n"], [8]),
]


def _read_into(read: object, got: list[object], count: int) -> None:
    got.extend(read() for _ in range(count))  # type: ignore[operator]


def test_integer_replies_read_whole_split_or_several_to_a_read(redis_server):
    """The reader's shortcut for a lone integer reply (the lock path's usual one) hands every
    other arrangement to the parser: an integer cut across two reads, two replies in one
    read, an integer then a bulk string; an empty read is the server gone."""
    pool = redis.ConnectionPool.from_url(redis_server.url)
    call = DirectCalls(pool)
    assert call("SET", "ylock-direct-i", "0") == b"OK"
    conn = call.idle[0]
    read = conn.ylock_read
    ours, theirs = socket.socketpair()
    real, conn._sock = conn._sock, ours
    try:
        for chunks, expected in INTEGER_READS:
            got: list[object] = []
            reader = threading.Thread(target=_read_into, args=(read, got, len(expected)))
            reader.start()
            for i, chunk in enumerate(chunks):
                if i:      # the reader has taken the first part alone: the rest comes in a read of its own
                    wait_until(lambda c=chunks[0]: read.buf == c, what="the first part read")
                theirs.sendall(chunk)
            reader.join(10)
            assert got == expected and read.buf == b"", (chunks, got)
        theirs.close()
        with pytest.raises(redis.exceptions.ConnectionError, match="closed by server"):
            read()
    finally:
        ours.close()
        conn._sock = real
        conn.disconnect()
    # and against the server: pipelined INCRs, their replies mostly in one read
    assert call.many(*[("INCR", "ylock-direct-i")] * 50) == list(range(1, 51))
    assert call("INCR", "ylock-direct-i") == 51
    pool.disconnect()


def _swap_socket(redis_server):
    """A direct-call connection whose socket is one end of a socketpair (the test plays the
    server at the other end); returns the pool, the connection, both ends and the real socket."""
    pool = redis.ConnectionPool.from_url(redis_server.url)
    call = DirectCalls(pool)
    assert call("PING") in (b"PONG", True)
    conn = call.idle[0]
    ours, theirs = socket.socketpair()
    real, conn._sock = conn._sock, ours
    return pool, conn, ours, theirs, real


def test_a_command_larger_than_the_socket_buffer_goes_whole(redis_server):
    """The lock path writes straight into the kernel's buffer; what does not fit at once
    (a long ylock.context, a slow reader) goes on through sendall, in order, nothing lost."""
    pool, conn, ours, theirs, real = _swap_socket(redis_server)
    data = bytes(range(256)) * (4 * 4096)               # 4 MiB, far more than a socketpair buffers
    got = bytearray()

    def drain() -> None:
        while len(got) < len(data):
            chunk = theirs.recv(1 << 16)
            if not chunk:
                return
            got.extend(chunk)
    reader = threading.Thread(target=drain)
    reader.start()
    try:
        ours.settimeout(10)
        sockets.write(conn, [data])
        reader.join(10)
        assert bytes(got) == data
    finally:
        ours.close(), theirs.close()
        conn._sock = real
        conn.disconnect()
        pool.disconnect()
    # and against the server: a 16 MiB value set and read back through the direct calls
    call = DirectCalls(redis.ConnectionPool.from_url(redis_server.url))
    big = b"y" * (16 << 20)
    assert call("SET", "ylock-direct-big", big) == b"OK"
    assert call("STRLEN", "ylock-direct-big") == len(big)
    assert call("DEL", "ylock-direct-big") == 1
    call.pool.disconnect()


def test_a_write_into_a_full_socket_buffer_times_out_and_drops_the_connection(redis_server):
    """A server that stopped reading: the kernel's buffer is full, the write waits no longer
    than the socket timeout, raises redis-py's TimeoutError, and the connection is dropped
    (part of the command may have gone)."""
    pool, conn, ours, theirs, real = _swap_socket(redis_server)
    try:
        ours.setblocking(False)
        with pytest.raises(BlockingIOError):
            while True:                                  # fill it: nobody reads at the other end
                ours.send(b"x" * 65536)
        ours.settimeout(0.2)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError, match="writing"):
            sockets.write(conn, [b"*1\r\n$4\r\nPING\r\n"])
        assert 0.2 <= time.monotonic() - started < 2.0
        assert conn._sock is None                        # dropped
    finally:
        ours.close(), theirs.close()
        real.close()
        pool.disconnect()
