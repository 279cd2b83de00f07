"""Leadership: do something only while holding a lock's write side, and learn at once when
the hold is lost, in Python (:class:`Leadership`) or around a command (:func:`run_command`,
what ``ylock run``, ``manage.py ylock run`` and ``flask ylock run`` do).

::

    import ylock
    from ylock.leader import Leadership

    leadership = Leadership(ylock.Lock(engine, "jobs", "nightly-report", lease=15))

    with leadership.lead(timeout=None) as term:      # blocks until this process leads
        for batch in batches():
            if term.lost.is_set():                    # the hold was lost: someone else may lead
                break
            write(batch, fencing_token=term.token)

    leadership.run_while_leader(work)                 # work(term); LockLost if the term was lost

A :class:`Term` is one continuous hold: its ``token`` is the lock's fencing token,
``lost`` a :class:`threading.Event` set as soon as the hold is known to be lost, and
``on_lost(callback)`` calls ``callback(term)`` then, in a thread of its own. The hold is
lost when its lease could not be renewed (Redis: within a third of the lease; the process
was paused, the server unreachable for a whole lease), when someone force-released it
(``ylock release``; Redis: at the next renewal, ZooKeeper: at once), or when the
ZooKeeper session expired: whatever publishes the ``lost`` event of :mod:`ylock.events`.
A ZooKeeper ``suspended`` connection is not a loss (the session may survive it); pass
``term.token`` to the resource you protect to close that gap too.

``run_command`` runs a command while holding the lock and stops it when the hold is
lost. Its exit codes (the ``ylock run`` command lines exit with them):

=====================  ==========================================================
the command's own      it ran and ended while the lock was held (``128 + N`` if it
                       was killed by signal N, as in a shell)
``75`` EXIT_BUSY       the lock was busy: not acquired at once (no ``--wait``) or
                       within ``--timeout``; the command did not run
``76`` EXIT_LOST       the hold was lost while the command ran: the command was
                       stopped (SIGTERM, then SIGKILL after the grace period), or
                       it had just ended and the release found the hold gone
``126`` / ``127``      the command could not be run / was not found (as in a shell)
=====================  ==========================================================

(The command lines add ``1``: an engine that cannot be reached, a bad URL or setting;
``2``: a usage error.)

The command runs in a process group of its own, with ``YLOCK_TOKEN`` (the fencing token)
and ``YLOCK_LOCK`` (``group/name``) in its environment. SIGTERM, SIGINT and SIGHUP sent to
the runner are forwarded to that group, and the runner then waits for the command and
passes its exit code through. On Linux the command is also killed (SIGKILL) if the runner
itself dies (``PR_SET_PDEATHSIG``): a runner killed with SIGKILL leaves no command running
without the lock. Elsewhere such a command lives on; use a lease and fencing tokens.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TextIO, TypeVar

from ylock import events
from ylock import options as opt
from ylock.errors import LockLost, LockTimeout
from ylock.lock import Lock
from ylock.owner import after_fork as _after_fork
from ylock.owner import current_owner
from ylock.threads import start_thread

logger = logging.getLogger(__name__)

T = TypeVar("T")

EXIT_BUSY = 75
EXIT_LOST = 76
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
#: Seconds between SIGTERM and SIGKILL when a command must stop because the hold was lost.
GRACE = 10.0
#: The signals a runner forwards to its command.
FORWARDED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))

__all__ = ["Leadership", "Term", "run_command", "EXIT_BUSY", "EXIT_LOST", "EXIT_CANNOT_RUN", "EXIT_NOT_FOUND",
           "GRACE"]


class Term:
    """One continuous hold of a :class:`Leadership` (see the module docstring)."""

    def __init__(self, lock: Lock, owner: str, token: int | None) -> None:
        self.lock = lock
        self.owner = owner
        #: The fencing token of this term: strictly greater than any earlier term's.
        self.token = token
        #: Set as soon as the hold is known to be lost.
        self.lost = threading.Event()
        #: Why it was lost (None while it is not).
        self.reason: str | None = None
        self.started = time.monotonic()
        self._callbacks: list[Callable[[Term], object]] = []
        self._mutex = threading.Lock()

    def on_lost(self, callback: Callable[[Term], object]) -> None:
        """Call ``callback(term)`` once the hold is lost (at once if it is already), in a
        thread of its own: a slow callback delays nothing of ylock's."""
        with self._mutex:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        _call_soon(callback, self)

    def check(self) -> None:
        """Raise :class:`ylock.LockLost` if the hold was lost."""
        if self.lost.is_set():
            raise LockLost(f"the leadership was lost ({self.reason})", group=self.lock.group, name=self.lock.name)

    def _lose(self, reason: str) -> None:
        with self._mutex:
            if self.lost.is_set():
                return
            self.reason = reason
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
        logger.info("ylock: leadership of %s/%s lost: %s", self.lock.group, self.lock.name, reason)
        for callback in callbacks:
            _call_soon(callback, self)

    def __repr__(self) -> str:
        state = f"lost: {self.reason}" if self.lost.is_set() else "leading"
        return f"<ylock.leader.Term {self.lock.group}/{self.lock.name} token={self.token} {state}>"


