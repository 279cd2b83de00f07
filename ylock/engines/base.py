"""The engine protocol: what the facade asks of Redis, ZooKeeper or the local engine.

The facade (:mod:`ylock.lock`) owns everything that needs no server: reentrancy counts,
the downgrade/upgrade rules, the hold table, events. An engine sees only *first*
acquisitions and *final* releases of one owner in one mode, so each call below is a
real transfer of ownership.

Vocabulary:

owner
    A globally unique id of the thread (or owner scope) that holds or waits, e.g.
    ``"web-1:4242:9f3c2a1b:7"``. Engines store it as is.
mode
    ``"write"`` (exclusive) or ``"read"`` (shared). An owner holding ``write`` may also
    acquire ``read`` at once (downgrade); the facade never asks an engine to upgrade.
token
    The fencing token: an int that strictly increases for a lock name across all first
    acquisitions, holders and processes.
lease
    Seconds an acquired hold stays valid without renewal. Engines with
    ``needs_renewal`` are renewed by the process watchdog every ``lease / 3``.
"""
from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import json
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple
from urllib.parse import parse_qsl

from ylock.errors import ConfigurationError
from ylock.holds import LOCK, MODES, PERMIT, READ, SEMAPHORE, WRITE, RenewItem
from ylock.options import E_ENGINE_URL
from ylock.owner import after_fork, holder_stale
from ylock.waiting import Polling

logger = logging.getLogger(__name__)

__all__ = ["Engine", "AcquireRequest", "LockInfo", "Listing", "check_limit", "RenewItem", "READ", "WRITE", "PERMIT",
           "MODES", "LOCK", "SEMAPHORE", "split_url_options", "parse_bool", "Steps", "Abandon", "run_steps",
           "arun_steps", "Mailbox", "settle", "abandon_first", "run_abandon_first", "cancelling"]



@dataclass(frozen=True)
class LockInfo:
    """What one lock (or semaphore) looks like on the server right now (``engine.describe()``)."""

    group: str
    name: str
    mode: str | None            # "write", "read", "permit" (a semaphore's), or None when nobody holds it
    owners: tuple[str, ...]     # exclusive owner, or the shared owners (a semaphore's holders)
    waiters: tuple[str, ...]    # queued waiters in order, as "mode:owner"
    ttl: float | None           # seconds until the holder's lease runs out (None: session-bound)
    token: int | None           # fencing token of the current (latest) hold
    kind: str = LOCK            # "lock" or "semaphore"
    permits: int | None = None  # a semaphore's number of permits (as last asked for)
    #: What each holder and waiter said it was doing (ylock.context), with "since" (epoch
    #: seconds it took the hold, or queued), by owner; host and pid come from the owner id.
    context: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """Return a JSON-ready dict of the fields."""
        return {
            "kind": self.kind, "group": self.group, "name": self.name, "mode": self.mode,
            "owners": list(self.owners), "waiters": list(self.waiters),
            "ttl": None if self.ttl is None else round(self.ttl, 3), "token": self.token,
            "permits": self.permits, "context": {o: dict(c) for o, c in self.context.items()},
        }


class Listing(list[LockInfo]):
    """What :meth:`Engine.describe` returns: the locks and semaphores found, in (group, name,
    kind) order, at most ``limit`` of them; and :attr:`total`, how many there are in all.

    With a ``limit``, ``total`` is what the engine counted without describing each lock: on
    Redis the size of its index, which still counts a lock whose last lease ran out since it
    was last read (a listing drops it), so read it as "about"."""

    def __init__(self, infos: Iterable[LockInfo] = (), total: int | None = None) -> None:
        super().__init__(infos)
        #: How many locks (and semaphores) are held or waited for in all, at least ``len(self)``.
        self.total = len(self) if total is None else max(total, len(self))

    @classmethod
    def of(cls, infos: Iterable[LockInfo], limit: int | None) -> Listing:
        """Sort ``infos`` (every lock an engine found) and keep the first ``limit``."""
        found = sorted(infos, key=lambda i: (i.group, i.name, i.kind))
        return cls(found if limit is None else found[:limit], len(found))


