"""The fault-injection toolkit of ylock.testing, against real servers: the TCP proxy's modes
(in front of redis-server and ZooKeeper), server restarts that keep data and sessions, and
the cross-process fencing checkers."""
from __future__ import annotations

import multiprocessing
import pickle
import socket
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient, KazooState
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.helpers import Runner, wait_until
from ylock.testing.fencing import FencedRegister, UnfencedCounter
from ylock.testing.proxy import TcpProxy
from ylock.testing.redis import RedisServer
from ylock.testing.zookeeper import ZooKeeperEnsemble, ZooKeeperServer, four_letter

spawn = multiprocessing.get_context("spawn")
# kazoo reconnects with a back-off growing to 60 s by default: keep it short, so that the
# reconnection after an outage is prompt and the test measures the outage, not the back-off
FAST_RECONNECT = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5}


def redis_client(port: int, **options: Any) -> redis.Redis:
    """A client that reports the first error: redis-py's default retries would hide a fault."""
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 0), **options)


def raw_connection(port: int, timeout: float = 5.0) -> redis.Connection:
    """One connection, used directly: a pool would replace a broken connection unseen."""
    conn = redis.Connection(port=port, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))
    conn.connect()
    return conn


def command(conn: redis.Connection, *args: Any) -> Any:
    conn.send_command(*args)
    return conn.read_response()


@pytest.fixture
def proxy(redis_server):
    with TcpProxy(redis_server.port) as proxy:
        yield proxy


# -- the proxy in front of redis-server -------------------------------------------------------

def test_proxy_forwards_redis_commands_both_ways(redis_server, proxy):
    client = redis_client(proxy.port, socket_timeout=5)
    key, big = uuid.uuid4().hex, bytes(range(256)) * 12_000       # 3 MB: more than the proxy buffers
    assert client.set(key, big) is True
    assert client.get(key) == big
    pipe = client.pipeline(transaction=False)
    for _ in range(500):
        pipe.incr(key + ":n")
    assert pipe.execute() == list(range(1, 501))
    assert redis.Redis(port=redis_server.port).get(key) == big        # it reached the real server
    assert proxy.accepted == 1 and proxy.open_connections == 1
    assert proxy.bytes_to_target == proxy.bytes_from_client > len(big)
    assert proxy.bytes_to_client == proxy.bytes_from_target > len(big)
    client.close()


def test_delay_holds_each_direction_and_keeps_the_order(redis_server, proxy):
    client = redis_client(proxy.port, socket_timeout=5)
    assert client.ping()                           # connected before the delay: one round trip below
    proxy.delay(0.2)
    started = time.monotonic()
    assert client.ping()
    elapsed = time.monotonic() - started
    assert 0.4 - 0.001 <= elapsed < 0.4 + 0.35, elapsed      # 0.2 s each way, not much more
    proxy.heal()
    started = time.monotonic()
    assert client.ping()
    assert time.monotonic() - started < 0.2

    # A request read under a long delay is not overtaken by one read after the delay shrank.
    key = uuid.uuid4().hex
    conn = raw_connection(proxy.port)
    read = proxy.bytes_from_client
    proxy.delay(0.5)
    started = time.monotonic()
    conn.send_command("SET", key, "first")
    wait_until(lambda: proxy.bytes_from_client > read, what="the proxy read the first request")
    proxy.delay(0.0)
    conn.send_command("SET", key, "second")       # due at once, but queued behind the first
    assert conn.read_response() == b"OK" and conn.read_response() == b"OK"
    assert 0.5 - 0.001 <= time.monotonic() - started < 0.5 + 0.35
    assert redis.Redis(port=redis_server.port).get(key) == b"second"     # applied in the order sent
    conn.disconnect()


