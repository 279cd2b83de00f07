"""What a lock connection of a session engine carries, whatever its wire: who is using it,
the exchange in flight, whether it can still be used, and the hold it serves."""
from __future__ import annotations

import threading
from typing import Any, NamedTuple

from ylock.engines.nonblocking import IO, Exchange


class Hold(NamedTuple):
    """What a connection carries: one owner's holds (write, read, or a permit) of one lock
    or semaphore (``kind``). The key of the engine's table of held connections."""

    group: str
    name: str
    owner: str
    kind: str


class SessionConn:
    """One lock connection: the state the pool and the steps share (one owner's holds of
    one lock, or nothing while pooled). An engine's connection adds its wire and what its
    grant protocol keeps per hold."""

    __slots__ = ("busy", "pending", "reused", "answered", "broken", "cut", "hold", "modes", "token")

    def __init__(self) -> None:
        self.busy = threading.Lock()          # whoever runs an exchange on it (owner or watchdog)
        self.pending: Exchange | None = None  # an exchange in flight
        self.reused = False                   # taken from the idle pool (maybe stale)
        self.answered = False                 # answered since it was taken
        self.broken = False                   # unusable: closed or in the middle of a message
        self.cut = False                      # closed by us: the server did not answer in time
        self.hold: Hold | None = None         # what it carries
        self.modes: set[str] = set()
        self.token = 0

    def close(self) -> None:
        """Close the connection at once (the server drops its locks when it notices)."""
        raise NotImplementedError

    def retire(self) -> None:
        """Close a healthy connection that may carry state a proxy would hand on (see the
        PostgreSQL engine's); :meth:`close` unless the engine says otherwise."""
        self.close()

    def stale(self) -> bool:
        """Return whether a pooled connection is known dead (the server closed it)."""
        raise NotImplementedError

    def heartbeat(self) -> IO[Any]:
        """The exchange that renews the hold's lease and proves the session alive."""
        raise NotImplementedError

    def unbind(self) -> None:
        """Forget the hold (the connection goes back to the pool)."""
        self.hold, self.modes, self.token = None, set(), 0

    def reusable(self) -> bool:
        """Return whether the connection may serve another hold as it is."""
        return not self.broken and self.pending is None


def keepalive_timing(keepalive: float) -> tuple[int, int]:
    """Return the keepalive idle time and probe interval (seconds) that notice a vanished
    peer within about ``keepalive`` seconds (three probes)."""
    return max(1, round(keepalive / 2)), max(1, round(keepalive / 6))
