"""The Redis engine's renewals: every hold the watchdog renews, in as few round trips as it can."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ylock.engines.base import RenewItem
from ylock.engines.redis.parts import EngineParts
from ylock.errors import EngineUnavailable

__all__ = ["renew"]

logger = logging.getLogger("ylock.engines.redis.engine")


def renew(engine: EngineParts, items: Sequence[RenewItem]) -> list[bool | None]:
    """Extend every hold in ``items`` by its lease (see :meth:`ylock.Engine.renew`): the renew
    script pipelined, one round trip per chunk of ``renew_chunk`` holds."""
    results: list[bool | None] = [None] * len(items)
    client = engine.client  # builds the client and registers the scripts on first use
    # A Cluster pipeline cannot run scripts, so split the batch per node and pipeline
    # each part on that node's own connection: one round trip per node and chunk.
    by_node: dict[Any, list[int]] = {}
    for index, item in enumerate(items):
        by_node.setdefault(_node_client(engine, client, item), []).append(index)
    for node_client, indexes in by_node.items():
        for start in range(0, len(indexes), engine.renew_chunk):
            chunk = indexes[start:start + engine.renew_chunk]
            try:
                with engine._errors():
                    pipe = node_client.pipeline(transaction=False)
                    for index in chunk:
                        item = items[index]
                        engine._scripts["renew"](keys=[engine.keys.x(item.group, item.name, item.mode)],
                                                 args=[item.owner, item.mode, int(item.lease * 1000)], client=pipe)
                    replies = pipe.execute(raise_on_error=False)
                for index, reply in zip(chunk, replies):
                    results[index] = None if isinstance(reply, Exception) else bool(reply)
            except EngineUnavailable:
                logger.warning("ylock: Redis unavailable while renewing %d holds", len(chunk))
    return results


def _node_client(engine: EngineParts, client: Any, item: RenewItem) -> Any:
    """The client of the node that holds ``item``'s keys (the client itself off Cluster)."""
    if engine.kind != "redis+cluster":
        return client
    slot = client.keyslot(engine.keys.base(item.group, item.name))
    return client.get_redis_connection(client.nodes_manager.get_node_from_slot(slot))
