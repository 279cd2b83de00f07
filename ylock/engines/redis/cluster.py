"""The lock path on Redis Cluster: redis-py's own routing (it follows ``MOVED`` and refreshes
its slot map), and a script call followed by ``WAIT`` on the slot owner's connection."""
from __future__ import annotations

from typing import Any

import redis.exceptions as rex

__all__ = ["acluster_script_wait", "async_cluster_call", "cluster_call", "cluster_script_wait"]


def cluster_call(client: Any) -> Any:
    """The hot path's sender on a Cluster: redis-py's own routing (it follows MOVED and
    refreshes its slot map), whose sockets time out after the socket timeout: a call's
    ``end`` is not passed down per operation there."""
    def call(*args: Any, end: float | None = None) -> Any:
        return client.execute_command(*args)
    return call


def async_cluster_call(client: Any) -> Any:
    """:func:`cluster_call` for a ``redis.asyncio`` Cluster client."""
    async def call(*args: Any, end: float | None = None) -> Any:
        return await client.execute_command(*args)
    return call


def cluster_script_wait(client: Any, script: Any, key: str, args: list[Any], replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
    """Run ``script`` (a registered redis-py Script) on the Cluster node that owns ``key``'s
    slot and ``WAIT`` for ``replicas`` there, back to back on one connection (WAIT counts
    the replicas that have that connection's writes; a ClusterPipeline refuses scripts).
    Return ``(reply, replicas that acknowledged)``. A ``MOVED`` reply (the slot moved, a
    replica promoted) refreshes the slot map and tries once more on the new owner."""
    for attempt in (0, 1):
        node_client = client.get_redis_connection(client.get_node_from_key(key))
        pipe = node_client.pipeline(transaction=False)
        script(keys=[key], args=args, client=pipe)    # loads it there on NOSCRIPT
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


async def acluster_script_wait(client: Any, script: Any, key: str, args: list[Any], replicas: int,
                               timeout_ms: int) -> tuple[Any, int]:
    """:func:`cluster_script_wait` for a ``redis.asyncio`` Cluster client: the two commands
    go out in one write on one of the slot owner's connections."""
    await client.initialize()       # a no-op once the client knows the slots
    for attempt in (0, 1):
        node = client.get_node_from_key(key)
        reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, 1, key, *args),
                                                   ("WAIT", replicas, timeout_ms)])
        if isinstance(reply, rex.NoScriptError):
            await node.execute_command("SCRIPT", "LOAD", script.script)
            reply, acked = await _node_pipeline(node, [("EVALSHA", script.sha, 1, key, *args),
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
