"""Fenced writes, framework-free: what the Django and SQLAlchemy helpers share.

A fencing token protects nothing until the storage checks it. A fenced write is one
conditional update: ``SET fence = token, ... WHERE <rows> AND fence <= token``. A holder
paused past its lease (GC, SIGSTOP, a VM migration) and resumed after a newer holder wrote
the rows finds its write refused (:class:`ylock.FencedOut`) instead of overwriting the
newer work. ``<=`` (not ``<``) lets one holder write the same rows several times; that is
safe only because two acquisitions never share a token (every engine's tokens strictly
increase per lock name: see docs/fencing.md for the exact condition per engine).

The helpers take a token or anything holding one: a :class:`ylock.Lock` held by this
thread (``lock.token``), a Celery task's hold (``self.request.ylock``), a semaphore's permit.
"""
from __future__ import annotations

from typing import Any

from ylock.errors import FencedOut

#: The largest token a fence column holds: a signed 64-bit integer (SQL ``BIGINT``).
MAX_TOKEN = 2**63 - 1


def token_of(token_or_lock: Any, argument: str = "token") -> int:
    """Return the fencing token of ``token_or_lock``: an int, or an object with a ``token``
    attribute (a held :class:`ylock.Lock`, a Celery ``TaskHold``). Raise ``ValueError``
    naming ``argument`` for a lock this thread does not hold (its token is None), and
    ``TypeError`` for anything else."""
    token = token_or_lock
    holder = not isinstance(token_or_lock, int)
    if holder:
        if not hasattr(token_or_lock, "token"):
            raise TypeError(f"{argument} must be a fencing token (an int) or a held lock (with a .token), "
                            f"got {token_or_lock!r}")
        token = token_or_lock.token
        if token is None:
            raise ValueError(f"{argument}: {token_or_lock!r} is not held by this thread (or owner scope), so it "
                             "has no fencing token: write inside `with lock.write(...)`, or pass the token itself")
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"{argument} must be a fencing token (an int), got {token!r}")
    if not 0 <= token <= MAX_TOKEN:
        raise ValueError(f"{argument} must be a fencing token between 0 and 2**63-1 (a BIGINT), got {token}")
    return token


def fenced_out(token: int, where: str, token_or_lock: Any = None) -> FencedOut:
    """The error of a write refused because ``where`` already carries a newer token."""
    group, name = getattr(token_or_lock, "group", None), getattr(token_or_lock, "name", None)
    if not (isinstance(group, str) and isinstance(name, str)):
        lock = getattr(token_or_lock, "lock", None)        # a Celery TaskHold names its lock
        group, name = getattr(lock, "group", None), getattr(lock, "name", None)
    if not (isinstance(group, str) and isinstance(name, str)):
        group = name = None
    return FencedOut(f"fenced write refused: {where} already carry a fencing token newer than {token} (this "
                     "holder lost its lock, e.g. paused past its lease, and a newer holder has written); "
                     "nothing was written", token=token, group=group, name=name)
