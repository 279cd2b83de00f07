"""Helpers for testing code that uses ylock: real servers on free loopback ports.

Each server class starts the system's binary (``redis-server``, ZooKeeper) in a private
temporary directory on a port picked at run time, checks that the process answering on
that port is the one it started, and dumps the server's log when asked (tests do so on
failure). A server that cannot start raises :class:`ServerError`: never a skip.
"""
from __future__ import annotations

import socket


class ServerError(RuntimeError):
    """A test server could not be started or did not answer."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
