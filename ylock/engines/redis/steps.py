"""An acquisition past its first try, as steps: the operations it asks of the server and
the generator that asks them, run blocking by :func:`~ylock.engines.base.run_steps` or
awaited by :func:`~ylock.engines.base.arun_steps` (each with the engine's executor for
the operations below)."""
from __future__ import annotations

import contextlib
import time
from typing import Any, NamedTuple

import redis.exceptions as rex

from ylock.engines.base import Abandon, AcquireRequest, Steps, holder_context
from ylock.engines.redis.calls import PoolBusy
from ylock.engines.redis.parts import EngineParts
from ylock.engines.redis.scripts import ACQUIRE, RELEASE, Acquired, TryFlags, release_args
from ylock.errors import EngineUnavailable
from ylock.holds import Grant

__all__ = ["PROMPT", "Acquire", "Pop", "Release", "Sleep", "acquire_steps", "not_run", "queued_too_late"]

#: A first try answered within this many seconds of its send may be answered as a bare
#: token, whose lease the facade counts from the answer (it is off by less than this); one
#: answered later goes through :func:`acquire_steps` with its send time.
PROMPT = 0.001


class Acquire(NamedTuple):
    """Run an acquire script with its ``keys`` (the lock's, then the owner's notify list) by
    ``end`` (the call's bound, ``time.monotonic()``); answers ``(reply, replicas that
    acknowledged)``."""

    script: str
    keys: tuple[str, ...]
    args: list[Any]
    end: float


class Pop(NamedTuple):
    """Block up to ``block`` seconds on a notify list, the whole call by ``end``; answers
    ``BLPOP``'s reply, or None."""

    key: str
    block: float
    end: float


class Release(NamedTuple):
    """Run a release script with its ``keys`` (the lock's) by ``end``; answers its reply."""

    script: str
    keys: tuple[str, ...]
    args: list[Any]
    end: float


class Sleep(NamedTuple):
    """Wait without the server."""

    seconds: float


def acquire_steps(engine: EngineParts, r: AcquireRequest, keys: tuple[str, ...], args: list[Any], reply: Any,
                  sent: float | None = None) -> Steps:
    """The rest of an acquisition, after the first reply (None: not tried yet; ``sent``: when
    its try was sent, if known): queueing, waiting for a grant or a poll, trying again until
    the deadline.

    A grant is answered as a :class:`~ylock.holds.Grant`, with the send time of the call
    that granted it (a try of ours; for a grant a releaser pushed to us, our last try,
    after which it was made), from which the hold's first lease counts, min(lease, waiter
    lease): a grant whose answer came after that could have run out (a paused client, a
    late answer) is confirmed by one more try, which finds it ours and starts its lease
    again with the same token, or queues us if it was lost meanwhile. (A first reply whose
    send time is not known is answered as a bare token: its lease counts from the answer.)

    Three quantities, three names: ``r.deadline`` is the wait's budget (the caller's, absolute,
    ``time.monotonic()``); a pop's ``block`` is how long the server blocks it; an operation's
    ``end`` is its bound, at most one socket timeout from its start and never past the
    call's bound, the deadline plus one socket timeout, so that the call ends by then
    whatever the server or the network does. :func:`arun_steps` throws :class:`Abandon` in
    when the awaiting task is cancelled. ``args`` are the acquire script's, whose flags
    (``args[2]``) each try sets. ``r.queued``, if any, is called once when the acquisition
    first waits (the facade tells its watchers). ``keys`` are the acquire script's: the
    lock's, then the owner's notify list (what the releases take: the lock's)."""
    waiter_lease = r.polling.waiter_lease
    first_lease = min(r.lease, waiter_lease)
    tried = sent                     # when the try whose reply we hold was sent (None: unknown)
    fair = bool(r.fair)
    intervals = r.polling.intervals()
    notify_key = keys[-1]
    lock_keys = keys[:-1]
    socket_timeout = engine.socket_timeout
    bound = None if r.deadline is None else r.deadline + socket_timeout
    unreachable_since: float | None = None
    queued = False
    told = r.queued                  # told once, at the first wait (with the holders, asked for)
    acked = 0
    try:
        while True:
            now = time.monotonic()
            last_try = r.deadline is not None and now >= r.deadline
            if reply is None:
                end = now + socket_timeout if bound is None else min(now + socket_timeout, bound)
                if end <= now:         # no time for another try: a queue entry expires on its own
                    if queued:
                        return None
                    raise EngineUnavailable(f"Redis at {engine.url_for_display()} did not answer in time",
                                            group=r.group, name=r.name)
                args[2] = TryFlags(fair, stay=not last_try, queued=queued, holders=told is not None).encode()
                tried = now
                try:
                    reply, acked = yield Acquire(ACQUIRE[r.mode], keys, args, end)
                    unreachable_since = None
                except EngineUnavailable as exc:
                    if not_run(exc) and (bound is None or time.monotonic() < bound):
                        # The script did not run (the lock's Cluster slot is being migrated,
                        # or every connection of the process was busy): try again until the
                        # call's bound (the transport waited between its own tries).
                        continue
                    # Before we are queued, fail fast; once queued, ride out a blip until the
                    # waiter lease (our place in the queue) or the deadline is gone.
                    if unreachable_since is None:
                        unreachable_since = now
                    if not queued or last_try or now - unreachable_since >= waiter_lease:
                        raise
                    yield Sleep(min(next(intervals), 0.1))
                    continue
            if reply.__class__ is int:
                if tried is not None and time.monotonic() >= tried + first_lease:
                    reply, queued = None, True       # answered too late: confirm it (see above)
                    continue
                yield from confirm_steps(engine, r, lock_keys, acked)
                return int(reply) if tried is None else Grant(reply, tried)
            answer = Acquired.of(reply)
            if answer.evicted:
                engine._publish_evicted(r.group, r.name, answer.evicted)
            if answer.granted:
                if tried is not None and time.monotonic() >= tried + first_lease:
                    reply, queued = None, True
                    continue
                yield from confirm_steps(engine, r, lock_keys, acked)
                return answer.value if tried is None else Grant(answer.value, tried)
            queued = True
            if last_try:
                return None
            if told is not None:
                told(holders_of(answer.notes))
                told = None
            block = min(next(intervals), max(0.001, answer.value / 1000))
            reply = None
            now = time.monotonic()
            if r.deadline is not None:
                block = min(block, r.deadline - now)
            if block <= 0:
                continue
            if not engine.notify:
                yield Sleep(block)
                continue
            # The pop blocks on the server for ``block``; its socket waits one socket
            # timeout more, so a healthy wait is never taken for a dead server.
            try:
                popped = yield Pop(notify_key, block, now + block + socket_timeout)
            except EngineUnavailable:
                continue           # the next try finds out whether the server is back
            if popped is None or popped[1] == b"wake":
                continue
            if engine.wait_replicas or (tried is not None and time.monotonic() >= tried + first_lease):
                # With wait_replicas: the grant was written by the releaser's connection:
                # confirm ours with one more script call, which finds the grant and
                # re-writes it. Also a grant popped after its lease could have run out.
                continue
            return int(popped[1]) if tried is None else Grant(int(popped[1]), tried)
    except Abandon:
        # The caller gave up (a cancelled task) while queued, or while a grant was on its
        # way: leave the queue in a last try that does not wait, and give back a grant.
        args[2] = TryFlags(fair, stay=False, queued=True).encode()
        try:
            reply, _ = yield Acquire(ACQUIRE[r.mode], keys, args, time.monotonic() + socket_timeout)
            if reply.__class__ is int or Acquired.of(reply).granted:
                yield Release(RELEASE[r.mode], lock_keys, release_args(r.owner, r.mode),
                              time.monotonic() + socket_timeout)
        except EngineUnavailable:
            pass               # the queue entry and a grant's short lease expire on their own
        raise


