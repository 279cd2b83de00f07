"""A TLS-only ZooKeeper server for tests, with certificates made on the spot by the
``openssl`` CLI: a CA, a server certificate for 127.0.0.1 (not "localhost") and a client
certificate, all signed by that CA.

The server listens on ``secureClientPort`` only (no plaintext port), through Netty
(``NettyServerCnxnFactory``: Debian's ``libnetty-java`` jars, which the ``zookeeper``
package depends on), reading PEM key and trust stores (ZooKeeper 3.5.6+). With
``client_auth="need"`` it demands a client certificate (mutual TLS).
"""
from __future__ import annotations

import glob
import os
import socket
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ylock.testing import ServerError
from ylock.testing.zookeeper import JAR, SLF4J_SIMPLE, ZooKeeperNode, _wait

#: The Netty jars NettyServerCnxnFactory needs (Debian installs them in /usr/share/java).
NETTY_JARS = ("netty-buffer", "netty-codec", "netty-common", "netty-handler", "netty-resolver",
              "netty-transport", "netty-transport-native-unix-common", "netty-transport-native-epoll")


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA's certificate, the server's and the client's key and certificate
    (and an ``other_ca`` that signed nothing here: a client trusting it must fail)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode:
        raise ServerError(f"openssl {' '.join(args)} failed: {done.stderr}")


def make_certificates(directory: Path) -> Certificates:
    """Make a CA and the server and client certificates it signs, in ``directory``."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=ylock test {ca}",
                 "-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.pem"))
    ext = d / "san.ext"
    # Only the IP: a client that reaches the server as "localhost" must fail its host name check.
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=ylock test {who}",
                 "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(d / f"{who}.pem"))
    # ZooKeeper's PEM key store: the key and the certificate in one file.
    (d / "server-store.pem").write_text((d / "server.key").read_text() + (d / "server.pem").read_text())
    return Certificates(ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"), server_key=str(d / "server.key"),
                        client_cert=str(d / "client.pem"), client_key=str(d / "client.key"),
                        other_ca=str(d / "other-ca.pem"))


class TlsZooKeeperNode(ZooKeeperNode):
    """A standalone ZooKeeper that serves TLS only, on ``port``."""

    def __init__(self, directory: Path, certs: Certificates, client_auth: str = "need", tick: int = 200) -> None:
        super().__init__(directory, tick=tick)
        self.certs = certs
        self.client_auth = client_auth

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        store = str(Path(self.certs.server_cert).with_name("server-store.pem"))
        lines = [f"tickTime={self.tick}", f"dataDir={self.data_dir}", f"secureClientPort={self.port}",
                 "secureClientPortAddress=127.0.0.1", "admin.enableServer=false", "4lw.commands.whitelist=*",
                 "maxSessionTimeout=60000", "minSessionTimeout=400", "autopurge.purgeInterval=0",
                 "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                 f"ssl.keyStore.location={store}", "ssl.keyStore.type=PEM",
                 f"ssl.trustStore.location={self.certs.ca}", "ssl.trustStore.type=PEM",
                 f"ssl.clientAuth={self.client_auth}"]
        path = self.dir / "zoo.cfg"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> TlsZooKeeperNode:
        netty = [jar for name in NETTY_JARS for jar in sorted(glob.glob(f"/usr/share/java/{name}.jar"))[:1]]
        missing = [name for name in NETTY_JARS[:6] if not os.path.exists(f"/usr/share/java/{name}.jar")]
        if missing:
            raise ServerError(f"TLS ZooKeeper needs Netty ({', '.join(missing)}): apt-get install libnetty-java")
        classpath = ["/etc/zookeeper/conf", JAR, *netty] + ([SLF4J_SIMPLE] if os.path.exists(SLF4J_SIMPLE) else [])
        config = self.write_config()
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.jmx.log4j.disable=true",
             "-Dorg.slf4j.simpleLogger.showDateTime=true", "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
             "-cp", ":".join(classpath), "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def context(self, *, ca: str | None = None, client_cert: bool = True) -> ssl.SSLContext:
        """An SSL context that trusts ``ca`` (default: the test CA) and presents the client
        certificate unless told not to."""
        context = ssl.create_default_context(cafile=ca or self.certs.ca)
        if client_cert:
            context.load_cert_chain(self.certs.client_cert, self.certs.client_key)
        return context

    def four_letter_tls(self, word: str, timeout: float = 2.0) -> str:
        """A four-letter command over TLS ("" if no answer)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as raw, \
                    self.context().wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(word.encode())
                chunks = []
                while data := sock.recv(65536):
                    chunks.append(data)
                return b"".join(chunks).decode(errors="replace")
        except (OSError, ssl.SSLError):
            return ""

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return f"dataDir={self.data_dir}" in self.four_letter_tls("conf")


class TlsZooKeeperServer:
    """A TLS-only standalone ZooKeeper with certificates of its own (see the module)."""

    def __init__(self, client_auth: str = "need") -> None:
        base = Path(tempfile.mkdtemp(prefix="ylock-zk-tls-"))
        self.certs = make_certificates(base / "certs")
        self.node = TlsZooKeeperNode(base / "server", self.certs, client_auth=client_auth)

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.node.port}"

    def url(self, chroot: str = "", *, client_cert: bool = True) -> str:
        """A ylock URL with the TLS options for this server (the client certificate too,
        unless ``client_cert`` is False)."""
        query = f"?tls=1&ca={self.certs.ca}"
        if client_cert:
            query += f"&certfile={self.certs.client_cert}&keyfile={self.certs.client_key}"
        return f"zookeeper://{self.hosts}{chroot}{query}"

    def start(self, timeout: float = 60.0) -> TlsZooKeeperServer:
        self.node.start()
        _wait([self.node], timeout)
        return self

    def stop(self) -> None:
        self.node.stop()

    def read_log(self) -> str:
        return self.node.read_log()

    def __repr__(self) -> str:
        return f"<TlsZooKeeperServer {self.hosts}>"
