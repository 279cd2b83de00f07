"""Real deployments, as a new user builds and runs them.

Projects are written from the README's quick starts (its code blocks, extracted here, so
the README cannot drift from what works), served by gunicorn, uWSGI or uvicorn in their
own processes on free loopback ports, started cold and hit over real HTTP by concurrent
clients at once (no warm-up request). Every server started here runs in its own process
group and is stopped by its pid in a ``finally``; its output is attached to the report of
a failing test. The embedded Redis is checked through its state file and ``/proc``, never
by connecting from the test process (which would make it one of the server's users).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import ylock
from ylock import embedded
from ylock.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEMPLATES = Path(__file__).resolve().parent / "templates"
BIN = Path(sys.executable).parent          # the servers' console scripts (uwsgi) live beside python

#: Every server process started by the running test, for its failure report (see conftest).
started: list[Served] = []


# -- the README ---------------------------------------------------------------------------------


def readme_section(title: str, path: Path = README) -> str:
    """The text of the ``## title`` section (up to the next ``## `` heading)."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{path.name} has no '## {title}' section"
    return match.group(1)


def code_blocks(text: str, lang: str = "python") -> list[str]:
    """The fenced ``lang`` code blocks of ``text``, in order."""
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)]


def readme_block(section: str, first_line: str, path: Path = README) -> str:
    """The Python block of a README section whose first line starts with ``first_line``
    (e.g. ``# settings.py``): what a user would paste into that file."""
    blocks = [b for b in code_blocks(readme_section(section, path)) if b.startswith(first_line)]
    assert len(blocks) == 1, f"expected one block starting {first_line!r} in '## {section}', found {len(blocks)}"
    return blocks[0]


# -- projects -----------------------------------------------------------------------------------


def django_project(root: Path) -> Path:
    """``django-admin startproject mysite`` in ``root``, then the README's Django quick start
    as a user pastes it: its settings block appended to ``mysite/settings.py``, its views
    block as ``mysite/views.py``, the health check of docs/deployment.md as
    ``mysite/health.py``; plus the tests' counter views and urls (templates/django)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "django", "startproject", "mysite", str(root)], check=True,
                   capture_output=True, env=clean_env(), timeout=60)
    site = root / "mysite"
    with (site / "settings.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\n" + readme_block("Django quick start", "# settings.py"))
    (site / "views.py").write_text(readme_block("Django quick start", "# views.py"), encoding="utf-8")
    (site / "health.py").write_text(readme_block("Health checks", "# health.py", DOCS / "deployment.md"),
                                   encoding="utf-8")
    for name in ("counter.py", "urls.py"):
        shutil.copy(TEMPLATES / "django" / name, site / name)
    return root


def flask_project(root: Path) -> Path:
    """The README's Flask quick start pasted as ``app.py``, plus the tests' counter views
    (templates/flask/counter_app.py, which imports it)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "app.py").write_text(readme_block("Flask quick start", "# app.py"), encoding="utf-8")
    shutil.copy(TEMPLATES / "flask" / "counter_app.py", root / "counter_app.py")
    return root


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of the test session's Django settings or
    ylock URL (pytest-django sets DJANGO_SETTINGS_MODULE for this process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "YLOCK_URL")}
    env.update(extra)
    return env


