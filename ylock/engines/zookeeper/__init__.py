"""The ZooKeeper engine: a fair read-write lock and semaphore on ZooKeeper's sequential
ephemeral nodes, through kazoo's public asynchronous API (no recipe, no kazoo internals).

URL::

    zookeeper://[user:password@]host1:2181,host2:2181[/chroot][?options]

``user:password`` become kazoo ``digest`` auth, and the owner of every node ylock creates:
``acl`` says who else may touch them: ``creator`` (the default with credentials: only
clients authenticated as that user may read or change them), ``read`` (the same, and anyone
may read: list locks, holders and waiters, as an operator's tool does, but change nothing),
``open`` (anyone may do anything: the only mode without credentials). Nodes an older ylock
created open stay open until they are deleted (idle lock parents are, after ``idle``).

TLS: ``tls=1`` (implied by any of the next three), ``ca`` (the CA bundle that signs the
servers' certificates; default: the system's), ``certfile`` and ``keyfile`` (a client
certificate and its key, both or neither, for servers that require one: mutual TLS),
``verify_certs`` (default 1; 0 skips checking the server's certificate: never in
production), ``check_hostname`` (default: as ``verify_certs``; the host name or IP in the
URL must be in the server's certificate; 0 for certificates that do not name the hosts as
the URL does). Files are checked to exist when the engine is made. Every message that quotes the URL hides its password.

Options (query parameters or keyword
arguments): ``session_timeout`` (seconds, default 10: this is the lease: a holder whose
session expires loses its locks), ``connect_timeout`` (default 2: the longest one request
may take, and how long the first call waits for the first connection), ``root`` (the
znode under which locks live, default ``/ylock``), ``idle`` (seconds after which an
unused lock parent znode is deleted, default 2), ``suspended`` (what a connection that stops
answering means for the holds: ``guard``, the default: every hold is marked lost once the
quorum has not answered for ``lost_after`` times the negotiated session timeout, default
1/2, before the quorum can expire the session and grant the locks to someone else; ``lost``:
also at once when kazoo suspends the connection; ``wait``: only when the session is known
to have expired, which a client cut off from the quorum learns only once it reconnects; see
:mod:`ylock.engines.zookeeper.guard`).

Guarantees: exclusion holds while the holder's session lives; quorum writes are not lost
on failover. A session that expires (the process paused past ``session_timeout``, or cut
off) marks every hold lost (``lock.lost``, ``LockLost`` at release, a ``lost`` event); a
suspended connection publishes ``suspended``, its return ``reconnected``. With the default
``suspended=guard``, a holder cut off from the quorum (its server partitioned, frozen or
unreachable) is told it lost its locks half a session timeout after the quorum last
answered it, before the quorum can grant them to anyone else; should the session survive,
its nodes are deleted once it reconnects (a lost hold never goes on, nor blocks others). Fencing token:
the node's ``czxid``; zxids increase across the ensemble, so tokens strictly increase per
lock name, also after its parent was deleted.

The package, by concern:

* ``engine``: :class:`ZooKeeperEngine`, the lock protocol's steps (its docstring describes
  the protocol);
* ``url``: the URL and options, checked once (``Settings``);
* ``session``: the kazoo client, its connection and session state, and what that state
  means for the holds (suspended, reconnected, lost); kazoo errors translated;
* ``guard``: the quorum guard: holds marked lost when the quorum may have expired the session;
* ``handler``: the kazoo handler (a cheaper wait; the engine's watches run in kazoo's
  connection thread);
* ``ops``: the operations the steps yield and their sync and asyncio executors;
* ``claim``: one owner's node on one lock;
* ``keeper``: the LockKeeper: the claims table, held claims' watches, background deletes
  and tidying of idle lock parents;
* ``paths``: the znode grammar (paths, escaping, node names, who blocks whom);
* ``inspection``: describe, stats and force-release.
"""
from ylock.engines.zookeeper.engine import ZooKeeperEngine

__all__ = ["ZooKeeperEngine"]
