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
import contextlib
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple
from urllib.parse import parse_qsl

from ylock.errors import ConfigurationError
from ylock.holds import MODES, READ, WRITE, RenewItem
from ylock.options import E_ENGINE_URL
from ylock.waiting import Polling

logger = logging.getLogger(__name__)

__all__ = ["Engine", "AcquireRequest", "LockInfo", "RenewItem", "READ", "WRITE", "MODES", "split_url_options",
           "parse_bool", "Steps", "Abandon", "run_steps", "arun_steps"]



@dataclass(frozen=True)
class LockInfo:
    """What one lock looks like on the server right now (``engine.describe()``)."""

    group: str
    name: str
    mode: str | None            # "write", "read", or None when nobody holds it
    owners: tuple[str, ...]     # exclusive owner, or the shared owners
    waiters: tuple[str, ...]    # queued waiters in order, as "mode:owner"
    ttl: float | None           # seconds until the holder's lease runs out (None: session-bound)
    token: int | None           # fencing token of the current (latest) hold

    def as_dict(self) -> dict[str, object]:
        """Return a JSON-ready dict of the fields."""
        return {
            "group": self.group, "name": self.name, "mode": self.mode,
            "owners": list(self.owners), "waiters": list(self.waiters),
            "ttl": None if self.ttl is None else round(self.ttl, 3), "token": self.token,
        }


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


class Engine(abc.ABC):
    """Base class of every engine; subclasses document their URL grammar and guarantees.

    Engines are cheap to build and connect on first use, so a worker forked from a
    parent that built one never shares the parent's sockets (:meth:`_after_fork`).
    """

    #: URL scheme(s) and the short name used in events, metrics and ``ylock list``.
    scheme: ClassVar[str] = ""
    #: True if holds expire unless the watchdog renews them (Redis, local); False if the
    #: server keeps them alive by other means (ZooKeeper sessions).
    needs_renewal: ClassVar[bool] = True

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
    def describe(self, group: str | None = None) -> Iterable[LockInfo]:
        """Yield a :class:`LockInfo` for every lock held or waited for (in ``group``)."""

    @abc.abstractmethod
    def force_release(self, group: str, name: str) -> bool:
        """Drop every holder and waiter of a lock; return True if there was anything."""

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


os.register_at_fork(after_in_child=_reset_engines_after_fork)


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
    goes on."""
    try:
        op = next(steps)
        while True:
            try:
                result = await ado(op)
            except asyncio.CancelledError:
                cleanup = asyncio.ensure_future(_abandon(steps, ado, translate))
                with contextlib.suppress(asyncio.CancelledError):    # cancelled again: it still runs
                    await asyncio.shield(cleanup)
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the steps, which decide
                op = steps.throw(_translated(translate, exc))
            else:
                op = steps.send(result)
    except StopIteration as stop:
        return stop.value


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
