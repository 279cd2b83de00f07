"""LocalEngine: the lock semantics of every engine, inside one process.

URL: ``local://`` (each call to :func:`ylock.engine_from_url` builds a separate lock
space; share one engine object between the threads that must exclude each other).

Guarantees: exclusion between the threads of this process only. Leases are enforced
(a hold that is not renewed expires) so that lost-lock handling can be exercised without
a server. Fencing tokens come from one process-wide counter, so they strictly increase
for every lock name. Meant for unit tests and single-process development.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ylock.engines import redact
from ylock.engines.base import (
    LOCK,
    PERMIT,
    READ,
    SEMAPHORE,
    WRITE,
    AcquireRequest,
    Engine,
    Listing,
    LockInfo,
    Mailbox,
    RenewItem,
    Steps,
    arun_steps,
    check_limit,
    holder_context,
    run_steps,
)
from ylock.errors import ConfigurationError
from ylock.options import E_ENGINE_URL


@dataclass
class _Waiter:
    owner: str
    mode: str
    since: float
    mailbox: Mailbox


@dataclass
class _State:
    writer: str | None = None
    writer_deadline: float = 0.0
    readers: dict[str, float] = field(default_factory=dict)   # owner -> lease deadline
    tokens: dict[str, int] = field(default_factory=dict)      # owner -> token of its hold
    queue: deque[_Waiter] = field(default_factory=deque)
    last_token: int | None = None
    permits: int = 0                 # a semaphore's number of permits, as last asked for
    notes: dict[str, tuple[float, str]] = field(default_factory=dict)   # owner -> (since, what it does)

    def expire(self, now: float) -> None:
        if self.writer is not None and self.writer_deadline <= now:
            if self.writer not in self.readers:
                self.tokens.pop(self.writer, None)
                self.notes.pop(self.writer, None)
            self.writer = None
        for owner, deadline in list(self.readers.items()):
            if deadline <= now:
                del self.readers[owner]
                if owner != self.writer:
                    self.tokens.pop(owner, None)
                    self.notes.pop(owner, None)

    def empty(self) -> bool:
        return self.writer is None and not self.readers and not self.queue

    def next_expiry(self) -> float | None:
        deadlines = list(self.readers.values())
        if self.writer is not None:
            deadlines.append(self.writer_deadline)
        return min(deadlines) if deadlines else None


# How long a queued head waiter may be barged past in non-fair mode before the lock
# turns fair for it: non-fair must not starve a queued writer forever.
BARGE_WINDOW = 0.1


def may_enter(writer: str | None, readers: Iterable[str], queue: Sequence[tuple[str, str, float]],
              owner: str, mode: str, fair: bool, now: float) -> bool:
    """Return True if ``owner`` may take ``mode`` now. The one admission rule that every
    engine implements (the Redis scripts mirror it in Lua).

    ``queue`` holds (owner, mode, since) in FIFO order. Fair: a writer enters a free lock
    only at the head of the queue; a reader enters a lock without a writer if every
    waiter ahead of it is a reader (the head reader admits the run of readers behind
    it). Non-fair: anyone enters a compatible lock, unless the head of the queue has
    waited past the barge window, or (for a reader) the head is a writer.
    """
    if mode == READ and writer == owner:
        return True                      # a writer downgrading may always read, queue or not
    readers = list(readers)
    if mode == WRITE:
        compatible = writer is None and not readers
    else:
        compatible = writer is None or writer == owner
    if not compatible:
        return False
    position = next((i for i, w in enumerate(queue) if w[0] == owner), None)
    ahead = queue if position is None else queue[:position]
    if not ahead:
        return True
    if fair:
        return mode == READ and all(w[1] == READ for w in ahead)
    head = ahead[0]
    if now - head[2] >= BARGE_WINDOW:
        return mode == READ and all(w[1] == READ for w in ahead)
    return mode == WRITE or head[1] == READ


def _wake(state: _State) -> None:
    for waiter in state.queue:
        waiter.mailbox.poke()


def _remove(state: _State, waiter: _Waiter) -> None:
    with contextlib.suppress(ValueError):
        state.queue.remove(waiter)


def _same(exc: Exception) -> Exception:
    return exc


def may_take_permit(holders: int, queue: Sequence[tuple[str, str, float]], owner: str, permits: int,
                    fair: bool) -> bool:
    """Return True if ``owner`` may take one of a semaphore's ``permits`` now, ``holders``
    being held. Fair: only with a permit left for every waiter ahead of it too (they are
    woken and take theirs); non-fair: whenever one is free."""
    if not fair:
        return holders < permits
    position = next((i for i, w in enumerate(queue) if w[0] == owner), None)
    ahead = len(queue) if position is None else position
    return holders + ahead < permits


def _kind(mode: str) -> str:
    return SEMAPHORE if mode == PERMIT else LOCK


class LocalEngine(Engine):
    """In-process engine (see module docstring)."""

    scheme = "local"
    #: Its :meth:`arelease` never suspends, so it is never cancelled midway (and a second
    #: release of a hold finds nothing and answers False): the facade awaits it directly.
    release_resendable = True
    _tokens = itertools.count(1)  # one counter for the whole process

    def __init__(self, url: str = "local://") -> None:
        if url.rstrip("/") != "local:":
            raise ConfigurationError(f"a local engine's URL is local://, got {redact(url)!r}", code=E_ENGINE_URL)
        super().__init__()
        self._mutex = threading.Lock()
        self._states: dict[tuple[str, str, str], _State] = {}    # (kind, group, name)
        self._stats: dict[str, tuple[bytes, float]] = {}

    def url_for_display(self) -> str:
        return "local://"

    def _state(self, kind: str, group: str, name: str) -> _State:
        state = self._states.get((kind, group, name))
        if state is None:
            state = self._states[(kind, group, name)] = _State()
        return state

    def _tidy(self, kind: str, group: str, name: str, state: _State) -> None:
        if state.empty():
            self._states.pop((kind, group, name), None)

    def acquire(self, request: AcquireRequest) -> int | None:
        return run_steps(self._acquire_steps(request), self._do, _same)  # type: ignore[no-any-return]

    async def aacquire(self, request: AcquireRequest) -> int | None:
        return await arun_steps(self._acquire_steps(request), self._ado, _same)  # type: ignore[no-any-return]

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        return self.release(group, name, owner, mode)      # never waits

    def _acquire_steps(self, r: AcquireRequest) -> Steps:
        """Enter when :func:`may_enter` (a semaphore: :func:`may_take_permit`) says so;
        meanwhile wait in the queue for a wake-up (a release, a force-release, a waiter
        leaving) or a lease running out."""
        waiter: _Waiter | None = None
        state: _State | None = None
        kind = _kind(r.mode)
        queued = r.queued                # told once, at the first wait
        try:
            while True:
                with self._mutex:
                    state = self._state(kind, r.group, r.name)  # force_release may have replaced it
                    now = time.monotonic()
                    state.expire(now)
                    queue = [(w.owner, w.mode, w.since) for w in state.queue]
                    if kind == SEMAPHORE:
                        state.permits = r.permits
                        enter = may_take_permit(len(state.readers), queue, r.owner, r.permits, r.fair)
                    else:
                        enter = may_enter(state.writer, state.readers, queue, r.owner, r.mode, r.fair, now)
                    if enter:
                        if waiter is not None:
                            _remove(state, waiter)
                            waiter = None
                        token = self._grant(state, r, now)
                        _wake(state)                  # the readers queued behind may follow
                        return token
                    if r.deadline is not None and now >= r.deadline:
                        return None
                    if waiter is None:
                        waiter = _Waiter(r.owner, r.mode, now, Mailbox())
                        state.queue.append(waiter)
                    elif waiter not in state.queue:   # a force-release dropped the queue
                        state.queue.append(waiter)
                    wake = [t for t in (r.deadline, state.next_expiry()) if t is not None]
                    until = min(wake) if wake else None
                if queued is not None:
                    queued(None)                      # outside the mutex: a watcher may describe()
                    queued = None
                yield ("wait", waiter.mailbox, until)
        finally:
            if waiter is not None and state is not None:
                with self._mutex:
                    _remove(state, waiter)
                    _wake(state)                      # leaving the head may let others in
                    self._tidy(kind, r.group, r.name, state)

    @staticmethod
    def _do(op: tuple[Any, ...]) -> Any:
        until = op[2]
        return op[1].wait(None if until is None else max(0.0, until - time.monotonic()))

    @staticmethod
    async def _ado(op: tuple[Any, ...]) -> Any:
        until = op[2]
        return await op[1].await_(None if until is None else max(0.0, until - time.monotonic()))

    def _grant(self, state: _State, r: AcquireRequest, now: float) -> int:
        if r.owner not in state.notes:
            state.notes[r.owner] = (time.time(), r.context)
        if r.mode == WRITE:
            state.writer = r.owner
            state.writer_deadline = now + r.lease
        else:
            state.readers[r.owner] = now + r.lease
        if r.owner in state.tokens:  # downgrade: the write hold's token carries over
            return state.tokens[r.owner]
        token = next(self._tokens)
        state.tokens[r.owner] = state.last_token = token
        return token

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        with self._mutex:
            state = self._states.get((_kind(mode), group, name))
            if state is None:
                return False
            state.expire(time.monotonic())
            held = False
            if mode == WRITE and state.writer == owner:
                state.writer = None
                held = True
            elif mode != WRITE and owner in state.readers:
                del state.readers[owner]
                held = True
            if state.writer != owner and owner not in state.readers:
                state.tokens.pop(owner, None)
                state.notes.pop(owner, None)
            self._tidy(_kind(mode), group, name, state)
            _wake(state)
            return held

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        results: list[bool | None] = []
        with self._mutex:
            now = time.monotonic()
            for item in items:
                state = self._states.get((_kind(item.mode), item.group, item.name))
                if state is not None:
                    state.expire(now)
                if state is None:
                    results.append(False)
                elif item.mode == WRITE and state.writer == item.owner:
                    state.writer_deadline = now + item.lease
                    results.append(True)
                elif item.mode != WRITE and item.owner in state.readers:
                    state.readers[item.owner] = now + item.lease
                    results.append(True)
                else:
                    results.append(False)
        return results

    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        check_limit(limit)
        infos = []
        with self._mutex:
            now = time.monotonic()
            for (kind, g, n), state in sorted(self._states.items()):
                if group is not None and g != group:
                    continue
                state.expire(now)
                if state.empty():
                    continue
                mode: str | None
                owners: tuple[str, ...]
                until: float | None
                if state.writer is not None:
                    mode, owners, until = WRITE, (state.writer,), state.writer_deadline
                elif state.readers:
                    mode, owners, until = (PERMIT if kind == SEMAPHORE else READ), tuple(sorted(state.readers)), \
                        max(state.readers.values())
                else:
                    mode, owners, until = None, (), None
                notes = {o: holder_context(o, *state.notes[o]) for o in owners if o in state.notes}
                infos.append(LockInfo(g, n, mode, owners, tuple(f"{w.mode}:{w.owner}" for w in state.queue),
                                      None if until is None else max(0.0, until - now),
                                      state.last_token if owners else None, kind,
                                      state.permits if kind == SEMAPHORE else None, notes))
        return Listing.of(infos, limit)

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        with self._mutex:
            state = self._states.get((_kind(mode), group, name))
            if state is None:
                return False
            state.expire(time.monotonic())
            if state.tokens.get(old_owner) != token:
                return False
            if mode == WRITE:
                if state.writer != old_owner:
                    return False
                state.writer = new_owner
            elif old_owner in state.readers:
                state.readers[new_owner] = state.readers.pop(old_owner)
            else:
                return False
            state.tokens[new_owner] = state.tokens.pop(old_owner)
            if old_owner in state.notes:
                state.notes[new_owner] = state.notes.pop(old_owner)
            return True

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        with self._mutex:
            self._stats[process] = (data, time.monotonic() + ttl)

    def read_stats(self) -> dict[str, bytes]:
        now = time.monotonic()
        with self._mutex:
            return {p: d for p, (d, until) in self._stats.items() if until > now}

    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        with self._mutex:
            state = self._states.get((kind, group, name))
            if state is None:
                return False
            had = state.writer is not None or bool(state.readers)
            state.writer = None
            state.readers.clear()
            state.tokens.clear()
            state.notes.clear()
            _wake(state)
            self._tidy(kind, group, name, state)
            return had