def check_limit(limit: object) -> int | None:
    """Return ``limit`` if it is a valid ``describe()`` limit (None, or an int of at least
    1), else raise ValueError saying why."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValueError(f"describe() limit must be an int or None, not {type(limit).__name__}: {limit!r}")
    if limit < 1:
        raise ValueError(f"describe() limit must be at least 1, got {limit}")
    return limit


def holder_context(owner: str, since: float | None, raw: str | bytes | None) -> dict[str, Any]:
    """The description of one holder for :attr:`LockInfo.context`: what it said (the JSON of
    ``ylock.context``), since when (epoch seconds), and its host and pid (from its owner id,
    ``host:pid:random:n``)."""
    out: dict[str, Any] = {}
    if raw:
        try:
            said = json.loads(raw)
            if isinstance(said, dict):
                out.update(said)
        except ValueError:
            pass
    parts = owner.split(":")
    if len(parts) >= 4:
        out["host"] = parts[0]
        out["pid"] = int(parts[1]) if parts[1].isdigit() else parts[1]
    if since is not None:
        out["since"] = round(since, 3)
    if holder_stale(out.get("host"), out.get("pid"), since):
        out["stale"] = True            # its process is gone from this host: its lease frees it
    return out


class AcquireRequest(NamedTuple):
    """One first acquisition, as the facade asks it of an engine (a named tuple: it is
    built on every first acquisition, and a frozen dataclass costs microseconds more)."""

    group: str
    name: str
    owner: str
    mode: str
    fair: bool
    lease: float
    deadline: float | None      # time.monotonic() deadline; None waits forever; <= now tries once
    polling: Polling
    permits: int = 0            # mode "permit": the semaphore's number of permits
    context: str = ""           # what the owner is doing, JSON (ylock.context): stored with the hold
    #: Called once, if given, when the acquisition first has to wait (queued, or polling),
    #: with the holders' descriptions (as :attr:`LockInfo.context`) when the engine has them
    #: at hand, else None: the facade tells its watchers, without a request of theirs.
    queued: Callable[[Mapping[str, Mapping[str, Any]] | None], None] | None = None


class Engine(abc.ABC):
    """Base class of every engine; subclasses document their URL grammar and guarantees.

    Engines are cheap to build and connect on first use, so a worker forked from a
    parent that built one never shares the parent's sockets (:meth:`_after_fork`, run in
    the child by :func:`ylock.owner.after_fork`, also for a fork made from C).
    """

    #: URL scheme(s) and the short name used in events, metrics and ``ylock list``.
    scheme: ClassVar[str] = ""
    #: True if a release may be sent again after one cancelled midway: a second release of
    #: an owner's hold finds nothing and answers False, harmlessly (Redis's scripts check the
    #: owner). The facade then awaits such an engine's :meth:`arelease` directly and, if the
    #: task is cancelled meanwhile, sends it again in a task of its own; otherwise it runs
    #: each release in a shielded task, which costs a task and two loop turns per release.
    release_resendable: ClassVar[bool] = False
    #: True if holds expire unless the watchdog renews them (Redis, local); False if the
    #: server keeps them alive by other means (ZooKeeper sessions).
    needs_renewal: ClassVar[bool] = True
    #: True if a grant lasts only min(lease, waiter lease) on the server until its first
    #: renewal (Redis: a grant whose answer never reached its owner frees the lock soon); the
    #: hold table counts a hold lost from when that first lease may have run out. False: a
    #: grant lasts the whole lease (or the session).
    grants_waiter_lease: ClassVar[bool] = False

    #: The options a URL's query string may carry (``?session_timeout=4``): name -> a function
    #: that turns the raw text into the option's value (raising ValueError if it cannot).
    url_options: ClassVar[dict[str, Callable[[str], Any]]] = {}

    def __init__(self) -> None:
        _live_engines.add(self)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Engine:
        """Build an engine from its URL; query parameters (see :attr:`url_options`) and
        keyword ``options`` (which win) become keyword arguments of the class."""
        clean, parsed, rest = split_url_options(url, cls.url_options)
        if rest:
            raise ConfigurationError(f"unknown {cls.scheme} URL option{'s' if len(rest) > 1 else ''} "
                                     f"{', '.join(rest)}", code=E_ENGINE_URL,
                                     hint=f"known: {', '.join(sorted(cls.url_options)) or 'none'}")
        return cls(clean, **{**parsed, **options})  # type: ignore[call-arg]

    # -- ownership ---------------------------------------------------------------

    @abc.abstractmethod
    def acquire(self, request: AcquireRequest) -> int | None:
        """Acquire ``request.mode`` for ``request.owner``; return its fencing token, or None
        if ``request.deadline`` passed first (having left the wait queue).

        Block while waiting (queued FIFO when ``request.fair``); never past the deadline
        by more than one server round trip. Raise :class:`ylock.EngineUnavailable` when
        the server cannot be reached.
        """

    async def aacquire(self, request: AcquireRequest) -> int | None:
        """:meth:`acquire` for an asyncio task. The engines of ylock do it natively (no thread
        waits); this default, for engines that do not, runs :meth:`acquire` in a worker
        thread, and if the task is cancelled meanwhile, releases whatever that thread gets."""
        future = asyncio.get_running_loop().run_in_executor(None, self.acquire, request)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            def give_back(done: asyncio.Future[int | None]) -> None:
                if not done.cancelled() and done.exception() is None and done.result() is not None:
                    with contextlib.suppress(Exception):
                        self.release(request.group, request.name, request.owner, request.mode)
            future.add_done_callback(give_back)
            raise

    async def arelease(self, group: str, name: str, owner: str, mode: str) -> bool:
        """:meth:`release` for an asyncio task (this default: in a worker thread)."""
        return await asyncio.to_thread(self.release, group, name, owner, mode)

    @abc.abstractmethod
    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        """Release ``owner``'s hold in ``mode``; return False if the server no longer had it
        (the lease ran out or someone force-released it)."""

    def renew(self, items: Sequence[RenewItem]) -> list[bool | None]:
        """Extend every hold in ``items`` by its lease, in as few round trips as possible
        (the watchdog calls it for engines that set :attr:`needs_renewal`).

        Return, for each item, True (renewed), False (not held by that owner any more:
        lost) or None (could not tell: the server did not answer).
        """
        raise NotImplementedError(f"{type(self).__name__} keeps holds alive without renewals")

    # -- inspection ----------------------------------------------------------------

    @abc.abstractmethod
    def describe(self, group: str | None = None, limit: int | None = None) -> Listing:
        """Return a :class:`LockInfo` for every lock (and semaphore) held or waited for (in
        ``group``), in (group, name, kind) order: the first ``limit`` of them if given, with
        how many there are in all (:attr:`Listing.total`). A listing costs what is held and
        queued (of ``group``), never what else the server stores; with a limit, about
        ``limit`` locks' worth. Raise ValueError for a limit that is not None or an int >= 1
        (:func:`check_limit`)."""

    def describe_lock(self, group: str, name: str, kind: str = LOCK) -> LockInfo | None:
        """Return the :class:`LockInfo` of one lock (``kind="semaphore"``: one semaphore), or
        None if nobody holds or waits for it; engines answer it without listing the group."""
        return next((i for i in self.describe(group) if i.name == name and i.kind == kind), None)

    @abc.abstractmethod
    def force_release(self, group: str, name: str, kind: str = LOCK) -> bool:
        """Drop every holder and waiter of a lock (``kind="semaphore"``: of a semaphore);
        return True if anybody held it."""

    # -- holds that change hands ---------------------------------------------------------------

    #: False if only the process that detached a hold may adopt it (ZooKeeper: its session).
    adopts_across_processes: ClassVar[bool] = True

    def detached(self, group: str, name: str, mode: str, owner: str, lease: float) -> None:
        """A hold was detached (nobody renews it now): an engine whose holds do not expire
        by themselves bounds its life to ``lease`` seconds unless adopted meanwhile."""

    def adopt(self, group: str, name: str, mode: str, old_owner: str, new_owner: str, token: int) -> bool:
        """Make ``new_owner`` the holder of ``old_owner``'s hold in ``mode`` (a detached hold,
        see :meth:`ylock.Lock.detach`), keeping ``token`` and the lease left; return False if
        ``old_owner`` no longer holds it with that token (lost, or adopted already)."""
        raise ConfigurationError(f"{type(self).__name__} cannot hand a hold from one owner to another",
                                 code=E_ENGINE_URL)

    # -- the deployment's statistics -------------------------------------------------------

    def publish_stats(self, process: str, data: bytes, ttl: float) -> None:
        """Store this process's statistics (``data``, opaque) under ``process`` for ``ttl``
        seconds, so that a command line in another process can read every worker's
        (:meth:`read_stats`). Each engine keeps them on its server; the local engine in memory."""
        raise NotImplementedError(f"{type(self).__name__} keeps no statistics")

    def read_stats(self) -> dict[str, bytes]:
        """Return every process's statistics still within their ``ttl``, by process."""
        raise NotImplementedError(f"{type(self).__name__} keeps no statistics")

    def ping(self) -> None:
        """Raise :class:`ylock.EngineUnavailable` unless the server answers."""

    def check_options(self) -> None:
        """Raise :class:`ylock.ConfigurationError` for options that would only fail on first
        use (a client option the driver does not take); never connects. Settings checks
        (Django's ``manage.py check``, Flask's ``init_app``) call it."""

    def close(self) -> None:
        """Close connections; the engine reconnects if used again."""

    def _after_fork(self) -> None:
        """Forget connections inherited from the parent process (called in the child)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url_for_display()}>"

    def url_for_display(self) -> str:
        """Return the engine's URL without credentials."""
        return self.scheme + "://"


