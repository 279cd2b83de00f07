"""The Redis engine's renewals: every hold the watchdog renews, in as few round trips as it can.

The renew script is pipelined, one round trip per chunk of ``renew_chunk`` holds (per node
on a Cluster), packed and read as the lock path does (:mod:`.calls`: about a third of the
client CPU of redis-py's pipeline), on connections of its own (one: the watchdog is one
thread) that the lock path's share leaves to it.

On a Cluster a slot migration answers some of them with a redirection: ``MOVED`` (the
slot map is patched, the hold renewed where its slot went), ``ASK`` (renewed on the target,
after ``ASKING``), ``TRYAGAIN`` (a reader's two keys split between the nodes: tried again
until one socket timeout has passed, then answered None, "could not tell", which the
watchdog retries: never False, so a migration never tells a holder it lost its lock). A
writer's renewal declares its x key alone, so it never meets ``TRYAGAIN``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rex

from ylock.engines.base import PERMIT, WRITE, RenewItem
from ylock.engines.redis.calls import DirectCalls
from ylock.engines.redis.cluster import TRYAGAIN_PAUSE, move_slot
from ylock.engines.redis.parts import EngineParts

__all__ = ["renew"]

logger = logging.getLogger("ylock.engines.redis.engine")


def renew(engine: EngineParts, items: Sequence[RenewItem]) -> list[bool | None]:
    """Extend every hold in ``items`` by its lease (see :meth:`ylock.Engine.renew`)."""
    results: list[bool | None] = [None] * len(items)
    if not items:
        return results
    engine.client  # noqa: B018 - builds the client and registers the scripts on first use
    sha = engine._scripts["renew"].sha
    packer = _Packer(sha)
    lock_keys = engine._lock_keys
    keys_of = engine.keys.renewed
    commands = []
    packed = []
    for item in items:
        cached = lock_keys.get((item.group, item.name, item.mode))     # the keys the acquisition used
        if cached is None:
            keys = keys_of(item.group, item.name, item.mode)
        else:
            keys = (cached[0],) if item.mode == WRITE else (cached[3], cached[4], cached[7]) \
                if item.mode == PERMIT else (cached[3], cached[4])
        lease = int(item.lease * 1000)
        commands.append(("EVALSHA", sha, len(keys), *keys, item.owner, item.mode, lease))
        packed.append(packer.pack(keys, item.owner, item.mode, lease))
    try:
        if engine.keys.cluster:
            _renew_cluster(engine, commands, packed, results)
        else:
            _renew_one(engine, commands, packed, results)
    except Exception as exc:  # noqa: BLE001 - the watchdog marks what it could not tell as unknown
        error = engine._translate(exc, None, None)
        logger.warning("ylock: Redis unavailable while renewing %d holds: %s", len(items), error)
    return results


class _Packer:
    """Pack renew script calls as :func:`~ylock.engines.redis.resp.pack` does, a batch at a
    time: the parts every call of a batch shares (the script, the owner, the mode, the
    lease: one thread's holds) are packed once."""

    def __init__(self, sha: str) -> None:
        self.heads = {n: b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%b\r\n$1\r\n%d\r\n" % (n + 6, len(sha), sha.encode(), n)
                      for n in (1, 2, 3)}
        self.tails: dict[tuple[str, str, int], bytes] = {}

    def pack(self, keys: tuple[str, ...], owner: str, mode: str, lease: int) -> bytes:
        tail = self.tails.get((owner, mode, lease))
        if tail is None:
            tail = self.tails[owner, mode, lease] = b"".join(
                b"$%d\r\n%b\r\n" % (len(a), a) for a in (owner.encode(), mode.encode(), b"%d" % lease))
        parts = [self.heads[len(keys)]]
        for key in keys:
            raw = key.encode()
            parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
        parts.append(tail)
        return b"".join(parts)


#: ASKING, packed (before a call sent to the target of a migrating slot).
_ASKING = b"*1\r\n$6\r\nASKING\r\n"


def _renew_one(engine: EngineParts, commands: list[tuple[Any, ...]], packed: list[bytes],
               results: list[bool | None]) -> None:
    """One server (or a Sentinel's master): the chunks on the watchdog's own connection."""
    calls = _watchdog_calls(engine)
    chunk = engine.renew_chunk
    for start in range(0, len(commands), chunk):
        replies = _pipeline(engine, calls, commands[start:start + chunk], packed[start:start + chunk])
        for index, reply in enumerate(replies, start):
            results[index] = None if isinstance(reply, Exception) else bool(reply)


def _watchdog_calls(engine: EngineParts) -> DirectCalls:
    """The direct calls the renewals go through: one connection of the client's pool."""
    calls: DirectCalls | None = engine._renew_calls
    pool = engine.client.connection_pool
    if calls is None or calls.pool is not pool:
        calls = DirectCalls(pool)
        calls.share = 1          # one thread renews
        engine._renew_calls = calls
    return calls


def _pipeline(engine: EngineParts, calls: Any, commands: list[tuple[Any, ...]], packed: list[bytes],
              node: Any = None) -> list[Any]:
    """Send ``commands`` in one round trip (on ``node`` of a Cluster); load the script and
    send again those the server answered ``NOSCRIPT`` (a restart, a failover, SCRIPT FLUSH)."""
    end = time.monotonic() + engine.socket_timeout

    def send(subset: list[tuple[Any, ...]], raw: bytes | None) -> list[Any]:
        if node is not None:
            return calls.pipeline_on(node, subset, end, raw)  # type: ignore[no-any-return]
        return calls.pipeline(subset, end, raw)  # type: ignore[no-any-return]
    replies = send(commands, b"".join(packed))
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, rex.NoScriptError)]
    if missing:
        loaded = send([("SCRIPT", "LOAD", engine._scripts["renew"].script)], None)
        if isinstance(loaded[0], Exception):
            raise loaded[0]
        for i, reply in zip(missing, send([commands[i] for i in missing], b"".join(packed[i] for i in missing))):
            replies[i] = reply
    return replies