def holders_of(notes: list[Any] | None) -> dict[str, dict[str, Any]] | None:
    """The holders' notes of a reply that queued (see :attr:`Acquired.notes`), described as
    :attr:`ylock.LockInfo.context` describes them; None if the reply had none."""
    if notes is None:
        return None
    out = {}
    for i in range(0, len(notes) - 1, 2):
        owner = notes[i].decode() if isinstance(notes[i], bytes) else notes[i]
        note = notes[i + 1].decode() if isinstance(notes[i + 1], bytes) else notes[i + 1]
        since, _, said = note.partition("|")
        out[owner] = holder_context(owner, int(since) / 1000 if since.isdigit() else None, said)
    return out


def not_run(exc: BaseException) -> bool:
    """Whether ``exc`` (a redis-py error, or the ylock error made of one) says that the script
    did not run, so that a retry is safe and no sign of a failing server: a Cluster node's
    ``TRYAGAIN`` (the lock's slot is being migrated and its keys are split between two nodes),
    or no connection of the lock path came free in time (:class:`~.calls.PoolBusy`: the
    process's own congestion). An acquisition tries again until its deadline."""
    cause = exc.__cause__
    return isinstance(exc, (rex.TryAgainError, PoolBusy)) or isinstance(cause, (rex.TryAgainError, PoolBusy))


def confirm_steps(engine: EngineParts, r: AcquireRequest, keys: tuple[str, ...], acked: int) -> Steps:
    """With ``wait_replicas``: release and raise if too few replicas acknowledged."""
    if acked < engine.wait_replicas:
        with contextlib.suppress(EngineUnavailable):
            yield Release(RELEASE[r.mode], keys, release_args(r.owner, r.mode),
                          time.monotonic() + engine.socket_timeout)
        raise EngineUnavailable(f"only {acked} of {engine.wait_replicas} replicas acknowledged the lock "
                                f"within {engine.wait_timeout_ms} ms; released it", group=r.group, name=r.name)


def queued_too_late(r: AcquireRequest, reply: Any) -> bool:
    """Whether a first try queued the owner (it asks to stay) but answered after the
    deadline: the steps, which take such an answer as the last try's, would return without
    leaving the queue, so the caller leaves it (and gives back a grant) and times out."""
    return r.deadline is not None and not Acquired.of(reply).granted and time.monotonic() >= r.deadline
