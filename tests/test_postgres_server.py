"""The PostgreSQL test server (ylock.testing.postgres): it starts on a free loopback port as
an unprivileged user, is the server answering there, keeps its data across restarts,
freezes whole on pause() and heals on resume(), and runs beside another one."""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import _servers
from ylock.testing import ServerError
from ylock.testing.postgres import PostgresServer


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    srv = PostgresServer().start()
    _servers.append(srv)
    yield srv
    _servers.remove(srv)
    srv.cleanup()


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def run_with_deadline(conn: Any, query: str, timeout: float) -> None:
    """Run ``query``; after ``timeout`` s cut the connection's socket (a client-side timeout
    that needs nothing from the server: not even a cancel request, which a frozen postmaster
    would not answer either)."""
    def cut() -> None:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.start()
    try:
        conn.execute(query)
    finally:
        timer.cancel()


def test_starts_and_answers(server: PostgresServer) -> None:
    assert server.url == f"postgresql://ylock@127.0.0.1:{server.port}/ylock"
    with server.connect() as conn:
        assert conn.autocommit
        row = conn.execute("SELECT current_user, current_database(), 6 * 7").fetchone()
        assert row == ("ylock", "ylock", 42)
        assert conn.execute("SHOW max_connections").fetchone() == ("300",)
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
    assert "ready to accept connections" in server.read_log()


def test_is_ours_and_unprivileged(server: PostgresServer) -> None:
    assert server.proc is not None
    with server.connect() as conn:
        (data_dir,) = conn.execute("SHOW data_directory").fetchone()  # type: ignore[misc]
        (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        (socket_dir,) = conn.execute("SHOW unix_socket_directories").fetchone()  # type: ignore[misc]
        assert Path(data_dir).resolve() == server.data_dir.resolve()
        assert Path(socket_dir) == server.dir
        assert backend in server.pids()
    assert server.pids()[0] == server.proc.pid
    if os.geteuid() == 0:
        assert uid_of(server.proc.pid) != 0
        assert server.dir.stat().st_uid == uid_of(server.proc.pid)


def test_restart_keeps_data_on_the_same_port(server: PostgresServer) -> None:
    port, pid = server.port, server.pids()[0]
    with server.connect() as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('fast')")
    server.restart(down=0.2)
    assert server.port == port and server.pids()[0] != pid
    with server.connect() as conn:
        conn.execute("INSERT INTO kept VALUES ('immediate')")
    server.restart(mode=signal.SIGQUIT)     # like a crash: WAL replay
    with server.connect() as conn:
        assert conn.execute("SELECT v FROM kept ORDER BY v").fetchall() == [("fast",), ("immediate",)]
        conn.execute("DROP TABLE kept")


def test_pause_freezes_the_whole_server_and_resume_heals(server: PostgresServer) -> None:
    idle = server.connect()                 # connected before, untouched during the pause
    busy = server.connect()
    busy.execute("SET statement_timeout = '500ms'")
    try:
        server.pause()
        try:
            pids = server.pids()
            assert len(pids) >= 3 and all(state_of(p) in ("T", "Z") for p in pids), pids
            # An open connection: the query gets no answer; the server's statement_timeout
            # does not fire (the backend is frozen too), the client's own deadline does.
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                run_with_deadline(busy, "SELECT 1", timeout=1.0)
            assert 0.9 < time.monotonic() - start < 5
            # A new connection: the kernel accepts it, nothing answers the startup packet.
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                server.connect(connect_timeout=1)
            assert 0.9 < time.monotonic() - start < 5
        finally:
            server.resume()
        assert all(state_of(p) not in ("T", "t") for p in server.pids())
        with server.connect(connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert idle.execute("SELECT 2").fetchone() == (2,)
    finally:
        idle.close()
        busy.close()


def test_two_servers_side_by_side(server: PostgresServer) -> None:
    with PostgresServer(password="s3cret", dbname="other") as second:
        _servers.append(second)
        try:
            assert second.port != server.port and second.dir != server.dir
            assert second.url == f"postgresql://ylock:s3cret@127.0.0.1:{second.port}/other"
            with server.connect() as a, second.connect() as b:
                a.execute("CREATE TABLE only_here (v int)")
                try:
                    assert b.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
                    dirs = {c.execute("SHOW data_directory").fetchone()[0] for c in (a, b)}  # type: ignore[index]
                    assert len(dirs) == 2
                finally:
                    a.execute("DROP TABLE only_here")
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(second.url.replace("s3cret", "wrong"), connect_timeout=5)
        finally:
            _servers.remove(second)
    assert not second.dir.exists()           # leaving ``with`` removed it
    with server.connect() as conn:           # the first one did not notice
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_taken_port_is_retried_on_another() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = PostgresServer(port=port)
        try:
            srv.start()
            assert srv.port != port
            with srv.connect() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            srv.cleanup()


def test_a_server_that_cannot_start_raises_with_its_log() -> None:
    srv = PostgresServer(settings={"max_connections": "many"})
    try:
        with pytest.raises(ServerError, match="max_connections"):
            srv.start()
    finally:
        srv.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the directory to another user")
def test_a_directory_the_server_user_cannot_reach_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(ServerError, match="cannot reach"):
        PostgresServer(directory=str(closed / "pg")).start()
