"""What a simulated schedule records, as the outside world saw it: each lock call's
invocation and outcome, each hold from the moment its owner learned it to the moment it
stopped acting on it, every renewal's answer, every loss its owner was told of, and what
the nemesis did (pauses, crashes, clock jumps, failovers and the writes they lost).
The checker (:mod:`tests.simulation.checker`) reads nothing else: not the server's keys,
not the processes' hold tables. Times are the world's, in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Try:
    """One acquire script call of an acquisition: its flags and, if answered, its status
    (1 held, 0 queued or refused)."""

    sent: float
    flags: str
    done: float | None = None
    status: int | None = None
    call: int = 0              # the world's id of the script call
    first: bool = False        # the engine's own first try (RedisEngine.acquire's), not the steps'


@dataclass
class Acquisition:
    """One first acquisition (a lock call), from invocation to outcome."""

    id: int
    proc: str
    owner: str
    lock: tuple[str, str]      # (kind, name)
    mode: str
    fair: bool
    invoked: float
    deadline: float | None     # world time
    done: float | None = None
    outcome: str = ""          # "token", "timeout", "unavailable", "lost" (a downgrade refused)
    token: int | None = None
    tries: list[Try] = field(default_factory=list)
    grant_call: int | None = None  # the script call whose answer gave the token (None: a pop)
    #: A watched acquisition: what its ``queued`` callback was told (the holders' notes or None), each time.
    told: list[object] = field(default_factory=list)


@dataclass
class HoldRecord:
    """A hold, from the moment its owner learned it to the moment it stopped acting on it."""

    id: int
    proc: str
    owner: str
    lock: tuple[str, str]
    mode: str
    token: int
    start: float
    first_lease: float         # the lease its grant gave (min(lease, waiter lease)), s
    lease: float
    how: str                   # "acquire", "downgrade", "adopt", "ticket" (a detached hold, nobody's)
    parent: int | None = None  # the hold it continues (downgrade, adopt)
    acquisition: int | None = None
    end: float | None = None
    why: str = ""              # "release", "lost", "crash", "detach", "adopted", "end"
    told_lost: float | None = None
    released: bool | None = None   # the release's answer: the server still had it
    #: (sent, answered or timed out, True/False/None, script call, lease s) of each renewal
    renewals: list[tuple[float, float, bool | None, int, float]] = field(default_factory=list)
    #: A downgrade's read hold: the tries of its acquisition (its grant floor).
    tries: list[Try] = field(default_factory=list)
    #: Each time its owner asked whether it still holds it (``lock.lost``): (time, held).
    reads: list[tuple[float, bool]] = field(default_factory=list)
    #: Its owner's ``describe_lock`` calls while it held it: (sent, answered, owners, mode, token).
    described: list[tuple[float, float, tuple[str, ...], str | None, int | None]] = field(default_factory=list)


@dataclass
class History:
    acquisitions: list[Acquisition] = field(default_factory=list)
    holds: list[HoldRecord] = field(default_factory=list)
    pauses: list[tuple[str, float, float]] = field(default_factory=list)     # proc, start, end
    crashes: dict[str, float] = field(default_factory=dict)
    jumps: list[tuple[float, float]] = field(default_factory=list)           # when, seconds (+ ahead)
    failovers: list[tuple[float, float, set[int]]] = field(default_factory=list)  # start, end, lost calls
    errors: list[str] = field(default_factory=list)                          # client errors
    end: float = 0.0
    permits: dict[str, int] = field(default_factory=dict)                   # semaphore name -> permits
    #: A write holder's requests for the read lock too (not first acquisitions: their tries)
    downgrades: list[Acquisition] = field(default_factory=list)
    forced: list[tuple[float, tuple[str, str]]] = field(default_factory=list)   # force-released: when, lock
    #: Adoptions whose answer never came (owner, lock, token, the ticket's hold record id)
    adopt_attempts: list[tuple[str, tuple[str, str], int, int]] = field(default_factory=list)

    def paused(self, proc: str, start: float, end: float) -> bool:
        """Whether ``proc`` was paused (or dead) at some moment of [start, end]."""
        crashed = self.crashes.get(proc)
        if crashed is not None and crashed <= end:
            return True
        return any(p == proc and a <= end and b >= start for p, a, b in self.pauses)

    def hold(self, id: int) -> HoldRecord:
        """The hold record ``id``."""
        return next(h for h in self.holds if h.id == id)

    def lost_call(self, call: int) -> bool:
        return any(call in lost for _, _, lost in self.failovers)
