"""The lock path on Redis Cluster: each command sent to its key's slot owner over that node's
direct calls (:mod:`.calls`), routed by redis-py's slot map, and every redirection a slot
migration or a failover brings followed within the call's ``end``:

* ``MOVED`` (the slot lives elsewhere now: a migration ended, a replica was promoted): the
  slot map is patched with the new owner (redis-py's own ``move_slot``), and the command sent there;
* ``ASK`` (the slot is migrating and the keys the command declares are no longer here):
  ``ASKING`` and the command, back to back on one connection of the target;
* ``TRYAGAIN`` (the slot is migrating and the keys the command declares are split between the
  two nodes: the script did not run): sent again after a short pause, until ``end``;
* a connection error: the slot map is read anew from the cluster, and the command sent once
  more (a failover promotes a replica), within ``end``.

What each node answers mid-migration (Redis 7, checked by ``tests/redis/test_cluster_migration.py``):
the source runs a script whose declared keys are all there, answers ``TRYAGAIN`` when only some
are, ``ASK`` when none are; the target, asked, runs a script whose declared keys are all there
(or a single-key one whose key is missing) and answers ``TRYAGAIN`` otherwise. A key a script
did not declare is checked only when the script touches it: on a node that does not have it,
the script fails there ("non local key"), after its earlier writes. So every script declares
its keys (see ``lua/common.lua``), and a writer's renewal declares only x: it runs on whichever
node has x, through the whole migration.

A call that meets ``TRYAGAIN`` until its ``end`` raises :class:`redis.exceptions.TryAgainError`
(the engine makes it :class:`ylock.EngineUnavailable`; a renewal retries it, see
:mod:`.renewal`). ``cluster_script_wait`` (``wait_replicas``) keeps redis-py's client.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

import redis.exceptions as rex

from ylock.engines.redis.calls import AsyncDirectCalls, DirectCalls
from ylock.engines.redis.keys import SLOTS

__all__ = ["AsyncClusterCalls", "ClusterCalls", "TRYAGAIN_PAUSE", "acluster_script_wait", "cluster_script_wait",
           "move_slot", "routing_key"]

#: Seconds between two tries of a command the migrating slot answered ``TRYAGAIN`` to.
TRYAGAIN_PAUSE = 0.02


def routing_key(args: tuple[Any, ...]) -> Any:
    """The key a command is routed by: EVALSHA's first declared key, else its first argument."""
    return args[3] if args[0] in ("EVALSHA", "EVAL") else args[1]


def move_slot(client: Any, exc: rex.MovedError | rex.AskError) -> None:
    """Patch ``client``'s slot map with the node a ``MOVED`` reply names (redis-py 7+:
    ``move_slot``; before: ``update_moved_exception``, applied at the next look-up)."""
    manager = client.nodes_manager
    move = getattr(manager, "move_slot", None)
    if move is not None:
        move(exc)
    else:
        manager.update_moved_exception(exc)


def _slot(key: Any) -> int:
    import binascii

    raw = key if isinstance(key, bytes) else str(key).encode()
    start = raw.find(b"{")
    if start >= 0:
        stop = raw.find(b"}", start + 1)
        if stop > start + 1:
            raw = raw[start + 1:stop]
    return binascii.crc_hqx(raw, 0) % SLOTS


class _Routing:
    """What the threads' and the event loop's cluster calls share: the slot map (the sync
    client's), the redirections, the node for a slot or an address."""

    def __init__(self, client: Any, socket_timeout: float) -> None:
        self.client = client
        self.socket_timeout = socket_timeout
        #: How many replies of each redirection ("ask", "moved", "tryagain") this process
        #: met (what a slot migration cost it: tests and ``python -m bench.scale`` read it).
        self.redirections: collections.Counter[str] = collections.Counter()

    def node_for(self, slot: int) -> Any:
        try:
            return self.client.nodes_manager.get_node_from_slot(slot)
        except (IndexError, KeyError) as exc:       # the map read anew by another thread meanwhile
            raise rex.ClusterDownError(f"no node serves slot {slot} in the slot map now ({exc!r})") from exc

    def node_for_key(self, key: Any) -> Any:
        return self.node_for(_slot(key))

    def node_at(self, exc: rex.AskError) -> Any:
        node = self.client.nodes_manager.get_node(host=exc.host, port=exc.port)
        if node is None:          # a node the map does not know yet: read the map anew
            self.client.nodes_manager.initialize()
            node = self.client.nodes_manager.get_node(host=exc.host, port=exc.port)
        if node is None:
            raise rex.ConnectionError(f"Redis Cluster sent ASK to {exc.host}:{exc.port}, a node it does not list")
        return node

    def refresh(self) -> None:
        """Read the slot map anew (a node failed: a replica may have been promoted)."""
        with contextlib.suppress(rex.RedisError, OSError):
            self.client.nodes_manager.initialize()


