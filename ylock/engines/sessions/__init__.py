"""What the engines whose holds live in a server session share: the PostgreSQL engine
(:mod:`ylock.engines.postgres`, advisory locks) and the MySQL engine
(:mod:`ylock.engines.mysql`, ``GET_LOCK``).

A hold of these engines is a lock of the server's session: it lasts as long as the
connection that took it, the server frees it when that connection closes, and the lease is
the session's idle timeout, renewed by a heartbeat on that connection. So both engines keep
one connection per owner and lock, a pool of them, a table of which connection carries
which hold, and both write their acquisitions once, as generators of operations that an
executor does blocking or awaited. This package is that share; each engine keeps its wire,
its SQL, how it opens and sets up a connection, and its grant protocol.

The modules, by concern: :mod:`~.connection` (a connection's state while it serves a
hold, :class:`~.connection.Hold`), :mod:`~.ops` (the operations both engines' steps yield),
:mod:`~.pool` (the bounded pool, the held table, heartbeats), :mod:`~.executor` (the frame
of doing the operations, blocking or awaited), :mod:`~.steps` (the frame of an acquisition
and a release), :mod:`~.engine` (the engine protocol over them: options, the frame of error
translation, renewals, tickets, life cycle).
"""
