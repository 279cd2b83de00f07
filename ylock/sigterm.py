"""Give back a plain script's holds when it is stopped with SIGTERM (``kill PID``).

Python's default SIGTERM kills the process without running its exit hooks, so the
release at exit (:func:`ylock.exiting.release_all`) never runs and the holds block others
for their whole lease. A library must not take over a signal the application handles,
so ylock installs its handler only where nobody else has one: on a process's first
acquisition in the main thread (only the main thread may set handlers), if SIGTERM's
handler is still the default one, and not inside uWSGI or mod_wsgi (they handle signals
in C, where Python cannot see it). Gunicorn, Celery, uvicorn and asyncio install their
own handlers, so they are unaffected; an application that installs its own later simply
replaces ylock's.

The handler calls ``release`` (the lock module passes its release at exit, with
:data:`ylock.exiting.EXIT_BUDGET` as ``budget``), then restores the default handler and
sends SIGTERM again: the process still dies of SIGTERM, with the same exit status and
without exit hooks, as it would have without ylock.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable

from ylock.threads import start_thread

#: Set once the main thread looked at SIGTERM's handler (installed ylock's or left it).
checked = False

#: Hosts that handle signals outside Python: a Python handler would take SIGTERM from them.
_C_HOSTS = ("uwsgi", "mod_wsgi")


def install(release: Callable[[], object], budget: float) -> bool:
    """Install the handler if SIGTERM has the default one and this is the main thread of a
    plain Python process; return whether it was installed. The handler calls ``release``
    (which gives back every hold of the process) and waits ``budget`` seconds for it at
    most. Called on each first acquisition until the main thread has looked once (cheap:
    one global test after)."""
    global checked
    if threading.current_thread() is not threading.main_thread():
        return False                  # only the main thread may set handlers: look again later
    checked = True
    if any(host in sys.modules for host in _C_HOSTS):
        return False
    # multiprocessing stops its children with SIGTERM (Pool.terminate, Process.terminate) and
    # waits for them: they must die at once, as they did before ylock, not run a release.
    if multiprocessing.parent_process() is not None:
        return False
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False              # the application's (or its server's) own handler, or SIG_IGN
        signal.signal(signal.SIGTERM, lambda signum, frame: _on_sigterm(release, budget))
    except (ValueError, OSError):     # not the main interpreter, or no such signal here
        return False
    return True


def _on_sigterm(release: Callable[[], object], budget: float) -> None:
    # Release from another thread: the signal may have interrupted this one inside the hold
    # table or an engine while it held their (non-reentrant) locks. The helper then waits
    # for them in vain, the join gives up after the budget and those holds keep their lease,
    # which is no worse than without the handler.
    helper = start_thread(release, "ylock-sigterm")
    helper.join(budget + 1.0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