class _NodeCalls(DirectCalls):
    """A node's direct calls: a redirection is the normal course of a migration, not a sign
    that the node stopped being a master (no connection is dropped for it)."""

    __slots__ = ()

    def _failed(self, exc: BaseException) -> bool:
        if isinstance(exc, (rex.MovedError, rex.AskError, rex.TryAgainError)):
            return False
        return super()._failed(exc)


class _AsyncNodeCalls(AsyncDirectCalls):
    """:class:`_NodeCalls` in an event loop."""

    __slots__ = ()

    def _failed(self, exc: BaseException) -> bool:
        if isinstance(exc, (rex.MovedError, rex.AskError, rex.TryAgainError)):
            return False
        return super()._failed(exc)


class ClusterCalls(_Routing):
    """The lock path's sender on a Cluster (see the module docstring), called as
    :class:`~ylock.engines.redis.calls.DirectCalls` is: ``calls(*args, end=...)``."""

    def __init__(self, client: Any, socket_timeout: float) -> None:
        super().__init__(client, socket_timeout)
        self._nodes: dict[str, DirectCalls] = {}

    def node_calls(self, node: Any) -> DirectCalls:
        """The direct calls over ``node``'s own connection pool (redis-py's, per node)."""
        calls = self._nodes.get(node.name)
        if calls is None:
            calls = self._nodes[node.name] = _NodeCalls(self.client.get_redis_connection(node).connection_pool)
        return calls

    def __call__(self, *args: Any, end: float | None = None) -> Any:
        bound = time.monotonic() + self.socket_timeout if end is None else end
        slot = _slot(routing_key(args))
        asking = None                      # the node an ASK sent us to
        retried = False
        while True:
            node = asking if asking is not None else self.node_for(slot)
            calls = self.node_calls(node)
            try:
                if asking is not None:
                    return calls.many(("ASKING",), args, end=bound)[1]
                return calls(*args, end=bound)
            except rex.MovedError as exc:          # (before AskError: redis-py makes it one)
                self.redirections["moved"] += 1
                move_slot(self.client, exc)
                asking = None
            except rex.AskError as exc:
                self.redirections["ask"] += 1
                asking = self.node_at(exc)
            except rex.TryAgainError:
                self.redirections["tryagain"] += 1
                asking = None
                left = bound - time.monotonic()
                if left <= TRYAGAIN_PAUSE:
                    raise
                time.sleep(TRYAGAIN_PAUSE)
            except (rex.ConnectionError, rex.TimeoutError):
                if retried or time.monotonic() >= bound:
                    raise
                retried, asking = True, None
                self.refresh()

    def pipeline_on(self, node: Any, commands: list[tuple[Any, ...]], end: float | None,
                    packed: bytes | None = None) -> list[Any]:
        """Send ``commands`` (``packed`` already, if given) to ``node`` in one round trip;
        return their replies, an error reply as its exception (the caller routes each: see
        :mod:`.renewal`)."""
        return self.node_calls(node).pipeline(commands, time.monotonic() + self.socket_timeout if end is None else end,
                                              packed)