def test_drop_is_silent_until_heal_then_delivers_what_it_held(redis_server, proxy):
    client = redis_client(proxy.port, socket_timeout=0.3, socket_connect_timeout=1)
    assert client.ping()
    late = raw_connection(proxy.port)               # connected (its handshake done) before the drop
    proxy.drop()
    started = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError):
        client.ping()
    assert 0.3 - 0.001 <= time.monotonic() - started < 0.3 + 0.3
    accepted = proxy.accepted
    with pytest.raises(redis.exceptions.TimeoutError):               # a new connection: accepted, silent
        redis_client(proxy.port, socket_timeout=0.3).ping()
    assert proxy.accepted == accepted + 1
    # Bytes are left unread, not discarded: a write sent into the black hole lands on heal()...
    key = uuid.uuid4().hex
    late.send_command("SET", key, "late")
    # ...and so does one on a connection opened during the drop, unless its client left.
    waiting = socket.create_connection((proxy.host, proxy.port), timeout=5)
    waiting.sendall(f"SET {key}:waiting yes\r\n".encode())
    gone = socket.create_connection((proxy.host, proxy.port))
    gone.sendall(f"SET {key}:gone yes\r\n".encode())
    gone.close()
    wait_until(lambda: proxy.accepted == accepted + 3, what="both accepted")
    direct = redis.Redis(port=redis_server.port)
    assert direct.get(key) is None
    connections = direct.info("stats")["total_connections_received"]
    proxy.heal()
    assert late.read_response() == b"OK" and direct.get(key) == b"late"
    assert waiting.recv(100) == b"+OK\r\n" and direct.get(key + ":waiting") == b"yes"
    assert redis_client(proxy.port, socket_timeout=1).ping()       # a new connection works again
    # two connected to redis-server after the drop (the waiting one and the new one), not the gone one
    assert direct.info("stats")["total_connections_received"] == connections + 2
    assert direct.get(key + ":gone") is None
    late.disconnect()
    waiting.close()


def test_cut_resets_open_connections_and_keeps_listening(redis_server, proxy):
    key = uuid.uuid4().hex
    direct = redis.Redis(port=redis_server.port)
    blocked_before = direct.info("clients")["blocked_clients"]
    waiter = redis_client(proxy.port, socket_timeout=10)
    runner = Runner(lambda: waiter.blpop([key], timeout=8))
    runner.start()
    wait_until(lambda: direct.info("clients")["blocked_clients"] > blocked_before, what="BLPOP blocked")
    idle = raw_connection(proxy.port)
    assert command(idle, "PING") == b"PONG"
    assert proxy.open_connections == 2
    cut_at = time.monotonic()
    proxy.cut()
    with pytest.raises(redis.exceptions.ConnectionError):          # the command in flight fails...
        runner.outcome(timeout=5)
    assert time.monotonic() - cut_at < 1.0                           # ...at once, not at its timeout
    with pytest.raises(redis.exceptions.ConnectionError):          # and so does the idle connection
        command(idle, "PING")
    assert proxy.connections_cut == 2 and proxy.open_connections == 0
    assert redis_client(proxy.port, socket_timeout=1).ping()        # still listening, still healed
    assert proxy.accepted == 3


