"""Synchronisation helpers for tests: wait for a condition or an event, never a bare sleep."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ylock


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def waiters(engine: ylock.Engine, group: str, name: str) -> list[str]:
    """Return the queued waiters of a lock, as "mode:owner"."""
    for info in engine.describe(group):
        if info.name == name:
            return list(info.waiters)
    return []


@contextmanager
def collect(kind: str | None = None) -> Iterator[list[ylock.events.Event]]:
    """Collect the events published inside the block (of ``kind``, if given)."""
    seen: list[ylock.events.Event] = []

    def on_event(event: ylock.events.Event) -> None:
        if kind is None or event.kind == kind:
            seen.append(event)

    ylock.events.subscribe(on_event)
    try:
        yield seen
    finally:
        ylock.events.unsubscribe(on_event)


def expect_event(kind: str, group: str) -> threading.Event:
    """Return a threading.Event set when an event of ``kind`` for ``group`` is published
    (the subscription stays for the rest of the session; it is cheap)."""
    happened = threading.Event()

    def on_event(event: ylock.events.Event) -> None:
        if event.kind == kind and event.group == group:
            happened.set()
            ylock.events.unsubscribe(on_event)

    ylock.events.subscribe(on_event)
    return happened


class Runner(threading.Thread):
    """Run ``func`` in a thread, keeping its result or exception for the test."""

    def __init__(self, func: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.func = func
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.func()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def outcome(self, timeout: float = 10.0) -> object:
        self.join(timeout)
        assert not self.is_alive(), "thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


class LockLoad:
    """Threads taking write locks in a loop until stopped, counting each outcome: the load
    that fault tests (failover, leader killed) run while they break the servers.

    Each hold writes through a fenced register and an unfenced counter of its lock's name
    and is journalled (:class:`tests.faults.Journal`, files under ``directory``), so that
    :meth:`stop` can assert exclusion too: a lock that let two threads in at once fails the
    test, however well it survived the fault."""

    def __init__(self, locks: list[ylock.Lock], timeout: float, directory: str | os.PathLike[str]) -> None:
        from tests.faults import Journal
        from tests.faults.workers import Checkers

        self.outcomes = {"ok": 0, "unavailable": 0, "timeout": 0, "lost": 0}
        self.journals: dict[str, Journal] = {}
        for lock in locks:
            if lock.name not in self.journals:
                os.makedirs(os.path.join(directory, lock.name), exist_ok=True)
                self.journals[lock.name] = Journal(Checkers(os.path.join(directory, lock.name)))
        self._stop = threading.Event()
        self._timeout = timeout
        self._threads = [threading.Thread(target=self._run, args=(lock, f"T{i}"), daemon=True)
                         for i, lock in enumerate(locks)]

    def __enter__(self) -> LockLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self, lock: ylock.Lock, who: str) -> None:
        journal = self.journals[lock.name]
        while not self._stop.is_set():
            try:
                lock.lock(timeout=self._timeout)
                record = journal.hold(lock, who, writes=2)       # writes inside, then releases
                if record.outcome == "lost":
                    self.outcomes["lost"] += 1
                elif record.outcome == "release unavailable":
                    self.outcomes["unavailable"] += 1
                else:
                    self.outcomes["ok"] += 1
            except ylock.EngineUnavailable:
                self.outcomes["unavailable"] += 1
                time.sleep(0.05)
            except ylock.LockTimeout:
                self.outcomes["timeout"] += 1
            except ylock.LockLost:
                self.outcomes["lost"] += 1

    def progress(self, calls: int, timeout: float, what: str) -> None:
        """Wait until ``calls`` more lock calls succeed."""
        ok = self.outcomes["ok"]
        wait_until(lambda: self.outcomes["ok"] >= ok + calls, timeout=timeout, what=f"{what}: {self.outcomes}")

    def stop(self, join: float, *, strict: bool = True) -> dict[str, Any]:
        """Stop the load; assert that no lock call hung and that the holds excluded each
        other (:meth:`tests.faults.Journal.check`: ``strict`` unless the fault may lose a
        recent acquisition, as an asynchronous replica's promotion does). Return each name's
        verdict."""
        self._stop.set()
        for t in self._threads:
            t.join(join)
            assert not t.is_alive(), f"a lock call hung: {self.outcomes}"
        verdicts = {name: journal.check(strict=strict) for name, journal in self.journals.items()}
        held = sum(v.holds for v in verdicts.values())
        assert held >= self.outcomes["ok"] > 0, f"{held} holds journalled for {self.outcomes}"
        return verdicts


_loops = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop


class AsyncVerbs:
    """A Lock whose verbs go through its asyncio twins (alock, atry_lock, aunlock, ...), each
    run in this thread's event loop as this thread's owner: the contract suite runs through
    it unchanged, so every contract test also holds for the asyncio path."""

    def __init__(self, lock: ylock.Lock) -> None:
        self._lock = lock

    def __getattr__(self, name: str) -> object:
        return getattr(self._lock, name)        # held, token, lost, group, name, engine, ...

    def _run(self, coroutine: object) -> object:
        with ylock.owner_scope(ylock.current_owner()):      # the thread's owner, inside the task too
            return _thread_loop().run_until_complete(coroutine)  # type: ignore[arg-type]

    def lock(self, timeout: object = ylock.DEFAULT) -> object:
        return self._run(self._lock.alock(timeout))  # type: ignore[arg-type]

    def try_lock(self, timeout: object = 0.0) -> object:
        return self._run(self._lock.atry_lock(timeout))  # type: ignore[arg-type]

    def unlock(self) -> object:
        return self._run(self._lock.aunlock())

    def rlock(self, timeout: object = ylock.DEFAULT) -> object:
        return self._run(self._lock.arlock(timeout))  # type: ignore[arg-type]

    def try_rlock(self, timeout: object = 0.0) -> object:
        return self._run(self._lock.atry_rlock(timeout))  # type: ignore[arg-type]

    def runlock(self) -> object:
        return self._run(self._lock.arunlock())

    def write(self, timeout: object = ylock.DEFAULT, **kw: object) -> _AsyncGuard:
        return _AsyncGuard(self, self._lock.write(timeout, **kw))  # type: ignore[arg-type]

    def read(self, timeout: object = ylock.DEFAULT, **kw: object) -> _AsyncGuard:
        return _AsyncGuard(self, self._lock.read(timeout, **kw))  # type: ignore[arg-type]

    def __enter__(self) -> AsyncVerbs:
        self.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlock()

    async def __aenter__(self) -> object:
        return await self._lock.__aenter__()  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: object) -> None:
        await self._lock.__aexit__(*exc)  # type: ignore[attr-defined]


class _AsyncGuard:
    def __init__(self, verbs: AsyncVerbs, guard: ylock.Guard) -> None:
        self._verbs = verbs
        self._guard = guard

    def __enter__(self) -> AsyncVerbs:
        self._verbs._run(self._guard.__aenter__())
        return self._verbs

    def __exit__(self, *exc: object) -> None:
        self._verbs._run(self._guard.__aexit__(*exc))

    def __call__(self, func: Callable[..., object]) -> Callable[..., object]:
        return self._guard(func)      # as a decorator: the guard's own (sync or async) wrapper

    async def __aenter__(self) -> object:
        return await self._guard.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        await self._guard.__aexit__(*exc)