_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _reset_engines_after_fork() -> None:
    for engine in list(_live_engines):
        engine._after_fork()


after_fork(_reset_engines_after_fork)


def split_url_options(url: str, parsers: dict[str, Callable[[str], Any]]) -> tuple[str, dict[str, Any], dict[str, str]]:
    """Split ``url`` into (the URL without its query, the options ``parsers`` knows, parsed,
    the other query parameters as text). Raise ConfigurationError naming an option whose
    value does not parse."""
    base, _, query = url.partition("?")
    parsed: dict[str, Any] = {}
    rest: dict[str, str] = {}
    for key, raw in parse_qsl(query, keep_blank_values=True):
        if key not in parsers:
            rest[key] = raw
            continue
        try:
            parsed[key] = parsers[key](raw)
        except ValueError as exc:
            raise ConfigurationError(f"URL option {key}={raw!r} is invalid: {exc}", code=E_ENGINE_URL) from exc
    return base, parsed, rest


def parse_bool(raw: str) -> bool:
    """Parse a URL option that is true or false (``1``/``0``, ``yes``/``no``, ``on``/``off``)."""
    value = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}.get(raw.lower())
    if value is None:
        raise ValueError("expected true or false")
    return value


# -- one algorithm for both worlds -----------------------------------------------------------
#
# An engine writes a multi-step operation (an acquisition that queues, waits and retries)
# once, as a generator of *steps*: it yields an operation for its server (a script call,
# a blocking pop, a sleep...) and receives the result, or has the error thrown in. Two
# small drivers run the same steps: ``run_steps`` with blocking calls (the sync API),
# ``arun_steps`` with awaitable ones (the asyncio API). So waiting in asyncio costs no
# thread, and neither world has a copy of the algorithm of its own.

