"""The Redis engine in event loops: each loop's own client, direct calls and notify hub
(asyncio connections belong to the loop that made them: one set per loop), closed with
their loop."""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncGenerator
from typing import Any

from ylock.engines.redis.calls import AsyncDirectCalls
from ylock.engines.redis.cluster import AsyncClusterCalls
from ylock.engines.redis.hubs import NotifyHub
from ylock.engines.redis.parts import EngineParts
from ylock.owner import check_fork

__all__ = ["AsyncSide", "close_dead_sides", "open_side"]


class AsyncSide:
    """One event loop's share of an engine: its asyncio client, direct calls, notify hub,
    closed with the loop (see :func:`open_side`)."""

    __slots__ = ("client", "calls", "hub", "pops", "closer", "__weakref__")

    #: On a Cluster (no hub: a multi-key BLPOP cannot span slots), how many tasks of a loop
    #: may block in a BLPOP of their own at once, each on a connection of its own; the others
    #: wait their poll interval out, as every Cluster task did before.
    CLUSTER_POPS = 32

    def __init__(self, client: Any, calls: Any, hub: NotifyHub | None) -> None:
        self.client = client
        self.calls = calls
        self.hub = hub
        #: Cluster only: the blocking pops this loop may still start (see CLUSTER_POPS).
        self.pops = self.CLUSTER_POPS if hub is None else 0
        self.closer: Any = None     # the async generator whose closing closes this side

    async def aclose(self) -> None:
        """Close every connection of the side (in its loop)."""
        if self.hub is not None:
            await self.hub.aclose()
        if isinstance(self.calls, AsyncClusterCalls):
            await self.calls.aclose()
        pool = getattr(self.client, "connection_pool", None)
        with contextlib.suppress(Exception):
            if pool is not None:
                await pool.disconnect()      # the direct calls' connections count as in use there
            await self.client.aclose()

    def close_now(self) -> None:
        """Close the side's sockets without its loop (which is closed: nothing can run in it)."""
        pools = [getattr(self.client, "connection_pool", None)]
        if isinstance(self.calls, AsyncClusterCalls):
            pools += [client.connection_pool for client in self.calls.clients]
        for pool in pools:
            if pool is None:
                continue
            connections = [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
            for conn in connections:
                _close_socket(conn)
        self.closer = None

    def close_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the side closed in ``loop`` (from any thread), or now if it is closed."""
        if loop.is_closed():
            self.close_now()
            return
        with contextlib.suppress(RuntimeError):      # closed meanwhile: its sockets go with it
            loop.call_soon_threadsafe(lambda: loop.create_task(self.aclose()))


async def open_side(engine: EngineParts) -> AsyncSide:
    """Return this event loop's client, direct calls and notify hub for ``engine``, made on
    their first use here.

    They must not outlive their loop: under WSGI every async view runs in a loop of its
    own (Flask, Django under gunicorn: asgiref's ``asyncio.run`` per request), and its
    connections would stay open for good. They close when the loop shuts down, in the loop:
    an async generator started here is among the ones the loop closes before it closes
    itself (``loop.shutdown_asyncgens()``, which ``asyncio.run``, ``asyncio.Runner`` and
    asgiref call), and its ``finally`` closes the side. Not at garbage collection: the
    connections keep their loop alive (transports refer to it), so a finalizer would wait
    for the cycle collector, which may come much later, or never before the fds run out.
    A loop closed without that shutdown (``loop.close()`` alone) cannot run anything any
    more: the sockets of its side are closed without it when the next loop opens a side
    or the engine is closed."""
    check_fork()
    loop = asyncio.get_running_loop()
    sides: dict[asyncio.AbstractEventLoop, AsyncSide] = engine._async
    side = sides.get(loop)
    if side is not None:
        return side
    close_dead_sides(sides)
    engine.client  # noqa: B018 - registers the scripts (their SHAs) once
    client = engine.clients.build_async()
    pool = getattr(client, "connection_pool", None)
    if pool is None:        # Cluster: routed per slot; no shared BLPOP (no multi-key BLPOP across slots)
        side = AsyncSide(client, AsyncClusterCalls(engine.client, engine.socket_timeout,
                                                   engine.clients.build_async_node), None)
    else:
        calls = AsyncDirectCalls(pool)
        hub = NotifyHub(pool, calls, engine.keys.wake(), engine._refusals) if engine.notify else None
        side = AsyncSide(client, calls, hub)
    sides[loop] = side
    closer = _closed_with_loop(sides, loop, side)
    await closer.asend(None)     # now the loop's: its shutdown_asyncgens() closes it
    side.closer = closer
    return side


def close_dead_sides(sides: dict[asyncio.AbstractEventLoop, AsyncSide]) -> None:
    """Close the sides of loops that were closed without shutting down their async
    generators (their sockets, without the loop, which can no longer run anything)."""
    for loop in [loop for loop in list(sides) if loop.is_closed()]:
        side = sides.pop(loop, None)
        if side is not None:
            side.close_now()


async def _closed_with_loop(sides: dict[asyncio.AbstractEventLoop, AsyncSide], loop: asyncio.AbstractEventLoop,
                            side: AsyncSide) -> AsyncGenerator[None, None]:
    """Suspended for the life of ``loop``; closed by its ``shutdown_asyncgens()``, it closes
    ``side`` (see :func:`open_side`)."""
    try:
        yield
    finally:
        if sides.get(loop) is side:
            del sides[loop]
        await side.aclose()


def _close_socket(conn: Any) -> None:
    """Close a ``redis.asyncio`` connection's socket without its (closed) event loop."""
    writer = getattr(conn, "_writer", None)
    if writer is None:
        return
    sock = writer.get_extra_info("socket")          # asyncio's TransportSocket, which has no close()
    with contextlib.suppress(OSError):
        raw = getattr(sock, "_sock", None)
        if raw is not None:
            raw.close()
        elif sock is not None:
            sock.shutdown(socket.SHUT_RDWR)         # at least the server lets go of it
    conn._reader = conn._writer = None
