"""The Redis key grammar: every key name the engine writes or reads, in one place.

A lock's keys share one hash tag, ``{group:name}``, so that a script touching them all runs
on one Cluster node; a semaphore's keys sit under the same tag followed by ``:p``::

    <prefix>:{<group>:<name>}:x              the writer and the fence (see ``lua/common.lua``)
    <prefix>:{<group>:<name>}:q, :w, :s, :t  the queue, the waiters' requests, the readers and their tokens
    <prefix>:{<group>:<name>}:n:<owner>      a waiter's notify list (its grants, its wake-ups)
    <prefix>:{<group>:<name>}:p:x, :p:c ...  a semaphore's keys, the same below ``:p`` (c: its permit count)
    <prefix>:i:<group>                       one server: the index of the group's held or queued locks
    <prefix>:i                               one server: the groups whose index is not empty
    <prefix>:i:{<slot tag>}                  a Cluster: the index of one slot's held or queued locks
    <prefix>:stats:<process>                 a process's published statistics
    <prefix>:stats                           the index of the published statistics (process -> expiry)
    <prefix>:hub:<random>                    a notify hub's wake-up list (see ``hubs.py``)

Every script declares the keys it touches (:meth:`Keys.lock`, :meth:`Keys.renewed`), so that
a Cluster node answers ``TRYAGAIN`` or ``ASK`` while a slot migration has split them (see
``lua/common.lua``).

The index (what ``describe()`` lists instead of scanning the keyspace) is kept by the
scripts, atomically with the state it lists: a lock enters it when it is granted or queued
for, and leaves it when its last holder or waiter does; one that expired meanwhile leaves
it when it is next read. On one server it is a set per group (``SMEMBERS`` of one group is
what a listing of that group costs), and a set of the groups. On a Cluster a script may
only touch keys of one slot, and a lock's slot is that of ``{group:name}``: there is one
index per slot instead, a sorted set of ``<group>/<name>`` under a hash tag of that slot
(:func:`slot_tag`), so it lives, migrates and is written with the locks it lists; a listing
of a group asks every slot's index for the group's range (``ZRANGEBYLEX``), pipelined per node.
"""
from __future__ import annotations

import binascii
import threading
import uuid

from ylock.engines.base import PERMIT, SEMAPHORE, WRITE

__all__ = ["Keys", "glob_escape", "slot_of", "slot_tag", "SLOTS"]

#: Redis Cluster's hash slots.
SLOTS = 16384