Steps = Generator[Any, Any, Any]


def _translated(translate: Callable[[Exception], Exception], exc: Exception) -> Exception:
    """``translate(exc)``, keeping ``exc`` as its cause (driver errors never leak, causes stay)."""
    error = translate(exc)
    if error is not exc and error.__cause__ is None:
        error.__cause__ = exc
    return error


class Abandon(BaseException):
    """Thrown into an engine's steps when their caller gave up (a cancelled asyncio task):
    the steps must leave any queue and give back whatever was granted meanwhile, then
    re-raise it. A BaseException, so that ``except Exception`` in the steps lets it pass."""


def run_steps(steps: Steps, do: Callable[[Any], Any], translate: Callable[[Exception], Exception]) -> Any:
    """Run ``steps`` to the end, doing each operation with ``do`` (blocking); an error of
    ``do`` is thrown into the steps as ``translate(error)``; return what the steps return."""
    try:
        op = next(steps)
        while True:
            try:
                result = do(op)
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                op = steps.throw(_translated(translate, exc))
            else:
                op = steps.send(result)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: Steps, ado: Callable[[Any], Awaitable[Any]],
                     translate: Callable[[Exception], Exception]) -> Any:
    """Run ``steps`` with awaitable operations (see :func:`run_steps`). If the awaiting task
    is cancelled, :class:`Abandon` is thrown into the steps and their clean-up runs to its
    end in a task of its own that no further cancellation reaches; then the cancellation
    goes on. A cancellation that a layer below swallowed counts as well (Python 3.11+ can
    tell): it ends the steps the same way, with :class:`asyncio.CancelledError`."""
    task = asyncio.current_task()
    # Cancellations requested before this call, which its caller chose to ride out.
    cancels = _cancelling(task)
    try:
        op = next(steps)
        while True:
            error: Exception | None = None
            try:
                result = await ado(op)
            except asyncio.CancelledError:
                await _give_up(steps, ado, translate)
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                error = exc
            if _cancelling(task) > cancels:
                # The task was cancelled while ``ado`` awaited, but the CancelledError never
                # came up: Python < 3.12's asyncio.wait_for (which redis-py's asyncio sends use)
                # drops a cancellation that lands as the awaited call completes. Without this
                # the cancelled waiter would wait on, or hold the lock nobody will release.
                await _give_up(steps, ado, translate)
                raise asyncio.CancelledError
            op = steps.send(result) if error is None else steps.throw(_translated(translate, error))
    except StopIteration as stop:
        return stop.value


