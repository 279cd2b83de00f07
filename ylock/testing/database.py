"""What the test database servers (:mod:`~ylock.testing.postgres`,
:mod:`~ylock.testing.mariadb`) share: the unprivileged user a server runs as when we are
root, and the life of one server process in a directory of its own: started on a free port
(another one when the picked port turned out taken, told by a bind error in its log),
started again on the same port and data, cleaned up with its directory."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import TypeVar

from ylock.testing import ServerError, ServerProcess, free_port

_D = TypeVar("_D", bound="DatabaseServer")


def unprivileged_user(env: str, default: str, server: str, package: str) -> pwd.struct_passwd | None:
    """Return the user a server runs as when this process is root (None: as ourselves): the
    one ``env`` names, else ``default`` (the user Debian's ``package`` creates), else
    ``nobody``. ``server`` names the server in the error when there is none."""
    if os.geteuid() != 0:
        return None
    for name in filter(None, [os.environ.get(env, ""), default, "nobody"]):
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        if user.pw_uid != 0:
            return user
    raise ServerError(f"running as root and no unprivileged user to run {server} as "
                      f"(set {env}, or apt-get install {package}, which creates '{default}')")


class DatabaseServer(ServerProcess):
    """One database server on 127.0.0.1 at a free port, in its own directory. A subclass
    prepares the directory once (:meth:`_prepare`), starts the process (:meth:`_popen`),
    tells whether the server answering is ours (:meth:`_wait_ready`), and names its binary
    (:attr:`binary`) and the log lines of a port already taken (:attr:`bind_errors`)."""

    binary = ""
    bind_errors: tuple[str, ...] = ()
    start_timeout = 30.0
    own_dir = True          # the directory was made here: cleanup() removes it
    port: int
    dir: Path
    paused = False
    _log_offset = 0         # where the current run's lines start in the log

    def _prepare(self) -> None:
        """Make the directory and the data, once."""

    def _popen(self) -> subprocess.Popen[bytes]:
        """Start the server process on :attr:`port`."""
        raise NotImplementedError

    def _wait_ready(self, timeout: float) -> bool:
        """Wait until the process started last answers as ours; False if it does not."""
        raise NotImplementedError

    def _started(self) -> None:
        """The first start answered: finish setting the server up."""

    def start(self: _D, attempts: int = 5, timeout: float | None = None) -> _D:
        """Start the server; retry on another port if the picked one was taken. Returns self."""
        self._prepare()
        for _ in range(attempts):
            if not self.port or self.proc is not None:
                self.port = free_port()
            self.proc = None
            if self._spawn(self.start_timeout if timeout is None else timeout):
                self._started()
                return self
            if not self._port_taken():
                break
        raise ServerError(f"{self.binary} did not start on 127.0.0.1:{self.port}; last log:\n{self.read_log()}")

    def _spawn(self, timeout: float) -> bool:
        """Start the process and wait until it answers as ours; False (and stopped) if not."""
        self._log_offset = self.log_size()
        self.proc = self._popen()
        self.paused = False
        if self._wait_ready(timeout):
            return True
        self.stop()
        return False

    def _port_taken(self) -> bool:
        text = self.log_since(self._log_offset)
        return any(e in text for e in self.bind_errors)

    def _start_again(self, timeout: float, pause: float) -> None:
        """Start the stopped server on the same port with the same data, retrying for
        ``timeout`` seconds while the port is taken (a socket of the old process lingering)."""
        deadline = time.monotonic() + timeout
        while True:
            self.proc = None
            if self._spawn(timeout):
                return
            if not self._port_taken() or time.monotonic() > deadline:
                raise ServerError(f"{self.binary} could not restart on port {self.port}; last log:\n"
                                  f"{self.read_log()}")
            time.sleep(pause)

    def cleanup(self) -> None:
        """Stop, and remove the directory (data and log) if it was made here."""
        self.stop()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