# -- processes ----------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(pid: int) -> dict[int, int]:
    """The live descendants of ``pid``: pid -> start time."""
    parents: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for p in _pids():
        st = _stat(p)
        if st is not None:
            parents[st[0]].append((p, st[1]))
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child, started in parents.get(todo.pop(), []):
            found[child] = started
            todo.append(child)
    return found


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on 127.0.0.1:port (state 0A in /proc/net/tcp)."""
    inodes = set()
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        for line in fh:
            parts = line.split()
            if parts[1] == f"0100007F:{port:04X}" and parts[3] == "0A":
                inodes.add(parts[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` has open."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    found.add(target[8:-1])
    return found


class Served:
    """One server command (gunicorn, uWSGI, uvicorn) in its own process group, on a free
    port of 127.0.0.1, its output in a file. ``wait_listening`` returns as soon as the
    port is bound by one of its processes: before any worker may have loaded the app."""

    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.log = log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, int] = {}      # every descendant seen: pid -> start time
        self.survivors: list[int] = []      # processes that outlived stop()'s grace period

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, attempts: int = 3) -> Served:
        """Start the server and wait until it listens; try another port if it lost a race for one."""
        for _ in range(attempts):
            self.port = free_port()
            argv = [a.replace("{port}", str(self.port)) for a in self.argv]
            with self.log.open("ab") as out:
                out.write(f"$ {' '.join(argv)}\n".encode())
                out.flush()
                self.proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            started.append(self)
            if self.wait_listening(timeout):
                return self
            if "in use" not in self.output():
                break
            self.stop()
        raise AssertionError(f"{self.name} did not start listening:\n{self.output()[-4000:]}")

    def wait_listening(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            inodes = _listening_inodes(self.port)
            if inodes:
                family = [self.proc.pid, *descendants(self.proc.pid)]
                if any(inodes & socket_inodes(pid) for pid in family):
                    return True
                raise AssertionError(f"something else listens on port {self.port}")
            time.sleep(0.01)
        return False

    def processes(self) -> dict[int, int]:
        """The server's live processes below the one started (workers, routers): pid -> start."""
        assert self.proc is not None
        found = descendants(self.proc.pid)
        self.seen.update(found)
        return found

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout: float) -> int | None:
        """Wait for the server to exit by itself (a failed boot); its exit status, or None."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop gracefully (``sig`` to the process started) and give every process of it seen
        while it ran ``timeout`` seconds to exit by itself; then kill what is left (the process
        group, and each of those processes by pid), and remember it (:meth:`leftovers`)."""
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout
        if self.proc.poll() is None:
            self.processes()
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.survivors.append(self.proc.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        while (alive := self._alive()) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.survivors.extend(alive)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _alive(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if (st := _stat(pid)) is not None and st[1] == started]

    def leftovers(self) -> list[int]:
        """Processes of this server that had not exited ``timeout`` seconds after :meth:`stop`
        (they were killed then): none, unless something of the server hangs or leaks."""
        return list(self.survivors)


@contextlib.contextmanager
def serving(name: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path,
            sig: int = signal.SIGTERM) -> Iterator[Served]:
    """Run a server for the ``with`` block; stop it (by pid) however the block ends."""
    served = Served(name, argv, cwd, env, log)
    try:
        yield served.start()
    finally:
        served.stop(sig)


def gunicorn(app: str, *options: str) -> list[str]:
    argv = [sys.executable, "-m", "gunicorn", "--bind", "127.0.0.1:{port}", "--graceful-timeout", "10", *options]
    if _has_control_socket():
        argv.append("--no-control-socket")     # gunicorn >= 25: one per user by default, shared by every run
    return [*argv, app]


def _has_control_socket() -> bool:
    global _control_socket
    if _control_socket is None:
        help_text = subprocess.run([sys.executable, "-m", "gunicorn", "--help"], capture_output=True, text=True,
                                   timeout=60).stdout
        _control_socket = "--no-control-socket" in help_text
    return _control_socket


_control_socket: bool | None = None


def uwsgi_binary() -> str:
    """The uwsgi executable of this environment (a test dependency: missing is a failure)."""
    found = shutil.which("uwsgi", path=str(BIN)) or shutil.which("uwsgi")
    assert found, "uwsgi is not installed: pip install -e '.[test]'"
    return found


# -- the embedded Redis, seen from outside ------------------------------------------------------


def embedded_processes(db: Path) -> tuple[list[int], list[int]]:
    """(redis-servers, keepers) running for the database file ``db``: servers by their
    working directory (the keeper starts them in the database's directory), keepers by
    their command line."""
    real = os.path.realpath(db)
    servers, keepers = [], []
    for pid in _pids():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm == "redis-server":
                if os.path.realpath(os.readlink(f"/proc/{pid}/cwd")) == os.path.dirname(real):
                    servers.append(pid)
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        keeper = any(a.endswith(b"embedded/__main__.py") for a in cmdline)
        if b"keep" in cmdline and os.fsencode(real) in cmdline and keeper:
            keepers.append(pid)
    return servers, keepers


def embedded_users(db: Path) -> set[int]:
    """Pids holding a shared flock on the database's users file: the processes using the server."""
    try:
        inode = os.stat(str(db) + ".users").st_ino
    except FileNotFoundError:
        return set()
    users = set()
    with open("/proc/locks", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if "->" in parts:
                parts.remove("->")
            if parts[1] == "FLOCK" and parts[3] == "READ" and int(parts[5].rsplit(":", 1)[1]) == inode:
                users.add(int(parts[4]))
    return users


def assert_one_embedded_server(db: Path, workers: set[int], answered: set[int] = frozenset()) -> embedded.ServerInfo:
    """Exactly one redis-server and one keeper serve ``db``, as its state file records; every
    process using it is one of ``workers``, and each worker in ``answered`` uses it."""
    info = embedded.server_info(db)
    servers, keepers = embedded_processes(db)
    assert info is not None, f"no embedded server recorded for {db}"
    assert servers == [info.pid], f"redis-servers for {db}: {servers}, recorded: {info.pid}"
    assert keepers == [info.keeper_pid], f"keepers for {db}: {keepers}, recorded: {info.keeper_pid}"
    users = embedded_users(db)
    assert users and answered <= users <= workers, f"users of the server {users}, workers {workers}, " \
                                                   f"answered by {answered}"
    return info


#: What the embedded engine keeps next to its database file (the README lists them for .gitignore).
EMBEDDED_FILES = ("", ".lock", ".users", ".state", ".conf", ".log", ".sock")
#: ... and what is left of them once its server has stopped.
EMBEDDED_FILES_AFTER = ("", ".lock", ".users", ".conf", ".log")


def embedded_files(db: Path) -> set[str]:
    """The suffixes of the files named after ``db`` in its directory (``""``: ``db`` itself)."""
    if not db.parent.is_dir():
        return set()
    return {p.name[len(db.name):] for p in db.parent.iterdir() if p.name.startswith(db.name)}


def wait_embedded_gone(db: Path, timeout: float = 20.0) -> float:
    """Wait until no server or keeper runs for ``db`` and no state is recorded; return how long it took."""
    started = time.monotonic()
    while True:
        servers, keepers = embedded_processes(db)
        if not servers and not keepers and embedded.server_info(db) is None:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, \
            f"embedded server still running {timeout}s after the last user stopped: servers {servers}, " \
            f"keepers {keepers}, state {embedded.server_info(db)}"
        time.sleep(0.05)


# -- clients ------------------------------------------------------------------------------------


@dataclass
class Burst:
    """What a burst of concurrent requests got back."""

    codes: collections.Counter[int | str]
    sent: float                             # wall clock when the requests went out
    seconds: float                          # from then to the last answer
    first: float                            # until the first answer (a cold start shows here)
    bodies: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return self.codes.get(200, 0)

    def per_pid(self) -> collections.Counter[int]:
        return collections.Counter(b["pid"] for b in self.bodies if isinstance(b, dict) and "pid" in b)

    def owners(self) -> list[str]:
        return [b["owner"] for b in self.bodies if isinstance(b, dict) and "owner" in b]

    def loaded(self) -> list[float]:
        """When each answering worker loaded the view (wall clock)."""
        return sorted({b["loaded"] for b in self.bodies if isinstance(b, dict) and "loaded" in b})


def assert_cold(result: Burst) -> None:
    """The requests were on their way before a worker had loaded the app: no warm-up."""
    assert result.loaded() and result.sent < result.loaded()[-1], \
        f"every worker had loaded the app {result.sent - result.loaded()[-1]:.2f}s before the burst"


def assert_no_lost_update(result: Burst, counter: Path, count: int) -> None:
    """Every request answered 200, the counter counts every one of them (no update lost),
    and each request had a lock owner id of its own."""
    assert result.codes == {200: count}, f"answers: {dict(result.codes)}"
    assert counter_value(counter) == count, f"{count - counter_value(counter)} updates lost"
    owners = result.owners()
    assert len(set(owners)) == len(owners) == count, \
        f"{len(owners) - len(set(owners))} requests shared a lock owner id with another request"


def burst(url: str, count: int, concurrency: int, *, method: str = "POST", timeout: float = 60.0) -> Burst:
    """Send ``count`` requests, ``concurrency`` at a time (each on its own connection), and
    collect the statuses (or the client error's name) and the JSON bodies."""

    async def run() -> Burst:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        gate = asyncio.Semaphore(concurrency)
        first: list[float] = []
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            async def one() -> tuple[int | str, Any]:
                async with gate:
                    try:
                        response = await client.request(method, url)
                    except httpx.HTTPError as exc:
                        return type(exc).__name__, None
                    first.append(time.monotonic())
                    try:
                        body = response.json()
                    except ValueError:
                        body = response.text[:200]
                    return response.status_code, body
            sent, started = time.time(), time.monotonic()
            results = await asyncio.gather(*(one() for _ in range(count)))
            seconds = time.monotonic() - started
        return Burst(collections.Counter(code for code, _ in results), sent, seconds,
                     (min(first) - started) if first else float("nan"), [body for _, body in results])
    return asyncio.run(run())


def counter_value(path: Path) -> int:
    return int(path.read_text()) if path.exists() else 0


def figures(label: str, result: Burst, **extra: Any) -> str:
    """One line of measured figures, printed (pytest -s) and kept in the junit properties."""
    rate = sum(result.codes.values()) / result.seconds if result.seconds else 0.0
    parts = [f"{label}: {dict(result.codes)}", f"first answer {result.first:.2f}s", f"all {result.seconds:.2f}s",
             f"{rate:.0f} req/s", *(f"{k} {v}" for k, v in extra.items())]
    line = "[deploy] " + ", ".join(parts)
    print(line)
    return line


def assert_nothing_held(url: str) -> None:
    """No lock of ``url``'s prefix is held or waited for."""
    engine = ylock.engine_from_url(url)
    try:
        infos = list(engine.describe())
        assert not [i for i in infos if i.owners or i.waiters], f"left behind: {infos}"
    finally:
        engine.close()


def record(request: pytest.FixtureRequest, line: str) -> None:
    """Keep a line of figures in the test's junit properties."""
    request.node.user_properties.append(("figures", line))