def _call_soon(callback: Callable[[Term], object], term: Term) -> None:
    def call() -> None:
        try:
            callback(term)
        except Exception:  # noqa: BLE001 - a callback's failure is its own
            logger.exception("ylock: on_lost callback %r failed", callback)
    start_thread(call, "ylock-leadership-lost")


class Leadership:
    """Lead while holding ``lock``'s write side (see the module docstring).

    ``on_lost(term)``, if given, is registered on every term (see :meth:`Term.on_lost`).
    A term belongs to the thread (or asyncio task, or owner scope) that started it, as the
    lock's holds do.
    """

    def __init__(self, lock: Lock, *, on_lost: Callable[[Term], object] | None = None) -> None:
        if not isinstance(lock, Lock):
            raise opt.fail("lock", f"must be a ylock.Lock, got {lock!r}", opt.E_LOCK_OPTION)
        if on_lost is not None and not callable(on_lost):
            raise opt.fail("on_lost", f"must be callable, got {on_lost!r}", opt.E_LOCK_OPTION)
        self.lock = lock
        self.on_lost = on_lost

    def __repr__(self) -> str:
        return f"<ylock.leader.Leadership {self.lock.group}/{self.lock.name}>"

    @contextlib.contextmanager
    def lead(self, timeout: float | None = None) -> Iterator[Term]:
        """Hold the write lock for the block and yield its :class:`Term`.

        Wait up to ``timeout`` seconds (None: until leading; 0: try once), else raise
        :class:`ylock.LockTimeout`. On leaving, release the lock; raise
        :class:`ylock.LockLost` if the hold had been lost (unless the block raised).
        """
        timeout = opt.timeout(timeout)
        self.lock.lock(timeout)
        term = Term(self.lock, current_owner(), self.lock.token)
        if self.on_lost is not None:
            term.on_lost(self.on_lost)
        _watch(term)
        if self.lock.lost:                  # lost before the watch was in place
            term._lose("lost before the term started")
        failed = True
        try:
            yield term
            failed = False
        finally:
            _unwatch(term)
            try:
                self.lock.unlock()
            except LockLost as exc:
                term._lose(str(exc))
                if not failed:
                    raise

    def run_while_leader(self, func: Callable[..., T], *args: Any, timeout: float | None = None,
                         **kwargs: Any) -> T:
        """Wait to lead (see :meth:`lead`), return ``func(term, *args, **kwargs)``; raise
        :class:`ylock.LockLost` instead if the term was lost meanwhile (``func`` should
        watch ``term.lost`` and stop early: it is not interrupted)."""
        with self.lead(timeout) as term:
            result = func(term, *args, **kwargs)
        term.check()
        return result


# -- lost events to terms ---------------------------------------------------------------------------

_terms: dict[tuple[str, str, str], Term] = {}
_terms_mutex = threading.Lock()


def _on_event(event: events.Event) -> None:
    if event.kind != events.LOST:
        return
    term = _terms.get((event.group, event.name, event.owner or ""))
    if term is not None and event.engine == term.lock.engine.scheme:
        term._lose(event.detail or "the hold was lost")


def _watch(term: Term) -> None:
    with _terms_mutex:
        _terms[(term.lock.group, term.lock.name, term.owner)] = term
        events.subscribe(_on_event)


def _unwatch(term: Term) -> None:
    with _terms_mutex:
        key = (term.lock.group, term.lock.name, term.owner)
        if _terms.get(key) is term:
            del _terms[key]
        if not _terms:
            events.unsubscribe(_on_event)


def _after_fork_in_child() -> None:
    global _terms_mutex
    _terms.clear()            # the parent's holds are not the child's
    _terms_mutex = threading.Lock()


_after_fork(_after_fork_in_child)   # os.fork() and forks made from C (uWSGI)


# -- ylock run ---------------------------------------------------------------------------------------

