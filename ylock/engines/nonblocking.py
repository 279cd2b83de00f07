"""Exchanges with a server written once as generators of waits, and the drivers that run
them with a deadline: blocking (:func:`drive`, ``select.poll``), on the event loop
(:func:`adrive`, its readers and writers) and several at once (:func:`drive_many`, the
watchdog's heartbeats: one wait for all). The PostgreSQL engine's libpq exchanges
(:mod:`ylock.engines.postgres.wire`) and the MySQL engine's protocol
(:mod:`ylock.engines.mysql.wire`) are written this way, so that one code path serves the
blocking API and asyncio, and every wait has a deadline.

An exchange yields ``(fd, READ|WRITE)`` (what it waits for) and is sent back what became
ready. One that runs out of time raises :class:`NoAnswer`; its connection is then in the
middle of a message and is closed by its owner.
"""
from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Generator
from typing import Any, TypeVar

READ = 1
WRITE = 2
Wait = tuple[int, int]                       # (file descriptor, READ|WRITE)
T = TypeVar("T")
IO = Generator[Wait, int, T]


class NoAnswer(Exception):
    """The server did not answer before the deadline (the connection must be closed)."""


_POLL = {READ: select.POLLIN, WRITE: select.POLLOUT, READ | WRITE: select.POLLIN | select.POLLOUT}
_ERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _ready(events: int) -> int:
    ready = 0
    if events & (select.POLLIN | _ERR):
        ready |= READ
    if events & (select.POLLOUT | _ERR):
        ready |= WRITE
    return ready


class Exchange:
    """An exchange in progress: its generator and the wait it is suspended at, so that a
    driver interrupted by a cancelled task can be followed by another that resumes it."""

    __slots__ = ("io", "wait")

    def __init__(self, io: IO[Any]) -> None:
        self.io = io
        self.wait: Wait | None = None

    def first(self) -> Wait:
        if self.wait is None:
            self.wait = next(self.io)
        return self.wait

    def send(self, ready: int) -> Wait:
        self.wait = self.io.send(ready)
        return self.wait


def drive(io: IO[T] | Exchange, end: float | None) -> T:
    """Run an exchange to its end, blocking; raise :class:`NoAnswer` at ``end`` (monotonic)."""
    ex = io if isinstance(io, Exchange) else Exchange(io)
    try:
        fd, want = ex.first()
        while True:
            poller = select.poll()
            poller.register(fd, _POLL[want])
            if end is None:
                events = poller.poll()
            else:
                left = end - time.monotonic()
                if left <= 0:
                    raise NoAnswer("no answer in time")
                events = poller.poll(max(1, int(left * 1000 + 0.999)))
            if not events:
                continue                      # the loop checks the deadline again
            fd, want = ex.send(_ready(events[0][1]))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def drive_many(ios: dict[T, IO[Any]], end: float) -> dict[T, Any]:
    """Run several exchanges on different connections at once (blocking) until each ends
    or ``end`` passes; return each one's value, or the exception it raised (:class:`NoAnswer`
    for those still waiting at ``end``)."""
    out: dict[T, Any] = {}
    waiting: dict[int, tuple[T, IO[Any]]] = {}
    poller = select.poll()

    def step(key: T, io: IO[Any], value: int | None) -> None:
        try:
            fd, want = next(io) if value is None else io.send(value)
        except StopIteration as stop:
            out[key] = stop.value
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            out[key] = exc
        else:
            waiting[fd] = (key, io)
            poller.register(fd, _POLL[want])
    for key, io in ios.items():
        step(key, io, None)
    while waiting:
        left = end - time.monotonic()
        if left <= 0:
            break
        for fd, events in poller.poll(max(1, int(left * 1000 + 0.999))):
            key, io = waiting.pop(fd)
            poller.unregister(fd)
            step(key, io, _ready(events))
    for key, io in waiting.values():
        io.close()
        out[key] = NoAnswer("no answer in time")
    return out


async def adrive(io: IO[T] | Exchange, end: float | None) -> T:
    """Run an exchange to its end on the running event loop; raise :class:`NoAnswer` at
    ``end``. A cancelled task leaves the exchange where it was (pass an :class:`Exchange`
    to resume it later)."""
    ex = io if isinstance(io, Exchange) else Exchange(io)
    loop = asyncio.get_running_loop()
    try:
        fd, want = ex.first()
        while True:
            future: asyncio.Future[int] = loop.create_future()

            def ready(flag: int, future: asyncio.Future[int] = future) -> None:
                if not future.done():
                    future.set_result(flag)
            if want & READ:
                loop.add_reader(fd, ready, READ)
            if want & WRITE:
                loop.add_writer(fd, ready, WRITE)
            try:
                if end is None:
                    got = await future
                else:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise NoAnswer("no answer in time")
                    try:
                        got = await asyncio.wait_for(future, left)
                    except asyncio.TimeoutError:
                        raise NoAnswer("no answer in time") from None
            finally:
                if want & READ:
                    loop.remove_reader(fd)
                if want & WRITE:
                    loop.remove_writer(fd)
            fd, want = ex.send(got)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
