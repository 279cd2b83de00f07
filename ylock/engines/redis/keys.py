"""The Redis key grammar: every key name the engine writes or scans, in one place.

A lock's keys share one hash tag, ``{group:name}``, so that a script touching them all runs
on one Cluster node; a semaphore's keys sit under the same tag followed by ``:p``::

    <prefix>:{<group>:<name>}:x              the x key: every script takes it as KEYS[1] and
                                             derives the others from it (see ``lua/common.lua``)
    <prefix>:{<group>:<name>}:f              the fence (token counter)
    <prefix>:{<group>:<name>}:n:<owner>      a waiter's notify list (its grants, its wake-ups)
    <prefix>:{<group>:<name>}:p:x, :p:f ...  a semaphore's keys, the same below ``:p``
    <prefix>:stats:<process>                 a process's published statistics
    <prefix>:hub:<random>                    a notify hub's wake-up list (see ``hubs.py``)

The suffixes past ``:x`` are written by the Lua scripts (``lua/common.lua``); this module
knows the ones Python reads or builds.
"""
from __future__ import annotations

import uuid

from ylock.engines.base import PERMIT

__all__ = ["Keys", "glob_escape"]

#: The keys that alone mean "free and unqueued" (a fence outlives its lock).
_FENCES = (":f", ":p:f")


def glob_escape(text: str) -> str:
    """Escape ``text`` for a ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class Keys:
    """The key names of one engine's ``prefix``."""

    __slots__ = ("prefix", "_stats")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._stats = f"{prefix}:stats:"

    def base(self, group: str, name: str) -> str:
        """The tagged part every key of a lock starts with (what Cluster hashes)."""
        return f"{self.prefix}:{{{group}:{name}}}"

    def x(self, group: str, name: str, mode: str) -> str:
        """The x key of a lock (of a semaphore for mode "permit"): every script takes it as
        KEYS[1] and derives the others from it."""
        if mode == PERMIT:
            return f"{self.prefix}:{{{group}:{name}}}:p:x"
        return f"{self.prefix}:{{{group}:{name}}}:x"

    @staticmethod
    def notify(x_key: str, owner: str) -> str:
        """The notify list of ``owner`` waiting for the lock (or semaphore) of ``x_key``."""
        return f"{x_key[:-2]}:n:{owner}"

    @staticmethod
    def described(x_key: str) -> str:
        """What :meth:`describe_base` is for the lock of ``x_key`` (its x key without ``:x``)."""
        return x_key[:-2]

    def scan_pattern(self, group: str | None = None) -> str:
        """The ``SCAN MATCH`` pattern of every lock's keys (of ``group``'s only, if given)."""
        return f"{self.prefix}:{{{glob_escape(group)}:*" if group else f"{self.prefix}:{{*"

    @staticmethod
    def describe_base(key: str) -> str | None:
        """The base to describe for a scanned ``key`` (with ``:p`` for a semaphore's), or
        None for a fence: a lock whose only key is its fence is free and unqueued."""
        end = key.rindex("}") + 1
        rest = key[end:]
        if rest in _FENCES:
            return None
        return key[:end] + (":p" if rest.startswith(":p:") else "")

    def parse_base(self, base: str) -> tuple[str, str, bool]:
        """``(group, name, semaphore)`` of a base from :meth:`describe_base`."""
        tag = base[len(self.prefix) + 2:base.rindex("}")]
        group, _, name = tag.partition(":")
        return group, name, base.endswith(":p")

    @staticmethod
    def x_of_base(base: str) -> str:
        """The x key of a base from :meth:`describe_base`."""
        return f"{base}:x"

    def wake(self) -> str:
        """A new notify hub's wake-up list (outside the locks' and the statistics' patterns)."""
        return f"{self.prefix}:hub:{uuid.uuid4().hex}"

    def stats(self, process: str) -> str:
        """Where ``process`` publishes its statistics."""
        return self._stats + process

    def stats_pattern(self) -> str:
        """The ``SCAN MATCH`` pattern of every process's statistics."""
        return f"{glob_escape(self.prefix)}:stats:*"

    def stats_process(self, key: str) -> str:
        """The process a statistics key belongs to."""
        return key[len(self._stats):]