def run_command(lock: Lock, command: Sequence[str], *, timeout: float | None = 0.0, grace: float = GRACE,
                env: Mapping[str, str] | None = None, stderr: TextIO | None = None) -> int:
    """Run ``command`` while holding ``lock``'s write side; return the exit code to exit with
    (see the module docstring's table).

    ``timeout``: seconds to wait for the lock (0: try once; None: wait as long as it takes);
    ``grace``: seconds between SIGTERM and SIGKILL when the hold is lost; ``env``: the
    command's environment (default: this process's) to which ``YLOCK_TOKEN`` and
    ``YLOCK_LOCK`` are added; ``stderr``: where the runner's own one-line messages go
    (default: ``sys.stderr``). Raise :class:`ylock.EngineUnavailable` if the engine cannot
    be reached before the command starts.
    """
    timeout = opt.timeout(timeout, "timeout")
    grace = opt.seconds(grace, "grace", minimum=0, maximum=3600, above=None)
    command = list(command)
    if not command or not all(isinstance(part, str) for part in command):
        raise opt.fail("command", f"must be a non-empty list of strings, got {command!r}", opt.E_LOCK_OPTION)
    out = stderr or sys.stderr
    label = f"{lock.group}/{lock.name}"

    def say(message: str) -> None:
        print(f"ylock: {message}", file=out, flush=True)

    leading = Leadership(lock).lead(timeout)
    try:
        term = leading.__enter__()
    except LockTimeout:
        say(f"{label} is busy{'' if timeout == 0 else f' (waited {timeout:g} s)'}: not running {command[0]}")
        return EXIT_BUSY
    code = EXIT_LOST
    try:
        code = _supervise(term, command, grace, env, say)
    finally:
        try:
            leading.__exit__(None, None, None)
        except LockLost as exc:
            if code != EXIT_LOST:
                say(f"the hold of {label} was lost before the command's end was known: {exc}")
            code = EXIT_LOST
    return code


def _supervise(term: Term, command: list[str], grace: float, env: Mapping[str, str] | None,
               say: Callable[[str], None]) -> int:
    label = f"{term.lock.group}/{term.lock.name}"
    child_env = dict(os.environ if env is None else env)
    child_env["YLOCK_TOKEN"] = "" if term.token is None else str(term.token)
    child_env["YLOCK_LOCK"] = label
    try:
        child = subprocess.Popen(command, env=child_env, **_own_group())
    except FileNotFoundError as exc:
        say(f"cannot run {command[0]}: {exc.strerror or exc}")
        return EXIT_NOT_FOUND
    except OSError as exc:
        say(f"cannot run {command[0]}: {exc.strerror or exc}")
        return EXIT_CANNOT_RUN
    finished = threading.Event()
    term.on_lost(lambda _: finished.set())

    def reap() -> None:
        child.wait()
        finished.set()
    start_thread(reap, "ylock-run-child")
    with _forwarding(child):
        # Short waits, so that a forwarded signal's handler runs at once in the main thread.
        while not finished.wait(0.1):
            pass
        if child.poll() is None and term.lost.is_set():
            say(f"lost the lock {label} ({term.reason}): stopping the command (SIGTERM)")
            _signal_group(child, signal.SIGTERM)
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                say(f"the command did not stop within {grace:g} s: SIGKILL")
                _signal_group(child, signal.SIGKILL)
                child.wait()
            return EXIT_LOST
        code = child.wait()
    if term.lost.is_set():
        say(f"lost the lock {label} ({term.reason}) as the command ended")
        return EXIT_LOST
    return code if code >= 0 else 128 - code


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.name == "posix":
            os.killpg(child.pid, signum)
        else:
            child.send_signal(signum)


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """Forward the :data:`FORWARDED` signals to the command's group while it runs (only the
    main thread can handle signals: elsewhere nothing is forwarded)."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in FORWARDED:
            previous[signum] = signal.signal(signum, lambda s, _: _signal_group(child, s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _own_group() -> dict[str, Any]:
    """Popen arguments that put the command in a process group of its own, killed (Linux)
    when the runner dies."""
    if os.name != "posix":
        return {}
    prctl = _prctl()
    parent = os.getpid()

    def setup() -> None:   # runs in the child, between fork and exec
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, signal.SIGKILL)          # PR_SET_PDEATHSIG
            if os.getppid() != parent:        # the runner died before that: do not run
                os._exit(EXIT_LOST)
    return {"preexec_fn": setup}


_prctl_function: Any = None


def _prctl() -> Any:
    global _prctl_function
    if _prctl_function is None and sys.platform.startswith("linux"):
        try:
            _prctl_function = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl_function = False
    return _prctl_function or None
