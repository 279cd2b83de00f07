"""Where the lock path's waiters block for their grants, and what the server refused.

A release pushes the lock to the next waiter's own list; the waiter blocks on it with
``BLPOP``. The first waiting threads of a process each block on a connection of their own,
the others share one ``BLPOP`` (:class:`ThreadNotifyHub`); the waiting tasks of an event
loop always share one (:class:`NotifyHub`). A command the server refuses (an ACL, a proxy)
is noted once (:class:`Refusals`) and done without: the waiters poll."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from typing import Any

import redis.exceptions as rex

from ylock.engines.redis.asockets import exchange
from ylock.engines.redis.calls import AsyncDirectCalls, DirectCalls
from ylock.engines.redis.sockets import send
from ylock.threads import start_thread

__all__ = ["BLPOP_REFUSED", "NotifyHub", "Refusals", "ThreadNotifyHub", "WAKE_TTL_MS", "refused"]

logger = logging.getLogger("ylock.engines.redis")


class Refusals:
    """The commands the server refused one engine (an ACL user, a proxy), each logged once:
    the waiters then do without them (see the notify hubs), and nobody retries them."""

    def __init__(self) -> None:
        self.commands: set[str] = set()
        self._mutex = threading.Lock()

    def note(self, command: str, exc: BaseException, consequence: str, fix: str) -> None:
        """Record that the server refused ``command``; log it the first time."""
        with self._mutex:
            if command in self.commands:
                return
            self.commands.add(command)
        logger.warning("ylock: Redis refused %s (%s): %s. To restore it, allow it in the ACL user's rules: %s",
                       command, exc, consequence, fix)


def refused(exc: BaseException) -> bool:
    """Whether an error reply means the server will never run the command for this user
    (an ACL, a proxy that does not know it or will not take keys of several slots), rather
    than not now (a READONLY replica after a failover, LOADING, TRYAGAIN...)."""
    if isinstance(exc, (rex.NoPermissionError, rex.ClusterCrossSlotError)):   # redis-py strips their prefix
        return True
    text = str(exc).lower()
    return isinstance(exc, rex.ResponseError) and any(
        sign in text for sign in ("noperm", "no permissions", "unknown command", "unknown subcommand",
                                  "unsupported command"))


BLPOP_REFUSED = ("waiters no longer block for their grants but poll (a handoff can take up to one poll interval)",
                  "ACL SETUSER <user> +blpop (and keys ~<prefix>:*)")
_WAKE_REFUSED = ("a waiter that joins a shared wait is watched within 50 ms instead of at once",
                 "ACL SETUSER <user> +lpush +pexpire (and keys ~<prefix>:*)")

#: Milliseconds a wake-up pushed to a hub's list lives if no BLPOP of the hub takes it (the
#: hub stopped meanwhile): such a list never outlives its process for long.
WAKE_TTL_MS = 10_000


class _Slot:
    """One waiting thread's place in a :class:`ThreadNotifyHub`: what was popped for it."""

    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class ThreadNotifyHub:
    """Where the waiting threads (or greenlets) of one process wait for their grants, so
    that waiters never take more than half the lock path's connections (a connection per
    waiting thread, as before, let the 101st waiter of a pool of 100 fail, and the holder's
    release after it). The first threads to wait each block on a connection of their own
    (:meth:`pop`): a grant wakes its thread directly, the quickest handoff (8 threads taking
    turns on one lock: 2,700-5,000 handoffs/s, against 1,700-2,500 through the hub). The
    others wait in the hub: one connection, in a thread of its own while anybody waits,
    blocked in one ``BLPOP`` over all their notify lists and the hub's own wake-up list.

    A thread waits in the hub (:meth:`wait`) between its tries; its key stays in the
    ``BLPOP`` from its first wait until it stops waiting (:meth:`leave`), so that its tries do
    not change the keys each time. A thread that starts waiting while the hub is blocked
    pushes to the hub's wake-up list (``LPUSH``, with a short ``PEXPIRE``, in one round trip):
    the ``BLPOP`` returns and is sent again with the new key. No ``CLIENT`` command is needed
    (it used to be ``CLIENT ID`` and ``CLIENT UNBLOCK``, which managed services' and proxies'
    ACLs often deny: every wait then failed at once and was retried in a loop). A value popped
    while its thread was trying again waits for its next :meth:`wait`; a grant is only a
    wake-up: it lives in the lock's own keys, which the next try reads. If the hub's
    connection fails, every waiter is woken to try again (and finds out whether the server is
    there). If the server refuses ``BLPOP`` itself (an ACL), that is logged once
    (:class:`Refusals`) and the waiters poll: a refusal is never retried in a loop."""

    #: Seconds a BLPOP blocks before it is sent again (a safety net, not a poll).
    BLOCK = 5.0

    def __init__(self, calls: DirectCalls, wake_key: str, refusals: Refusals | None = None) -> None:
        self.calls = calls
        self.wake_key = wake_key
        self.refusals = refusals or Refusals()
        #: Places for threads that wait on a connection of their own: half the lock path's.
        self._alone = threading.BoundedSemaphore(max(1, min(calls.share, 2 ** 16) // 2))
        self.waiting: dict[str, _Slot] = {}          # notify key -> its thread's slot
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._blocking: frozenset[str] = frozenset()  # the keys of the BLPOP in flight
        self._waking = False                          # a wake-up was sent for the BLPOP in flight
        self._block = self.BLOCK

    def pop(self, key: str, block: float, end: float) -> Any:
        """Wait up to ``block`` s for a value pushed to ``key``; return ``[key, value]``, or
        None. While places are left, on a connection of its own (a ``BLPOP`` of its key, the
        quickest handoff: no thread in between; ``end``, monotonic, bounds the call), else in the hub
        (:meth:`wait`); a thread that once waited in the hub waits there until it leaves."""
        if "BLPOP" in self.refusals.commands:
            time.sleep(block)                     # polling: the next try reads the lock's keys
            return None
        if key not in self.waiting and self._alone.acquire(blocking=False):
            try:
                return self.calls("BLPOP", key, block, end=end)
            except rex.ResponseError as exc:
                if not refused(exc):
                    raise
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
                time.sleep(block)             # polling: the next try reads the lock's keys
                return None
            finally:
                self._alone.release()
        return self.wait(key, block)

    def wait(self, key: str, block: float) -> Any:
        """Wait in the hub up to ``block`` s for a value pushed to ``key``; return it, or None."""
        wake = False
        with self._mutex:
            slot = self.waiting.get(key)
            if slot is None:
                slot = self.waiting[key] = _Slot()
            if "BLPOP" in self.refusals.commands:
                pass                             # polling: nobody blocks
            elif self._thread is None:
                self._thread = start_thread(self._run, "ylock-notify")
            elif self._blocking and key not in self._blocking and not self._waking:
                self._waking = wake = True       # one wake-up for every thread that joins meanwhile
        if wake:
            self._wake()
        slot.event.wait(block)
        with self._mutex:
            value, slot.value = slot.value, None
            slot.event.clear()
        return value

    def leave(self, key: str) -> None:
        """The thread waiting on ``key`` stopped waiting (acquired, gave up, or failed)."""
        with self._mutex:
            self.waiting.pop(key, None)

    def _wake(self) -> None:
        try:
            self.calls.many(("LPUSH", self.wake_key, "1"), ("PEXPIRE", self.wake_key, WAKE_TTL_MS))
        except rex.RedisError as exc:
            if refused(exc):
                self.refusals.note("LPUSH", exc, *_WAKE_REFUSED)
                self._block = 0.05      # no wake-ups: block briefly, so new keys are watched soon
            # else: the hub finds out on its own connection

    def _run(self) -> None:
        conn = None
        try:
            while True:
                if conn is None:
                    conn = self.calls.checkout(None)
                with self._mutex:
                    if not self.waiting:
                        self._thread = None       # under the lock: a new waiter starts another
                        return
                    keys = list(self.waiting)
                    self._blocking = frozenset(keys)
                    self._waking = False          # a joiner from now on wakes this BLPOP
                try:
                    send(conn, ("BLPOP", *keys, self.wake_key, self._block), time.monotonic() + self._block + 5.0)
                    reply = conn.ylock_read()
                finally:
                    with self._mutex:
                        self._blocking = frozenset()
                if reply:
                    key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
                    with self._mutex:
                        slot = self.waiting.get(key)     # None for the wake-up list
                        if slot is not None:
                            slot.value = reply
                            slot.event.set()
        except BaseException as exc:  # noqa: BLE001 - the waiters try again (and see the error themselves)
            if refused(exc):                # an ACL, a proxy: never again, the waiters poll
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
            with self._mutex:
                self._thread = None
                self._blocking = frozenset()
                for slot in self.waiting.values():
                    slot.event.set()
            if conn is not None:
                conn.disconnect()
        finally:
            if conn is not None:
                self.calls.checkin(conn)


class NotifyHub:
    """Where the asyncio waiters of one event loop wait for their grants: one connection
    blocked in one ``BLPOP`` of the hub's own list, instead of a connection (and a file
    descriptor) per waiting task. Every task of the loop names the hub in its requests
    (``ARGV[7]`` of the acquire scripts), so a grant (or a wake-up) for it is pushed to the
    hub's list as ``"<its notify list>.<tag>|<token>"``, and the hub hands it to the task
    waiting on that notify list with that tag. The tag (:meth:`tag`) names one acquisition:
    a grant pushed for an earlier acquisition of the same owner (one its poll found first,
    or one it gave up) can stay in the hub's list, which no script can clear, until the
    owner waits again; untagged, it was taken for the new acquisition's grant (two holders,
    the second with an old token). The ``BLPOP`` names one key however many tasks wait: a handoff costs
    the hub, and the server, the same with 1,000 waiting tasks as with one (a ``BLPOP`` over
    every waiting task's own list cost each handoff O(waiters): 1.6 ms of server CPU at 1,000),
    and a task that starts waiting needs no wake-up of the hub. A refused ``BLPOP`` is logged
    once and the tasks poll.

    A grant popped for a task that stopped waiting is dropped: the grant lives in the lock's
    own keys, which that task's next try reads, so the notification is only a wake-up. One
    popped within :attr:`LINGER` seconds after its task stopped waiting (its try in flight:
    tasks that take turns wait again soon) is not handed over either (it may be a grant that
    try took already: a stale token must never pass for a grant), but noted: the task's next
    wait returns a wake-up at once, so that it tries again rather than wait out its timeout
    for a grant that was already pushed."""

    #: Seconds a BLPOP blocks before it is sent again (a safety net, not a poll).
    BLOCK = 5.0
    #: Seconds after its task stopped waiting that a value popped for it makes its next wait
    #: a wake-up (see above).
    LINGER = 5.0

    def __init__(self, pool: Any, calls: AsyncDirectCalls, hub_key: str, refusals: Refusals | None = None) -> None:
        self.pool = pool
        self.calls = calls
        #: The hub's own list (``<prefix>:hub:<id>``) and its id, which the requests name.
        self.hub_key = hub_key
        self.hub_id = hub_key.rsplit(":", 1)[1]
        self.refusals = refusals or Refusals()
        self.waiting: dict[str, Any] = {}          # notify key -> future of the task waiting on it
        self._task: Any = None
        self._conn: Any = None
        self._left: dict[str, float] = {}          # key -> when its task last stopped waiting
        self._early: set[str] = set()              # keys popped between their task's waits
        self._tags = itertools.count(1)

    def tag(self) -> str:
        """A tag for one acquisition's request, unique in this hub (letters and digits)."""
        return format(next(self._tags), "x")

    async def wait(self, key: str, block: float) -> Any:
        """Wait up to ``block`` s for a value pushed for ``key``; return ``(key, value)``, or None."""
        if "BLPOP" in self.refusals.commands:
            await asyncio.sleep(block)                # polling: the next try reads the lock's keys
            return None
        if key in self._early:
            self._early.discard(key)
            return (key, b"wake")                    # try again now (see the class docstring)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting[key] = future
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        # A timer rather than asyncio.wait_for, which before Python 3.12 drops a cancellation
        # that lands as the future completes (the task would wait on).
        timer = loop.call_later(block, _settle, future, None)
        try:
            return await future
        finally:
            timer.cancel()
            if self.waiting.get(key) is future:
                del self.waiting[key]
            if key not in self.waiting:
                self._left[key] = time.monotonic()  # see LINGER
            if not self.waiting and self._task is not None and not self._task.done():
                # Nobody waits any more: stop blocking (its connection is dropped, so the
                # server stops popping for it), rather than leave a task pending in a loop
                # that may be about to close (a Flask async view's loop lives one request).
                self._task.cancel()

    async def aclose(self) -> None:
        """Stop blocking and give the connection back (the loop is shutting down)."""
        for future in list(self.waiting.values()):
            _settle(future, None)
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def _deliver(self, value: bytes) -> None:
        """Hand ``"<notify list>|<token or wake>"`` to the task waiting on that list."""
        key_bytes, _, payload = value.rpartition(b"|")
        key = key_bytes.decode()
        future = self.waiting.pop(key, None)
        if future is not None:
            _settle(future, (key, payload))
            return
        left = self._left.get(key)
        if left is not None and time.monotonic() - left < self.LINGER:
            self._early.add(key)                     # its task's next wait tries again

    async def _run(self) -> None:
        try:
            while self.waiting:
                if self._conn is None:
                    self._conn = await self.calls.checkout(None)
                if self._left:
                    lingered = time.monotonic() - self.LINGER
                    self._left = {k: t for k, t in self._left.items() if t > lingered}
                    self._early &= self._left.keys()
                conn = self._conn
                reply = await exchange(conn, conn.ylock_pack("BLPOP", self.hub_key, self.BLOCK),
                                       time.monotonic() + self.BLOCK + 5.0)
                if reply:
                    self._deliver(reply[1])
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the waiters poll on
            if refused(exc):                # an ACL, a proxy: never again, the tasks poll
                self.refusals.note("BLPOP", exc, *BLPOP_REFUSED)
            if self._conn is not None:
                await self._conn.disconnect(nowait=True)
                self.calls.checkin(self._conn)
                self._conn = None
            for future in list(self.waiting.values()):
                _settle(future, None)
        finally:
            if self._conn is not None and not self.waiting:
                conn, self._conn = self._conn, None
                self.calls.checkin(conn)


def _settle(future: Any, value: Any) -> None:
    if not future.done():
        future.set_result(value)