class AsyncClusterCalls(_Routing):
    """:class:`ClusterCalls` for one event loop: its own connections to each node (asyncio
    connections belong to their loop), the slot map shared with the threads'."""

    def __init__(self, client: Any, socket_timeout: float, build_node: Any) -> None:
        super().__init__(client, socket_timeout)
        self._build_node = build_node      # (host, port) -> a redis.asyncio.Redis for that node
        self._nodes: dict[str, Any] = {}
        self.clients: list[Any] = []       # closed with the loop's side

    def node_calls(self, node: Any) -> AsyncDirectCalls:
        calls = self._nodes.get(node.name)
        if calls is None:
            node_client = self._build_node(node.host, node.port)
            self.clients.append(node_client)
            calls = self._nodes[node.name] = _AsyncNodeCalls(node_client.connection_pool)
        return calls

    async def __call__(self, *args: Any, end: float | None = None) -> Any:
        bound = time.monotonic() + self.socket_timeout if end is None else end
        slot = _slot(routing_key(args))
        asking = None
        retried = False
        while True:
            node = asking if asking is not None else self.node_for(slot)
            calls = self.node_calls(node)
            try:
                if asking is not None:
                    return (await calls.many(("ASKING",), args, end=bound))[1]
                return await calls(*args, end=bound)
            except rex.MovedError as exc:          # (before AskError: redis-py makes it one)
                self.redirections["moved"] += 1
                move_slot(self.client, exc)
                asking = None
            except rex.AskError as exc:
                self.redirections["ask"] += 1
                asking = await asyncio.to_thread(self.node_at, exc)
            except rex.TryAgainError:
                self.redirections["tryagain"] += 1
                asking = None
                left = bound - time.monotonic()
                if left <= TRYAGAIN_PAUSE:
                    raise
                await asyncio.sleep(TRYAGAIN_PAUSE)
            except (rex.ConnectionError, rex.TimeoutError):
                if retried or time.monotonic() >= bound:
                    raise
                retried, asking = True, None
                await asyncio.to_thread(self.refresh)

    async def aclose(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.connection_pool.disconnect()
                await client.aclose()


def cluster_script_wait(client: Any, script: Any, keys: tuple[str, ...], args: list[Any], replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
    """Run ``script`` (a registered redis-py Script) on the Cluster node that owns ``keys``'
    slot and ``WAIT`` for ``replicas`` there, back to back on one connection (WAIT counts
    the replicas that have that connection's writes; a ClusterPipeline refuses scripts).
    Return ``(reply, replicas that acknowledged)``. A ``MOVED`` reply (the slot moved, a
    replica promoted) refreshes the slot map and tries once more on the new owner."""
    for attempt in (0, 1):
        node_client = client.get_redis_connection(client.get_node_from_key(keys[0]))
        pipe = node_client.pipeline(transaction=False)
        script(keys=list(keys), args=args, client=pipe)    # loads it there on NOSCRIPT
        pipe.wait(replicas, timeout_ms)
        try:
            reply, acked = pipe.execute()
        except rex.MovedError:
            if attempt:
                raise
            client.nodes_manager.initialize()
            continue
        return reply, int(acked)
    raise AssertionError("unreachable")


async def acluster_script_wait(client: Any, script: Any, keys: tuple[str, ...], args: list[Any], replicas: int,
                               timeout_ms: int) -> tuple[Any, int]:
    """:func:`cluster_script_wait` for a ``redis.asyncio`` Cluster client: the two commands
    go out in one write on one of the slot owner's connections."""
    await client.initialize()       # a no-op once the client knows the slots
    for attempt in (0, 1):
        node = client.get_node_from_key(keys[0])
        reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, len(keys), *keys, *args),
                                                   ("WAIT", replicas, timeout_ms)])
        if isinstance(reply, rex.NoScriptError):
            await node.execute_command("SCRIPT", "LOAD", script.script)
            reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, len(keys), *keys, *args),
                                                       ("WAIT", replicas, timeout_ms)])
        if isinstance(reply, rex.MovedError) and not attempt:
            await client.nodes_manager.initialize()
            continue
        for value in (reply, acked):
            if isinstance(value, Exception):
                raise value
        return reply, int(acked)
    raise AssertionError("unreachable")


async def _node_pipeline(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on one of an asyncio Cluster node's connections and
    return their replies, an error reply as its exception."""
    conn = node.acquire_connection()
    try:
        await node.disconnect_if_needed(conn)
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except rex.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await conn.disconnect()     # no half-read reply survives
        raise
    finally:
        node.release(conn)
