"""Real ZooKeeper servers for tests: a standalone server or an ensemble, from Debian's
``zookeeper`` package (``/usr/share/java/zookeeper.jar``), on free loopback ports.

Each server runs in its own data directory; readiness is checked with the ``conf``
four-letter command, whose ``dataDir`` must be ours (so the server answering on the port
is the one we started).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ylock.testing import ServerError, ServerProcess, free_port
from ylock.testing.proxy import TcpProxy

JAR = os.environ.get("YLOCK_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar")
# Debian's zookeeper.jar logs through SLF4J but ships no binding (its log would be empty);
# libslf4j-java, a dependency of the package, has the simple one: INFO lines to stderr.
SLF4J_SIMPLE = "/usr/share/java/slf4j-simple.jar"


def four_letter(port: int, word: str, timeout: float = 2.0) -> str:
    """Send a four-letter command to 127.0.0.1:port and return the answer ("" if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperNode(ServerProcess):
    """One ZooKeeper server process (standalone, or member ``sid`` of an ensemble)."""

    def __init__(self, directory: Path, sid: int = 0, tick: int = 200) -> None:
        self.dir = directory
        self.sid = sid
        self.tick = tick
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.servers: list[str] = []   # "server.N=127.0.0.1:peer:election" lines (ensembles)
        # time.monotonic() when the process was last launched: the server reloads its sessions
        # after this, each with a fresh timeout, so none expires before launched + its timeout.
        self.launched = 0.0

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"tickTime={self.tick}", f"dataDir={self.data_dir}", f"clientPort={self.port}",
                 "clientPortAddress=127.0.0.1", "admin.enableServer=false", "4lw.commands.whitelist=*",
                 "initLimit=20", "syncLimit=10", "maxSessionTimeout=60000", "minSessionTimeout=400",
                 "autopurge.purgeInterval=0"]
        if self.servers:
            (self.data_dir / "myid").write_text(f"{self.sid}\n")
            lines += self.servers
        path = self.dir / "zoo.cfg"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> ZooKeeperNode:
        if not os.path.exists(JAR) or shutil.which("java") is None:
            raise ServerError(f"ZooKeeper is not installed ({JAR}, java): apt-get install zookeeper")
        main = "org.apache.zookeeper.server.quorum.QuorumPeerMain" if self.servers else \
            "org.apache.zookeeper.server.ZooKeeperServerMain"
        config = self.write_config()
        classpath = ["/etc/zookeeper/conf", JAR] + ([SLF4J_SIMPLE] if os.path.exists(SLF4J_SIMPLE) else [])
        log = open(self.log, "ab")
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(
            ["java", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true",
             "-Dorg.slf4j.simpleLogger.showDateTime=true",
             "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS", "-cp", ":".join(classpath), main, str(config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def ready(self) -> bool:
        """True once this node answers and serves (standalone, leader or follower)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        if f"dataDir={self.data_dir}" not in four_letter(self.port, "conf"):
            return False
        return "Mode: " in four_letter(self.port, "srvr")

    def mode(self) -> str:
        for line in four_letter(self.port, "srvr").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return ""

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def stop(self) -> None:
        super().stop()
        self.proc = None

    def restart(self, down: float = 0.0, timeout: float = 60.0) -> None:
        """Kill the server, stay down ``down`` seconds, start it again on the same port with
        the same data directory, and wait until it serves.

        The transaction log is synced before the server answers a request (ZooKeeper's
        default), so a SIGKILL loses nothing acknowledged: the restarted server reloads its
        sessions, with a fresh timeout, and their ephemeral nodes. A client that reconnects
        within its session timeout keeps its session. In an ensemble, this waits for this
        node only (it serves once it has rejoined a quorum).

        A standalone server that a client reached too early is restarted once more: see
        :meth:`_startup_hung_a_connection`. Its clients then see a second, short outage."""
        self.stop()
        if down > 0:
            time.sleep(down)        # the outage itself
        deadline = time.monotonic() + timeout
        for attempt in range(5):
            offset = self.log_size()
            self.start()
            try:
                if not self.servers:
                    # Our own readiness probes must not be the connections that hang.
                    self._wait_log(offset, "PrepRequestProcessor", deadline)
                _wait([self], max(0.0, deadline - time.monotonic()))
            except ServerError:
                exited = self.proc is not None and self.proc.poll() is not None
                self.stop()
                # An early exit is most likely the port still held (by an outgoing connection
                # that took it as its ephemeral port): try the same port again, a few times.
                if not exited or attempt == 4 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                continue
            if self.servers or not self._startup_hung_a_connection(offset):
                return
            self.stop()             # closes the hung connection: its client reconnects to the next start
        raise ServerError(f"ZooKeeper on port {self.port} kept hanging connections at startup:\n{self.read_log()}")

    def _wait_log(self, offset: int, marker: str, deadline: float) -> None:
        """Wait until the log written since ``offset`` contains ``marker``."""
        while marker not in self.log_since(offset):
            if self.proc is None or self.proc.poll() is not None:
                raise ServerError(f"ZooKeeper on port {self.port} exited:\n{self.read_log()}")
            if time.monotonic() > deadline:
                raise ServerError(f"ZooKeeper on port {self.port} did not start:\n{self.read_log()}")
            time.sleep(0.02)

    def _startup_hung_a_connection(self, offset: int) -> bool:
        """Whether a connection made while the standalone server was starting was left open
        for good (ZOOKEEPER-5051, in ZooKeeper 3.8): between opening its port and creating
        its database, the server closes a new connection ("ZooKeeperServer not running"),
        but the close fails half-way (a NullPointerException in ``removeCnxn``) before the
        socket is closed. Its client then waits for an answer until its own timeout, which
        for kazoo's connection request is the whole session timeout: the session expires."""
        text = self.log_since(offset)
        return "NullPointerException" in text and "removeCnxn" in text


def _wait(nodes: list[ZooKeeperNode], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(n.ready() for n in nodes):
        for n in nodes:
            if n.proc is not None and n.proc.poll() is not None:
                raise ServerError(f"ZooKeeper on port {n.port} exited:\n{n.read_log()}")
        if time.monotonic() > deadline:
            raise ServerError("ZooKeeper did not start:\n" + "\n".join(n.read_log() for n in nodes))
        time.sleep(0.1)


_BIND_FAILED = "Address already in use"


def _start_nodes(nodes: list[ZooKeeperNode], timeout: float, new_ports: Callable[[], None],
                 attempts: int = 5) -> None:
    """Start ``nodes`` and wait until they serve. A port picked by :func:`free_port` may be
    taken before the server binds it (an outgoing connection of another process gets it as
    its ephemeral port): when a node exits on a bind failure, stop them all, pick new ports
    (``new_ports``) and start again."""
    for attempt in range(attempts):
        offsets = [n.log_size() for n in nodes]
        deadline = time.monotonic() + timeout
        for n in nodes:
            n.start()
        try:
            _wait(nodes, timeout)
            # An ensemble's member may serve (two others made the quorum) before its election
            # listener failed to bind: it gives up a few seconds later and exits. Wait for it.
            for n, offset in zip(nodes, offsets):
                while n.servers and "is accepting connections now" not in (text := n.log_since(offset)):
                    if "Leaving listener thread" in text or n.proc is None or n.proc.poll() is not None \
                            or time.monotonic() > deadline:
                        raise ServerError(f"ZooKeeper on port {n.port}: no election listener:\n{n.read_log()}")
                    time.sleep(0.05)
            return
        except ServerError:
            collided = any(_BIND_FAILED in n.log_since(offset) for n, offset in zip(nodes, offsets))
            for n in nodes:
                n.stop()
            if not collided or attempt == attempts - 1:
                raise
            new_ports()


class ZooKeeperServer:
    """A standalone ZooKeeper server."""

    def __init__(self, tick: int = 200) -> None:
        self.node = ZooKeeperNode(Path(tempfile.mkdtemp(prefix="ylock-zk-")), tick=tick)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.node.port}"

    def url(self, chroot: str = "") -> str:
        return f"zookeeper://{self.hosts}{chroot}"

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        def new_port() -> None:
            self.node.port = free_port()
        _start_nodes([self.node], timeout, new_port)
        return self

    def stop(self) -> None:
        self.node.stop()

    def restart(self, down: float = 0.0, timeout: float = 60.0) -> None:
        """Kill the server and start it again after ``down`` seconds, on the same port and
        data directory; return once it serves (see :meth:`ZooKeeperNode.restart`)."""
        self.node.restart(down, timeout)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP; return once it is frozen): it accepts connections but
        never answers. Its clock goes on: on :meth:`resume`, a session that sent nothing for
        its whole timeout may expire before its client's next ping is read."""
        self.node.pause()

    def resume(self) -> None:
        self.node.resume()

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def launched(self) -> float:
        """time.monotonic() when the server process was last launched (see ZooKeeperNode)."""
        return self.node.launched

    def read_log(self) -> str:
        return self.node.read_log()

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ZooKeeperServer {self.hosts}>"


class ZooKeeperEnsemble:
    """An ensemble of ``size`` servers on 127.0.0.1 (quorum = size // 2 + 1)."""

    def __init__(self, size: int = 3, tick: int = 200) -> None:
        base = Path(tempfile.mkdtemp(prefix="ylock-zk-ensemble-"))
        self.nodes = [ZooKeeperNode(base / str(i), sid=i, tick=tick) for i in range(1, size + 1)]
        self._pick_quorum_ports()

    def _pick_quorum_ports(self) -> None:
        servers = [f"server.{n.sid}=127.0.0.1:{free_port()}:{free_port()}" for n in self.nodes]
        for n in self.nodes:
            n.servers = servers

    def _new_ports(self) -> None:
        for n in self.nodes:
            n.port = free_port()
        self._pick_quorum_ports()

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def url(self, chroot: str = "") -> str:
        return f"zookeeper://{self.hosts}{chroot}"

    def start(self, timeout: float = 90.0) -> ZooKeeperEnsemble:
        _start_nodes(self.nodes, timeout, self._new_ports)
        return self

    def leader(self) -> ZooKeeperNode:
        for n in self.nodes:
            if n.mode() == "leader":
                return n
        raise ServerError("the ensemble has no leader")

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Wait until every running node serves again (after a restart or election)."""
        _wait([n for n in self.nodes if n.proc is not None], timeout)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def read_log(self) -> str:
        return "\n".join(n.read_log() for n in self.nodes)

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.hosts}>"


class PartitionableEnsemble:
    """A ZooKeeper ensemble whose every link goes through a :class:`~ylock.testing.proxy.TcpProxy`
    the test controls: each server's config names the *other* servers at proxies (one per
    direction and port: quorum and election), and each server's client port has a proxy too.
    :meth:`partition` cuts one server off from the others (its client link stays up),
    :meth:`heal` joins it again.

    Servers are numbered from 1; ``link(i, j)`` are the proxies server ``i`` uses to reach
    server ``j`` (quorum, election), ``client(i)`` the proxy in front of server ``i``'s
    client port.
    """

    def __init__(self, size: int = 3, tick: int = 200) -> None:
        base = Path(tempfile.mkdtemp(prefix="ylock-zk-partition-"))
        self.nodes = [ZooKeeperNode(base / str(i), sid=i, tick=tick) for i in range(1, size + 1)]
        self.links: dict[tuple[int, int], tuple[TcpProxy, TcpProxy]] = {}
        self.clients: dict[int, TcpProxy] = {}
        self._build()

    def _build(self) -> None:
        """Pick the servers' own ports and make the proxies in front of them."""
        real = {n.sid: (free_port(), free_port()) for n in self.nodes}
        self.links = {}
        for n in self.nodes:
            for m in self.nodes:
                if m is not n:
                    self.links[n.sid, m.sid] = (TcpProxy(real[m.sid][0]), TcpProxy(real[m.sid][1]))
        self.clients = {n.sid: TcpProxy(n.port) for n in self.nodes}
        self._real = real

    def _proxies(self) -> list[TcpProxy]:
        return [p for pair in self.links.values() for p in pair] + list(self.clients.values())

    def start(self, timeout: float = 90.0) -> PartitionableEnsemble:
        def configure() -> None:
            for proxy in self._proxies():
                proxy.start()
            for n in self.nodes:
                lines = []
                for m in self.nodes:
                    quorum, election = self._real[m.sid] if m is n else \
                        (self.links[n.sid, m.sid][0].port, self.links[n.sid, m.sid][1].port)
                    lines.append(f"server.{m.sid}=127.0.0.1:{quorum}:{election}")
                n.servers = lines

        def new_ports() -> None:     # a server's own port was taken: new ones, new proxies
            for proxy in self._proxies():
                proxy.stop()
            for n in self.nodes:
                n.port = free_port()
            self._build()
            configure()

        configure()
        try:
            _start_nodes(self.nodes, timeout, new_ports)
        except BaseException:
            self.stop()
            raise
        return self

    def node(self, sid: int) -> ZooKeeperNode:
        return self.nodes[sid - 1]

    def link(self, i: int, j: int) -> tuple[TcpProxy, TcpProxy]:
        return self.links[i, j]

    def client(self, sid: int) -> TcpProxy:
        return self.clients[sid]

    def hosts(self, *sids: int) -> str:
        """The client proxies' addresses of servers ``sids`` (all by default), as kazoo takes them."""
        return ",".join(self.clients[s].address for s in (sids or [n.sid for n in self.nodes]))

    def url(self, *sids: int, chroot: str = "") -> str:
        return f"zookeeper://{self.hosts(*sids)}{chroot}"

    def leader(self) -> ZooKeeperNode:
        for n in self.nodes:
            if n.mode() == "leader":
                return n
        raise ServerError("the ensemble has no leader")

    def partition(self, sid: int) -> None:
        """Cut server ``sid`` off from every other server, both ways, quorum and election links
        (a black hole: packets vanish, connections stay open); its client link stays up."""
        for (i, j), pair in self.links.items():
            if sid in (i, j):
                for proxy in pair:
                    proxy.drop()

    def heal(self) -> None:
        """Forward every quorum and election link again."""
        for pair in self.links.values():
            for proxy in pair:
                proxy.heal()

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Wait until every server serves (after :meth:`heal`, the cut-off one rejoins)."""
        _wait(self.nodes, timeout)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
        for proxy in self._proxies():
            proxy.stop()

    def read_log(self) -> str:
        return "\n".join(f"--- server {n.sid} ---\n{n.read_log()}" for n in self.nodes)

    def __repr__(self) -> str:
        return f"<PartitionableEnsemble {self.hosts()}>"
