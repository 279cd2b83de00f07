"""ylock's background threads leave the process's signals to the application's threads.

A signal sent to a process (``kill PID``, Ctrl-C) is delivered to one of its threads that
does not block it. Python runs its handlers in the main thread, but only once the main
thread runs Python code again: when the kernel hands the signal to another thread, a main
thread blocked in a system call (reading stdin or a socket, ``select``) is not woken, and
the application's SIGTERM handler runs late or never (the suite caught a script with its
own handler still blocked in ``sys.stdin.read()`` 30 s after ``kill``). So every thread
ylock starts (the watchdog, the notify hubs, the exporters, the ZooKeeper client's) blocks
the asynchronous signals: they go to the application's threads, as if ylock had none.

The faults a thread raises itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP,
SIGSYS) stay unblocked: blocking them is undefined, and faulthandler reports them.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["quiet_signals", "start_thread"]

_SYNCHRONOUS = {getattr(signal, name) for name in
                ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS", "SIGKILL", "SIGSTOP")
                if hasattr(signal, name)}


def _asynchronous() -> set[signal.Signals]:
    return {s for s in signal.valid_signals() if isinstance(s, signal.Signals) and s not in _SYNCHRONOUS}


@contextlib.contextmanager
def quiet_signals() -> Iterator[None]:
    """Within: the calling thread blocks the asynchronous signals, so that the threads it
    starts (which inherit its mask) never receive them. Restored on exit; a signal that
    arrived meanwhile is delivered then. A no-op where ``pthread_sigmask`` is missing."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _asynchronous())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = (),
                 daemon: bool = True) -> threading.Thread:
    """Start and return a thread running ``target(*args)`` that receives no asynchronous
    signal (see the module's docstring)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    with quiet_signals():
        thread.start()
    return thread