def test_hundreds_of_connections_survive_mode_switches_without_deadlock(redis_server, proxy):
    clients = [redis_client(proxy.port, socket_timeout=0.3, single_connection_client=True) for _ in range(240)]
    for client in clients:
        assert client.ping()
    assert proxy.open_connections == 240
    outcomes = {"ok": 0, "error": 0}
    stop = threading.Event()
    key = uuid.uuid4().hex

    def hammer(mine: list[redis.Redis]) -> None:
        while not stop.is_set():
            for client in mine:
                try:
                    client.incr(key)
                    outcomes["ok"] += 1
                except redis.exceptions.RedisError:
                    outcomes["error"] += 1      # expected when dropped or cut; it reconnects next time

    threads = [threading.Thread(target=hammer, args=(clients[i::6],), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    slowest = 0.0
    # Each switch lands mid-stream: cut() under traffic, a black hole released into a delay.
    switches = [lambda: proxy.delay(0.02), proxy.cut, proxy.heal, proxy.drop, lambda: proxy.delay(0.01), proxy.heal]
    for _ in range(3):
        for switch in switches:
            ok, errors = outcomes["ok"], outcomes["error"]
            started = time.monotonic()
            switch()
            slowest = max(slowest, time.monotonic() - started)
            if proxy.mode == "drop":
                wait_until(lambda errors=errors: outcomes["error"] > errors, timeout=10, what="a timeout")
            else:
                wait_until(lambda ok=ok: outcomes["ok"] > ok + 10, timeout=10, what=f"progress in {proxy!r}")
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "a client hung"
    assert slowest < 1.0, slowest                   # each switch is acknowledged by the loop promptly
    for client in clients:          # each works again, after the reset it may not have seen yet
        try:
            client.ping()
        except redis.exceptions.ConnectionError:
            assert client.ping()
    # The connections given up on were closed through the proxy: one per client is left.
    wait_until(lambda: proxy.open_connections == len(clients), what=f"{proxy.counters()}")
    assert proxy.connections_cut >= len(clients) and proxy.accepted >= 2 * len(clients)
    for client in clients:
        client.close()
    wait_until(lambda: proxy.open_connections == 0, what="every connection closed")


def test_stop_ends_the_thread_resets_connections_and_frees_the_port(redis_server):
    proxy = TcpProxy(redis_server.port).start()
    port = proxy.port
    conns = [raw_connection(port) for _ in range(50)]
    assert all(command(conn, "PING") == b"PONG" for conn in conns)
    proxy.stop()
    assert not [t for t in threading.enumerate() if t.name == f"TcpProxy:{port}"]
    with pytest.raises(redis.exceptions.ConnectionError):
        command(conns[0], "PING")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with socket.socket() as sock:                   # no SO_REUSEADDR: nothing may linger on the port
        sock.bind(("127.0.0.1", port))
    proxy.start()                                   # again, on the same port
    try:
        assert proxy.port == port and redis_client(port, socket_timeout=1).ping()
    finally:
        proxy.stop()
    for conn in conns:
        conn.disconnect()


# -- ZooKeeper: through the proxy, restarted, frozen ------------------------------------------

@pytest.fixture(scope="module")
def zookeeper():
    with ZooKeeperServer() as server:
        yield server


def kazoo_client(hosts: str, states: list[str] | None = None, session_timeout: float = 10.0) -> KazooClient:
    """A started kazoo client; ``states`` collects the state changes after the start."""
    client = KazooClient(hosts=hosts, timeout=session_timeout, connection_retry=FAST_RECONNECT)
    client.start(timeout=15)
    if states is not None:
        client.add_listener(states.append)
    return client


@pytest.mark.slow
def test_proxy_in_front_of_zookeeper_holds_and_resets_kazoo(zookeeper):
    with TcpProxy(zookeeper.port) as proxy:
        states: list[str] = []
        client = kazoo_client(proxy.address, states)
        try:
            session = client.client_id
            path = client.create("/toolkit/proxied", b"v1", makepath=True, ephemeral=True)
            assert client.get(path)[0] == b"v1"
            assert proxy.bytes_to_target > 0 and proxy.bytes_to_client > 0

            proxy.drop()                            # shorter than kazoo's read timeout (2/3 of 10 s)
            pending = client.get_async(path)
            with pytest.raises(client.handler.timeout_exception):
                pending.get(timeout=0.5)
            proxy.heal()
            assert pending.get(timeout=5)[0] == b"v1"      # held, then delivered: the session never noticed
            assert states == [] and client.client_id == session

            proxy.cut()                             # a reset: kazoo reconnects with the same session
            wait_until(lambda: states[-1:] == [KazooState.CONNECTED], timeout=15, what=f"reconnected: {states}")
            assert states == [KazooState.SUSPENDED, KazooState.CONNECTED]
            assert client.client_id == session and client.exists(path) is not None
            assert proxy.connections_cut == 1
        finally:
            client.stop()
            client.close()


@pytest.mark.slow
def test_zookeeper_restart_within_the_session_timeout_keeps_the_session(zookeeper):
    states: list[str] = []
    client = kazoo_client(zookeeper.hosts, states, session_timeout=10.0)
    try:
        session = client.client_id
        path = client.create("/toolkit/ephemeral", b"mine", makepath=True, ephemeral=True)
        port = zookeeper.port
        zookeeper.restart(down=0.5)
        assert zookeeper.port == port
        wait_until(lambda: states[-1:] == [KazooState.CONNECTED], timeout=15, what=f"reconnected: {states}")
        assert states == [KazooState.SUSPENDED, KazooState.CONNECTED]      # never LOST
        assert client.client_id == session
        other = kazoo_client(zookeeper.hosts)
        try:
            stat = other.exists(path)               # the server's view, not the client's
            assert stat is not None and stat.ephemeralOwner == session[0]
        finally:
            other.stop()
            other.close()
    finally:
        client.stop()
        client.close()


@pytest.mark.slow
def test_paused_zookeeper_accepts_but_never_answers(zookeeper):
    assert four_letter(zookeeper.port, "ruok") == "imok"
    zookeeper.pause()
    try:
        started = time.monotonic()
        assert four_letter(zookeeper.port, "ruok", timeout=0.5) == ""
        assert time.monotonic() - started >= 0.5 - 0.001      # waited for an answer: not refused
    finally:
        zookeeper.resume()
    wait_until(lambda: four_letter(zookeeper.port, "ruok") == "imok", what="serving again")


# -- Redis restarts ---------------------------------------------------------------------------

def test_persistent_redis_keeps_its_data_across_a_restart_and_a_plain_one_does_not(tmp_path):
    (tmp_path / "durable").mkdir()
    (tmp_path / "volatile").mkdir()
    with RedisServer(persistent=True, directory=str(tmp_path / "durable")) as durable, \
            RedisServer(directory=str(tmp_path / "volatile")) as volatile:
        for server in (durable, volatile):
            assert redis_client(server.port).set("kept", "yes") is True
            port = server.port
            server.restart(down=0.2)                # stop() is a SIGKILL: no clean shutdown
            assert server.port == port
        assert redis_client(durable.port).get("kept") == b"yes"
        assert redis_client(volatile.port).get("kept") is None


# -- fencing checkers across processes --------------------------------------------------------

def write_tokens(register: FencedRegister, writes: list[tuple[int, str]]) -> list[bool]:
    return [register.write(token, value) for token, value in writes]


def fenced_increments(register: FencedRegister, token: int, times: int, barrier: Any, results: Any) -> None:
    barrier.wait(30)
    results.put((token, sum(register.increment(token) for _ in range(times))))


def unfenced_increments(counter: UnfencedCounter, times: int, barrier: Any) -> None:
    barrier.wait(30)
    for _ in range(times):
        counter.increment()


@pytest.mark.slow
def test_fenced_register_rejects_a_stale_token_across_processes(tmp_path):
    register = FencedRegister(tmp_path / "register")
    assert len(pickle.dumps(register)) < 300          # a path, cheap to send to a child
    assert register.write(10, "parent@10") is True
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        child = pool.submit(write_tokens, register, [(5, "child@5"), (10, "child@10"), (11, "child@11")])
        assert child.result(timeout=60) == [False, True, True]
    assert register.write(10, "parent@10 again") is False      # the child's 11 fenced the parent off
    state = register.state()
    assert (state.value, state.highest_token, state.accepted, state.rejected) == ("child@11", 11, 3, 2)


@pytest.mark.slow
def test_fenced_counter_loses_nothing_where_an_unfenced_one_loses_updates(tmp_path):
    times = 150
    # Two holders overlap: the stale one (token 100) and the new one (101), concurrently.
    register = FencedRegister(tmp_path / "fenced")
    assert register.increment(100)
    results = spawn.Queue()
    barrier = spawn.Barrier(2)
    procs = [spawn.Process(target=fenced_increments, args=(register, token, times, barrier, results))
             for token in (100, 101)]
    for proc in procs:
        proc.start()
    accepted = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0
    state = register.state()
    assert accepted[101] == times                   # the newest holder is never fenced off
    assert state.value == state.accepted == 1 + accepted[100] + accepted[101]    # nothing lost
    assert state.rejected == times - accepted[100] and state.highest_token == 101

    # The control: the same two processes' worth of increments, unfenced and unlocked.
    counter = UnfencedCounter(tmp_path / "unfenced", pause=0.003)
    barrier = spawn.Barrier(2)
    procs = [spawn.Process(target=unfenced_increments, args=(counter, times, barrier)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert counter.increments == 2 * times
    assert counter.value < 2 * times and counter.lost == 2 * times - counter.value > 0
    print(f"fenced: the stale holder got {accepted[100]} increments in, then {state.rejected} rejected; "
          f"unfenced: {counter.lost} of {2 * times} updates lost")


def test_zookeeper_servers_whose_picked_port_was_taken_start_on_new_ports():
    """A port picked free may be taken before the server binds it (another process's outgoing
    connection gets it as its ephemeral port; seen in CI with three test workers): the
    standalone server (its client port) and an ensemble member (its election port, which it
    gives up on only seconds after it serves) start again on new ports."""
    server = ZooKeeperServer()
    ensemble = ZooKeeperEnsemble(3)
    election = int(ensemble.nodes[1].servers[1].rsplit(":", 1)[1])     # server 2's election port
    with socket.socket() as taken, socket.socket() as taken_election:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        taken_election.bind(("127.0.0.1", election))
        taken_election.listen()
        picked = server.port
        try:
            server.start()
            assert server.port != picked and "Mode: standalone" in four_letter(server.port, "srvr")
        finally:
            server.stop()
        try:
            ensemble.start()
            assert f":{election}" not in ensemble.nodes[1].servers[1]
            modes = sorted(n.mode() for n in ensemble.nodes)
            assert modes == ["follower", "follower", "leader"], modes
            assert all(n.proc is not None and n.proc.poll() is None for n in ensemble.nodes)
        finally:
            ensemble.stop()
