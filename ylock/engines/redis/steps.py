"""An acquisition past its first try, as steps: the operations it asks of the server and
the generator that asks them, run blocking by :func:`~ylock.engines.base.run_steps` or
awaited by :func:`~ylock.engines.base.arun_steps` (each with the engine's executor for
the operations below)."""
from __future__ import annotations

import contextlib
import time
from typing import Any, NamedTuple

from ylock.engines.base import Abandon, AcquireRequest, Steps
from ylock.engines.redis.keys import Keys
from ylock.engines.redis.parts import EngineParts
from ylock.engines.redis.scripts import ACQUIRE, RELEASE, TryFlags, release_args
from ylock.errors import EngineUnavailable

__all__ = ["Acquire", "Pop", "Release", "Sleep", "acquire_steps"]


class Acquire(NamedTuple):
    """Run an acquire script; answers ``(reply, replicas that acknowledged)``."""

    script: str
    key: str
    args: list[Any]
    timeout: float


class Pop(NamedTuple):
    """Block up to ``wait`` seconds on a notify list (the socket up to ``timeout``);
    answers ``BLPOP``'s reply, or None."""

    key: str
    wait: float
    timeout: float


class Release(NamedTuple):
    """Run a release script; answers its reply."""

    script: str
    key: str
    args: list[Any]
    timeout: float


class Sleep(NamedTuple):
    """Wait without the server."""

    seconds: float


def acquire_steps(engine: EngineParts, r: AcquireRequest, key: str, args: list[Any], reply: Any) -> Steps:
    """The rest of an acquisition, after the first reply (None: not tried yet): queueing,
    waiting for a grant or a poll, trying again until the deadline. Every operation gets
    what is left of the call's budget, the deadline plus one socket timeout, so that the
    call ends by then whatever the server or the network does. :func:`arun_steps` throws
    :class:`Abandon` in when the awaiting task is cancelled. ``args`` are the acquire
    script's, whose flags (``args[2]``) each try sets."""
    waiter_lease = r.polling.waiter_lease
    fair = bool(r.fair)
    intervals = r.polling.intervals()
    notify_key = Keys.notify(key, r.owner)
    socket_timeout = engine.socket_timeout
    end = None if r.deadline is None else r.deadline + socket_timeout
    unreachable_since: float | None = None
    queued = False
    acked = 0
    try:
        while True:
            now = time.monotonic()
            last_try = r.deadline is not None and now >= r.deadline
            if reply is None:
                left = socket_timeout if end is None else min(socket_timeout, end - now)
                if left <= 0:          # no time for another try: a queue entry expires on its own
                    if queued:
                        return None
                    raise EngineUnavailable(f"Redis at {engine.url_for_display()} did not answer in time",
                                            group=r.group, name=r.name)
                args[2] = TryFlags(fair, stay=not last_try, queued=queued).encode()
                try:
                    reply, acked = yield Acquire(ACQUIRE[r.mode], key, args, left)
                    unreachable_since = None
                except EngineUnavailable:
                    # Before we are queued, fail fast; once queued, ride out a blip until the
                    # waiter lease (our place in the queue) or the deadline is gone.
                    if unreachable_since is None:
                        unreachable_since = now
                    if not queued or last_try or now - unreachable_since >= waiter_lease:
                        raise
                    yield Sleep(min(next(intervals), 0.1))
                    continue
            if reply.__class__ is int:
                yield from confirm_steps(engine, r, key, acked)
                return int(reply)
            engine._publish_evicted(r.group, r.name, reply[2:])
            if reply[0] == 1:
                yield from confirm_steps(engine, r, key, acked)
                return int(reply[1])
            queued = True
            if last_try:
                return None
            wait = min(next(intervals), max(0.001, int(reply[1]) / 1000))
            reply = None
            if r.deadline is not None:
                wait = min(wait, r.deadline - time.monotonic())
            if wait <= 0:
                continue
            if not engine.notify:
                yield Sleep(wait)
                continue
            # The pop blocks on the server for ``wait``; its socket waits one socket
            # timeout more, so a healthy wait is never taken for a dead server.
            try:
                popped = yield Pop(notify_key, wait, wait + socket_timeout)
            except EngineUnavailable:
                continue           # the next try finds out whether the server is back
            if popped is None or popped[1] == b"wake":
                continue
            if engine.wait_replicas:
                # the grant was written by the releaser's connection: confirm ours
                # with one more script call, which finds the grant and re-writes it.
                continue
            return int(popped[1])
    except Abandon:
        # The caller gave up (a cancelled task) while queued, or while a grant was on its
        # way: leave the queue in a last try that does not wait, and give back a grant.
        args[2] = TryFlags(fair, stay=False, queued=True).encode()
        try:
            reply, _ = yield Acquire(ACQUIRE[r.mode], key, args, socket_timeout)
            if reply.__class__ is int or reply[0] == 1:
                yield Release(RELEASE[r.mode], key, release_args(r.owner, r.mode), socket_timeout)
        except EngineUnavailable:
            pass               # the queue entry and a grant's short lease expire on their own
        raise


def confirm_steps(engine: EngineParts, r: AcquireRequest, key: str, acked: int) -> Steps:
    """With ``wait_replicas``: release and raise if too few replicas acknowledged."""
    if acked < engine.wait_replicas:
        with contextlib.suppress(EngineUnavailable):
            yield Release(RELEASE[r.mode], key, release_args(r.owner, r.mode), engine.socket_timeout)
        raise EngineUnavailable(f"only {acked} of {engine.wait_replicas} replicas acknowledged the lock "
                                f"within {engine.wait_timeout_ms} ms; released it", group=r.group, name=r.name)