def glob_escape(text: str) -> str:
    """Escape ``text`` for a ``SCAN MATCH`` pattern (and an ACL key pattern)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def slot_of(tag: str) -> int:
    """The Cluster slot of keys whose hash tag is ``tag`` (CRC16 of it, as Redis computes it)."""
    return binascii.crc_hqx(tag.encode(), 0) % SLOTS


_tags: list[str] = []
_tags_mutex = threading.Lock()


def slot_tag(slot: int) -> str:
    """A short hash tag whose keys fall in ``slot`` (the smallest number, as text, that does):
    the table of all 16384 is built once, on the first call (about 170,000 CRCs, ~50 ms)."""
    if not _tags:
        with _tags_mutex:
            if not _tags:
                tags: list[str | None] = [None] * SLOTS
                missing, n = SLOTS, 0
                while missing:
                    text = str(n)
                    slot_n = binascii.crc_hqx(text.encode(), 0) % SLOTS
                    if tags[slot_n] is None:
                        tags[slot_n] = text
                        missing -= 1
                    n += 1
                _tags.extend(t for t in tags if t is not None)
    return _tags[slot]


class Keys:
    """The key names of one engine's ``prefix`` (``cluster``: the index per slot)."""

    __slots__ = ("prefix", "cluster", "_stats", "_groups")

    def __init__(self, prefix: str, cluster: bool = False) -> None:
        self.prefix = prefix
        self.cluster = cluster
        self._stats = f"{prefix}:stats:"
        self._groups = f"{prefix}:i"

    def base(self, group: str, name: str, kind: str | None = None) -> str:
        """The tagged part every key of a lock (a semaphore if ``kind`` says so) starts with."""
        tagged = f"{self.prefix}:{{{group}:{name}}}"
        return tagged + ":p" if kind in (PERMIT, SEMAPHORE) else tagged

    def x(self, group: str, name: str, mode: str) -> str:
        """The x key of a lock (of a semaphore for mode "permit")."""
        return self.base(group, name, mode) + ":x"

    def index(self, group: str, name: str) -> tuple[str, str]:
        """The index keys a lock's scripts write: (i, g) of ``lua/common.lua``."""
        if self.cluster:
            key = self.slot_index(slot_of(f"{group}:{name}"))
            return key, key
        return self.group_index(group), self._groups

    def lock(self, group: str, name: str, mode: str) -> tuple[str, ...]:
        """The keys the acquire, release, describe and force_release scripts of a lock (a
        semaphore for mode "permit") declare, in their order: x q w s t i g, and a
        semaphore's c (the acquire scripts add the owner's notify list, :meth:`notify`)."""
        base = self.base(group, name, mode)
        keys = (f"{base}:x", f"{base}:q", f"{base}:w", f"{base}:s", f"{base}:t", *self.index(group, name))
        return (*keys, f"{base}:c") if mode == PERMIT else keys

    def renewed(self, group: str, name: str, mode: str) -> tuple[str, ...]:
        """The keys renew.lua and adopt.lua declare: a writer's x, a reader's s and t, a permit's
        s, t and c (its renewal keeps the permit count as long as a holder)."""
        base = self.base(group, name, mode)
        if mode == WRITE:
            return (f"{base}:x",)
        return (f"{base}:s", f"{base}:t", f"{base}:c") if mode == PERMIT else (f"{base}:s", f"{base}:t")

    def adopted(self, group: str, name: str, mode: str) -> tuple[str, ...]:
        """The keys adopt.lua declares: a writer's x, s and t (a read its old owner holds
        unknowingly goes with the write), else as :meth:`renewed`."""
        if mode == WRITE:
            base = self.base(group, name, mode)
            return (f"{base}:x", f"{base}:s", f"{base}:t")
        return self.renewed(group, name, mode)

    @staticmethod
    def notify(x_key: str, owner: str) -> str:
        """The notify list of ``owner`` waiting for the lock (or semaphore) of ``x_key``."""
        return f"{x_key[:-2]}:n:{owner}"

    # -- the index ------------------------------------------------------------------------

    def group_index(self, group: str) -> str:
        """One server: the set of ``group``'s held or queued locks."""
        return f"{self._groups}:{group}"

    def groups(self) -> str:
        """One server: the set of the groups whose index is not empty."""
        return self._groups

    def slot_index(self, slot: int) -> str:
        """A Cluster: the sorted set of the held or queued locks of ``slot``."""
        return f"{self._groups}:{{{slot_tag(slot)}}}"

    @staticmethod
    def member(name: str, semaphore: bool) -> str:
        """A lock's (a semaphore's) entry in its group's set on one server."""
        return "/" + name if semaphore else name

    @staticmethod
    def parse_member(member: str) -> tuple[str, bool]:
        """``(name, semaphore)`` of an entry of a group's set (names never hold "/")."""
        return (member[1:], True) if member.startswith("/") else (member, False)

    @staticmethod
    def parse_slot_member(member: str) -> tuple[str, str, bool]:
        """``(group, name, semaphore)`` of an entry of a slot's index (groups never hold "/")."""
        group, _, rest = member.partition("/")
        return (group, rest[1:], True) if rest.startswith("/") else (group, rest, False)

    # -- elsewhere --------------------------------------------------------------------------

    def wake(self) -> str:
        """A new notify hub's wake-up list (outside the locks' and the statistics' keys)."""
        return f"{self.prefix}:hub:{uuid.uuid4().hex}"

    def stats(self, process: str) -> str:
        """Where ``process`` publishes its statistics."""
        return self._stats + process

    def stats_index(self) -> str:
        """The sorted set of the processes that published statistics, by expiry (ms)."""
        return self._stats[:-1]

    def stats_process(self, key: str) -> str:
        """The process a statistics key belongs to."""
        return key[len(self._stats):]