def _cancelling(task: asyncio.Task[Any] | None) -> int:
    """The number of pending cancellation requests of ``task`` (0 before Python 3.11)."""
    pending = getattr(task, "cancelling", None)
    return pending() if pending is not None else 0


#: The number of pending cancellation requests of a task (0 before Python 3.11): an engine
#: or the facade that awaits a call itself, outside :func:`arun_steps`, compares it before
#: and after, to notice a cancellation that a layer below swallowed.
cancelling = _cancelling


async def abandon_first(steps: Steps, ado: Callable[[Any], Awaitable[Any]],
                        translate: Callable[[Exception], Exception]) -> None:
    """Clean up after a first operation that an engine awaited itself, outside
    :func:`arun_steps` (its fast path), when the awaiting task was cancelled meanwhile:
    ``steps`` are the ones that would have run that operation (not started yet); they are
    started and :class:`Abandon` is thrown in at their first operation, so that their own
    clean-up (leave the queue, give back a grant) runs, to its end, in a task of its own."""
    try:
        next(steps)
    except Exception:  # noqa: BLE001 - steps that end before asking anything hold nothing
        return
    await _give_up(steps, ado, translate)


def run_abandon_first(steps: Steps, do: Callable[[Any], Any], translate: Callable[[Exception], Exception]) -> None:
    """:func:`abandon_first` with blocking operations (a caller that gives up after a first
    operation it did itself: e.g. its answer came after the deadline)."""
    try:
        next(steps)
        op = steps.throw(Abandon())
        while True:
            try:
                result = do(op)
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                op = steps.throw(_translated(translate, exc))
            else:
                op = steps.send(result)
    except (StopIteration, Abandon):
        return
    except Exception:  # noqa: BLE001 - a clean-up that fails leaves it to the leases
        logger.warning("ylock: leaving a lock's queue after the deadline failed", exc_info=True)


