"""A tiny Redis client on a unix socket: the keeper runs without redis-py, and a probe needs
no pool. Standard library only."""
from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Sequence

PROBE_TIMEOUT = 2.0        # a healthy local server answers INFO in well under a millisecond


class NoServer(Exception):
    """Nothing listens on the socket (no file, connection refused, closed at once)."""


class Unresponsive(Exception):
    """Something accepted the connection but did not answer in time."""


class ErrorReply(Exception):
    """The server answered with an error (``-ERR ...``, ``-LOADING ...``)."""


def send_command(path: str, args: Sequence[str], timeout: float) -> bytes | None:
    """Send one command to the server on the unix socket ``path``; return its reply (a bulk
    or simple string; None when the server closed the connection without answering, as a
    successful SHUTDOWN does)."""
    request = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise NoServer(str(exc)) from exc
        except TimeoutError as exc:
            raise Unresponsive(f"connect to {path} timed out") from exc
        except OSError as exc:
            raise NoServer(str(exc)) from exc
        buf = b""
        try:
            sock.sendall(request)
            while True:
                if b"\r\n" in buf:
                    head, rest = buf.split(b"\r\n", 1)
                    kind, body = head[:1], head[1:]
                    if kind == b"-":
                        raise ErrorReply(body.decode(errors="replace"))
                    if kind in (b"+", b":"):
                        return body
                    if kind == b"$":
                        size = int(body)
                        if size < 0:
                            return b""
                        if len(rest) >= size + 2:
                            return rest[:size]
                    else:
                        raise ErrorReply(f"unexpected reply {head[:40]!r}")
                chunk = sock.recv(65536)
                if not chunk:
                    if buf:
                        raise NoServer("connection closed in the middle of a reply")
                    return None
                buf += chunk
        except TimeoutError as exc:
            raise Unresponsive(f"no answer from {path} within {timeout}s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise NoServer(str(exc)) from exc
    finally:
        sock.close()


def query_info(path: str, timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """``INFO server`` of the server on ``path``, as a dict (run_id, process_id, config_file...)."""
    reply = send_command(path, ["INFO", "server"], timeout)
    if reply is None:
        raise NoServer("connection closed without an answer")
    out: dict[str, str] = {}
    for line in reply.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def shutdown(path: str, timeout: float) -> None:
    """Stop the server on ``path`` (saving the file) and wait until it no longer answers."""
    with contextlib.suppress(NoServer, Unresponsive):
        try:
            send_command(path, ["SHUTDOWN"], timeout)
        except ErrorReply:                  # it could not save: stop it all the same
            with contextlib.suppress(ErrorReply):
                send_command(path, ["SHUTDOWN", "NOSAVE"], timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            query_info(path, 0.5)
        except (NoServer, ErrorReply):
            return
        except Unresponsive:
            pass
        time.sleep(0.02)