def _renew_cluster(engine: EngineParts, commands: list[tuple[Any, ...]], packed: list[bytes],
                   results: list[bool | None]) -> None:
    """A Cluster: per node and chunk, following the redirections of a slot migration (see
    the module docstring) for one socket timeout at most."""
    calls = engine._caller()
    bound = time.monotonic() + engine.socket_timeout
    pending: list[tuple[int, Any]] = [(i, None) for i in range(len(commands))]     # (index, ASK target)
    while pending:
        by_node: dict[str, tuple[Any, list[tuple[int, Any]]]] = {}
        for index, asking in pending:
            node = asking if asking is not None else calls.node_for_key(commands[index][3])
            by_node.setdefault(f"{node.name}{'?' if asking is not None else ''}", (node, []))[1].append(
                (index, asking))
        pending = []
        tried_again = False
        for node, group in by_node.values():
            for start in range(0, len(group), engine.renew_chunk):
                part = group[start:start + engine.renew_chunk]
                asked = part[0][1] is not None
                sent: list[tuple[Any, ...]] = []
                raw: list[bytes] = []
                for index, _ in part:
                    if asked:
                        sent.append(("ASKING",))
                        raw.append(_ASKING)
                    sent.append(commands[index])
                    raw.append(packed[index])
                try:
                    replies = _pipeline(engine, calls, sent, raw, node)
                except (rex.ConnectionError, rex.TimeoutError):
                    logger.warning("ylock: Redis Cluster node %s unavailable while renewing %d holds", node.name,
                                   len(part))
                    calls.refresh()
                    continue
                if asked:
                    replies = replies[1::2]
                for (index, _), reply in zip(part, replies):
                    if not isinstance(reply, Exception):
                        results[index] = bool(reply)
                    elif isinstance(reply, rex.MovedError):      # (before AskError: redis-py makes it one)
                        calls.redirections["renew moved"] += 1
                        move_slot(calls.client, reply)
                        pending.append((index, None))
                    elif isinstance(reply, rex.AskError):
                        calls.redirections["renew ask"] += 1
                        pending.append((index, calls.node_at(reply)))
                    elif isinstance(reply, rex.TryAgainError):
                        calls.redirections["renew tryagain"] += 1
                        pending.append((index, None))
                        tried_again = True
        if pending and time.monotonic() + (TRYAGAIN_PAUSE if tried_again else 0) >= bound:
            return           # unknown: the watchdog tries them again soon
        if tried_again:
            time.sleep(TRYAGAIN_PAUSE)