async def _give_up(steps: Steps, ado: Callable[[Any], Awaitable[Any]],
                   translate: Callable[[Exception], Exception]) -> None:
    """Run the steps' clean-up (:class:`Abandon`) in a task of its own, to its end, whatever
    further cancellations reach the caller meanwhile."""
    cleanup = asyncio.ensure_future(_abandon(steps, ado, translate))
    with contextlib.suppress(asyncio.CancelledError):    # cancelled again: it still runs
        await asyncio.shield(cleanup)


async def _abandon(steps: Steps, ado: Callable[[Any], Awaitable[Any]],
                   translate: Callable[[Exception], Exception]) -> None:
    try:
        op = steps.throw(Abandon())
        while True:
            try:
                result = await ado(op)
            except Exception as exc:  # noqa: BLE001
                op = steps.throw(_translated(translate, exc))
            else:
                op = steps.send(result)
    except (StopIteration, Abandon):
        return
    except Exception:  # noqa: BLE001 - a clean-up that fails leaves it to the leases
        logger.warning("ylock: cleaning up after a cancelled lock call failed", exc_info=True)


class _NoEvent:
    """Stands for a Mailbox's threading.Event until somebody waits in a thread."""

    @staticmethod
    def set() -> None:
        pass

    @staticmethod
    def clear() -> None:
        pass


_NO_EVENT: Any = _NoEvent()


class Mailbox:
    """Events for one waiting acquisition (watch events, wake-ups), handed from any thread
    to the owner, whether it waits in a thread or in an asyncio task (no thread of its own)."""

    __slots__ = ("_events", "_ready", "_future", "_loop")

    def __init__(self) -> None:
        self._events: collections.deque[Any] = collections.deque()
        self._ready = _NO_EVENT          # made when somebody first waits (most never do)
        self._future: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, event: Any) -> None:
        self._events.append(event)
        self._ready.set()
        loop, future = self._loop, self._future
        if loop is not None and future is not None:
            loop.call_soon_threadsafe(settle, future, None, None)

    def poke(self) -> None:
        """Wake the owner, unless a wake-up is pending already (several pokes are one)."""
        if not self._events:
            self.put(True)

    def take(self) -> Any:
        try:
            event = self._events.popleft()
        except IndexError:
            return None
        if not self._events:
            self._ready.clear()
            if self._events:          # one arrived between the pop and the clear
                self._ready.set()
        return event

    def wait(self, timeout: float | None) -> Any:
        event = self.take()
        if event is None:
            if self._ready is _NO_EVENT:
                self._ready = threading.Event()
                if self._events:              # arrived before the event existed
                    return self.take()
            if self._ready.wait(timeout):
                event = self.take()
        return event

    async def await_(self, timeout: float | None) -> Any:
        event = self.take()
        if event is not None:
            return event
        self._loop = asyncio.get_running_loop()
        self._future = self._loop.create_future()
        if self._events:              # arrived before the future was visible to put()
            return self.take()
        # A timer rather than asyncio.wait_for, which before Python 3.12 drops a cancellation
        # that lands as the future completes.
        timer = None if timeout is None else self._loop.call_later(timeout, settle, self._future, None, None)
        try:
            await self._future
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()
        return self.take()


def settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if not future.done():
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)
