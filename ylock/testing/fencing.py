"""Checkers for fault tests that run lock holders in several processes: a storage that
fences off stale holders, and an unfenced counter that shows what overlapping holders do.

A checker is only its path (and settings): it pickles to a few bytes and any process, forked,
spawned or unrelated, that builds one on the same path shares its state. The state is a
small JSON file, read and replaced under an exclusive ``fcntl.flock`` on ``<path>.lock``.
A new state is written to ``<path>.tmp`` and renamed over the file, so a process killed in
the middle of an operation (fault tests send SIGKILL) leaves the old state or the new one,
never a torn one, and its flock goes with it.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class _StateFile:
    """A JSON object in a file, shared by processes; every change runs under a file lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @contextmanager
    def _locked(self, exclusive: bool = True) -> Iterator[None]:
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)        # releases the lock

    def _load(self) -> dict[str, Any]:
        """The state (call it with the lock held); ``{}`` before the first write."""
        try:
            with open(self.path, encoding="utf-8") as file:
                state: dict[str, Any] = json.load(file)
                return state
        except FileNotFoundError:
            return {}

    def _store(self, state: dict[str, Any]) -> None:
        """Replace the state atomically (call it with the exclusive lock held)."""
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(state, file)
        os.replace(temporary, self.path)

    def _snapshot(self) -> dict[str, Any]:
        with self._locked(exclusive=False):
            return self._load()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"


@dataclass(frozen=True)
class RegisterState:
    """What a :class:`FencedRegister` holds, read in one go."""

    value: Any
    highest_token: int | None
    accepted: int
    rejected: int


class FencedRegister(_StateFile):
    """A storage that fences off stale lock holders: it accepts a write only with a fencing
    token at least as high as the highest it has accepted so far (the same holder may write
    several times), and rejects the others, counting both.

    The value is any JSON value; it is ``None`` before the first accepted write. A holder
    passes the token its lock gave it (``lock.token``): once a newer holder has written,
    the old one, still believing it holds the lock after a pause or a partition, cannot
    overwrite its work.
    """

    def write(self, token: int, value: Any) -> bool:
        """Store ``value`` if ``token`` is not stale; return whether it was accepted."""
        return self._update(token, lambda _old: value)

    def increment(self, token: int) -> bool:
        """Add 1 to the (integer) value if ``token`` is not stale, as one atomic operation;
        return whether it was accepted. No accepted increment is ever lost, even when two
        holders overlap: the value is always the number of accepted increments (when
        nothing else is written), and a stale holder's increments are rejected."""
        return self._update(token, lambda old: int(old or 0) + 1)

    def read(self) -> Any:
        """The value last accepted (``None`` if none was)."""
        return self.state().value

    def state(self) -> RegisterState:
        """The value, the highest token and the counts, consistent with one another."""
        state = self._snapshot()
        return RegisterState(value=state.get("value"), highest_token=state.get("highest_token"),
                             accepted=state.get("accepted", 0), rejected=state.get("rejected", 0))

    @property
    def highest_token(self) -> int | None:
        """The highest token accepted so far (``None`` before the first accepted write)."""
        return self.state().highest_token

    @property
    def accepted(self) -> int:
        return self.state().accepted

    @property
    def rejected(self) -> int:
        return self.state().rejected

    def _update(self, token: int, change: Callable[[Any], Any]) -> bool:
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"a fencing token is an int, not {token!r}")
        with self._locked():
            state = self._load()
            highest = state.get("highest_token")
            if highest is not None and token < highest:
                state["rejected"] = state.get("rejected", 0) + 1
                self._store(state)
                return False
            state["value"] = change(state.get("value"))
            state["highest_token"] = token
            state["accepted"] = state.get("accepted", 0) + 1
            self._store(state)
            return True


class UnfencedCounter(_StateFile):
    """The control: a counter incremented the way unprotected code does it, in three steps
    (read, pause ``pause`` seconds, write the value read plus one), each step atomic but not
    the three together. Two holders inside at once lose updates; ``lost`` counts them.

    The pause stands for the work a holder does between reading and writing: the longer it
    is, the surer an overlap of two holders loses an update.
    """

    def __init__(self, path: str | os.PathLike[str], pause: float = 0.001) -> None:
        super().__init__(path)
        self.pause = pause

    def increment(self, pause: float | None = None) -> int:
        """Read the value, pause (``pause``, or the counter's own), write it plus one; return
        the value written."""
        with self._locked(exclusive=False):
            value = int(self._load().get("value", 0))
        time.sleep(self.pause if pause is None else pause)     # the holder's work, not a wait
        with self._locked():
            state = self._load()
            state["value"] = value + 1
            state["increments"] = state.get("increments", 0) + 1   # counted atomically: the truth
            self._store(state)
        return value + 1

    @property
    def value(self) -> int:
        return int(self._snapshot().get("value", 0))

    @property
    def increments(self) -> int:
        """How many increments completed (counted atomically, unlike the value)."""
        return int(self._snapshot().get("increments", 0))

    @property
    def lost(self) -> int:
        """Increments that the value does not show: updates lost to overlapping holders."""
        state = self._snapshot()
        return int(state.get("increments", 0)) - int(state.get("value", 0))
