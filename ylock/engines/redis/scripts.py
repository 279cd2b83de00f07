"""The Redis engine's Lua scripts: how they are assembled from ``lua/``, which one does
what, and the arguments that cross into them (see each script's ``KEYS``/``ARGV`` header)."""
from __future__ import annotations

import re
from importlib import resources
from typing import Any, NamedTuple

from ylock.engines.base import PERMIT, READ, WRITE

__all__ = ["ACQUIRE", "FIRST_TRY", "FIRST_TRY_HOLDERS", "NAMES", "RELEASE", "SOURCES", "Acquired", "Released",
           "TryFlags", "fill", "release_args"]


def _script(name: str) -> str:
    """Return a script's source: the keys of ``common.lua``, then the script with the
    helpers that grants need spliced in at its ``--@grants`` line (or first), the other
    helpers of ``common.lua`` at its ``--@common`` line and the queue machinery
    at its ``--@queue`` line (after its fast path, so a fast call never pays for defining
    what it does not use)."""
    lua = resources.files("ylock.engines.redis").joinpath("lua")
    head, helpers = re.split(r"^--@functions.*$", lua.joinpath("common.lua").read_text(), maxsplit=1, flags=re.M)
    keys, grants = re.split(r"^--@grants.*$", head, maxsplit=1, flags=re.M)
    body = lua.joinpath(name).read_text()
    if not re.search(r"^--@grants$", body, flags=re.M):
        body = "--@grants\n" + body
    if not re.search(r"^--@common$", body, flags=re.M):      # the helpers use the grants' helpers
        body = re.sub(r"^--@grants$", "--@grants\n--@common", body, count=1, flags=re.M)
    body = re.sub(r"^--@grants$", lambda _: grants, body, count=1, flags=re.M)
    body = re.sub(r"^--@common$", lambda _: helpers, body, count=1, flags=re.M)
    body = re.sub(r"^--@queue$", lambda _: lua.joinpath("queue.lua").read_text(), body, count=1, flags=re.M)
    body = re.sub(r"^--@permits$", lambda _: lua.joinpath("permits.lua").read_text(), body, count=1, flags=re.M)
    return keys + "\n" + body


NAMES = ("acquire", "release", "renew", "describe", "force_release", "sem_acquire", "sem_release", "adopt")

#: Script templates; each engine fills in its own constants (fewer arguments per call).
SOURCES = {name: _script(f"{name}.lua") for name in NAMES}

#: The scripts that acquire and release in each mode.
ACQUIRE = {WRITE: "acquire", READ: "acquire", PERMIT: "sem_acquire"}
RELEASE = {WRITE: "release", READ: "release", PERMIT: "sem_release"}


def fill(template: str, retention_ms: int, barge_ms: int, cluster: bool = False) -> str:
    """A script template with an engine's constants in it (``cluster``: the index per slot)."""
    return (template.replace("__RETENTION_MS__", str(retention_ms)).replace("__BARGE_MS__", str(barge_ms))
            .replace("__INDEX__", "zset" if cluster else "set"))


def release_args(owner: str, mode: str) -> list[str]:
    """The release script's ``ARGV`` (a semaphore's takes no mode)."""
    return [owner] if mode == PERMIT else [owner, mode]


class TryFlags(NamedTuple):
    """How an acquire script call tries (``ARGV[3]`` of ``acquire.lua`` and ``sem_acquire.lua``)."""

    #: Queue in arrival order (no barging past a head that has waited long enough).
    fair: bool
    #: Wait in the queue if not acquired; False on the last try, which leaves the queue.
    stay: bool
    #: The owner may be in the queue already.
    queued: bool
    #: A reply that queues ends with the holders' notes (a traced wait links to their spans).
    holders: bool = False

    def encode(self) -> str:
        """The flags as the scripts read them: four characters "1"/"0"."""
        return _ENCODED[self]


_ENCODED = {flags: "".join("1" if flag else "0" for flag in flags)
            for flags in (TryFlags(f, s, q, h) for f in (False, True) for s in (False, True)
                          for q in (False, True) for h in (False, True))}

#: The encoded flags of a first try (stay, not queued yet), by fairness: made once, since
#: every acquisition sends them; FIRST_TRY_HOLDERS asks for the holders' notes too.
FIRST_TRY = {fair: TryFlags(fair, stay=True, queued=False).encode() for fair in (False, True)}
FIRST_TRY_HOLDERS = {fair: TryFlags(fair, stay=True, queued=False, holders=True).encode() for fair in (False, True)}


class Acquired(NamedTuple):
    """An acquire script's answer when it is not a bare token (the write fast path's, which
    callers take first, as an int): ``{granted, value, evicted...}``."""

    #: Whether the owner holds it now (acquired, granted meanwhile, or a writer downgrading).
    granted: bool
    #: Granted: the fencing token; else the milliseconds the holders' leases still run.
    value: int
    #: The dead waiters this call evicted from the queue (owner ids, as bytes).
    evicted: list[Any]
    #: A reply that queues, to a try that asked (:attr:`TryFlags.holders`): the holders' notes,
    #: ``[owner, "<since ms>|<context>", ...]``; else None.
    notes: list[Any] | None = None

    @classmethod
    def of(cls, reply: list[Any]) -> Acquired:
        """Name the parts of an acquire script's list reply (the notes, when there, are its
        last element: a list, where the evicted owners are strings)."""
        if len(reply) > 2 and reply[-1].__class__ is list:
            return cls(reply[0] == 1, int(reply[1]), reply[2:-1], reply[-1])
        return cls(reply[0] == 1, int(reply[1]), reply[2:])


class Released(NamedTuple):
    """A release script's answer: whether the owner still held it, and the dead waiters
    evicted meanwhile (a bare 0 or 1 when none were)."""

    held: bool
    evicted: list[Any]

    @classmethod
    def of(cls, reply: Any) -> Released:
        """Name the parts of a release script's reply (an int, or ``{held, evicted...}``)."""
        if reply.__class__ is int:
            return cls(bool(reply), [])
        return cls(bool(reply[0]), reply[1:])
