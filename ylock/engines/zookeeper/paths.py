"""The znode grammar of the ZooKeeper engine: where a lock lives and what its children's
names say.

* A lock is the znode ``<root>/<group>/<name>``; a semaphore ``<root>/:sem/<group>/<name>``;
  a process's published stats ``<root>/:stats/<process>`` (groups hold no ":", so neither
  can collide with a group).
* Groups and names are escaped (:func:`escape`) where ZooKeeper refuses a character.
* A lock's child is ``<letter>-<owner>-<sequence>``: letter ``w`` (write), ``r`` (read) or
  ``p`` (a semaphore's permit), the owner id, and ZooKeeper's 10-digit sequence number,
  by which children are served.
"""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import unquote

from ylock.engines.base import PERMIT, READ, WRITE

#: The letter a node's name (and data) starts with, by mode.
LETTER = {WRITE: "w", READ: "r", PERMIT: "p"}
_MODE = {"w": WRITE, "r": READ, "p": PERMIT}

#: The child of the root under which semaphores live, and the one that holds stats.
SEMAPHORES = ":sem"
STATS = ":stats"


class NodeName(NamedTuple):
    """What a lock node's name says: its mode and its owner."""

    mode: str
    owner: str


def escape(text: str) -> str:
    """Return a group or name as a znode name: ZooKeeper refuses characters outside the BMP
    (Java sees surrogates), private use and U+FFF0-U+FFFF in paths; those and "%" are written
    as %XX of their UTF-8 bytes (names never hold "/" or control characters)."""
    if all(c != "%" and c < "\ue000" or "\uf8ff" < c < "\ufff0" for c in text):
        return text
    return "".join(c if c != "%" and (c < "\ue000" or "\uf8ff" < c < "\ufff0")
                   else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def unescape(text: str) -> str:
    """Return the group or name that :func:`escape` wrote as ``text``."""
    return unquote(text) if "%" in text else text


def lock_path(root: str, group: str, name: str, mode: str = WRITE) -> str:
    """Return the znode of a lock, or of a semaphore (mode "permit": under ``<root>/:sem``)."""
    if mode == PERMIT:
        return f"{root}/{SEMAPHORES}/{escape(group)}/{escape(name)}"
    return f"{root}/{escape(group)}/{escape(name)}"


def node_prefix(mode: str, owner: str) -> str:
    """Return the start of the name of ``owner``'s node in ``mode`` (ZooKeeper appends the
    sequence number)."""
    return f"{LETTER[mode]}-{owner}-"


def sequence(child: str) -> str:
    """Return a lock node's sequence number (10 digits: they sort as numbers do)."""
    return child[-10:]


def parse(child: str) -> NodeName | None:
    """Return the mode and owner of a lock node's name, or None for something else."""
    if len(child) < 13 or child[1] != "-" or child[0] not in "wrp" or not child[-10:].isdigit():
        return None
    return NodeName(_MODE[child[0]], child[2:-11])


def blockers(children: list[str], mine: str, mode: str) -> list[str]:
    """Return the children before ``mine`` that block it, in sequence order (the last is
    nearest); a semaphore's permit: every holder or waiter before it (it enters when fewer
    than the permits are)."""
    seq = mine[-10:]
    ahead = sorted((c for c in children if c[-10:] < seq and parse(c) is not None), key=sequence)
    if mode != READ:
        return ahead
    return [c for c in ahead if c.startswith("w-")]
