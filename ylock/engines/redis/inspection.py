"""What the Redis engine tells about its locks and processes: ``describe`` (read from the index
the scripts keep, never by scanning the keyspace: see :mod:`.keys`), ``describe_lock`` (one
script call) and the statistics processes publish (also indexed)."""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import redis.exceptions as rex

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, Listing, LockInfo, check_limit, holder_context
from ylock.engines.redis.calls import DirectCalls
from ylock.engines.redis.keys import SLOTS
from ylock.engines.redis.parts import EngineParts

__all__ = ["describe", "describe_lock", "publish_stats", "read_stats"]

#: How many locks a listing describes per round trip (per node on a Cluster).
BATCH = 200

#: Drop the groups whose set is empty from the set of groups, atomically with the scripts
#: that add them (one server; KEYS: the set of groups, then each group's set; ARGV: the groups).
_UNLIST_GROUPS = """
local gone = 0
for i, group in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then gone = gone + redis.call('SREM', KEYS[1], group) end
end
return gone
"""

#: A lock as the index names it: (group, name, semaphore).
Entry = tuple[str, str, bool]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def describe(engine: EngineParts, group: str | None, limit: int | None) -> Listing:
    """The held or waited-for locks and semaphores (of ``group``, if given), the first
    ``limit`` in (group, name, kind) order (see :meth:`ylock.Engine.describe`): the index's
    entries, sorted, described in batches until ``limit`` are found. An entry whose lock
    turned out free (its keys expired) left the index as it was described."""
    check_limit(limit)
    # (group, name, semaphore) tuples sort as (group, name, kind) does: a lock before a semaphore
    entries = sorted(_cluster_entries(engine, group) if engine.keys.cluster else _entries(engine, group))
    infos: list[LockInfo] = []
    free = at = 0
    while at < len(entries) and (limit is None or len(infos) < limit):
        # With a limit, what is missing and a few spare (some entries may have expired).
        size = BATCH if limit is None else min(BATCH, limit - len(infos) + 8)
        batch = entries[at:at + size]
        at += size
        for entry, reply in zip(batch, _describe_many(engine, batch)):
            info = _info(entry, reply)
            if info is None:
                free += 1
            elif limit is None or len(infos) < limit:
                infos.append(info)
    return Listing(infos, len(entries) - free)


def describe_lock(engine: EngineParts, group: str, name: str, kind: str) -> LockInfo | None:
    """One lock (a semaphore for ``kind="semaphore"``): one script call."""
    semaphore = kind == SEMAPHORE
    keys = engine.keys.lock(group, name, PERMIT if semaphore else WRITE)
    return _info((group, name, semaphore), engine._run("describe", keys, []))


def _entries(engine: EngineParts, group: str | None) -> list[Entry]:
    """One server: the index's entries (of ``group``)."""
    keys = engine.keys
    calls = _inspection_calls(engine)          # (redis-py's parser took 9 µs a name of 20,000)
    end = time.monotonic() + engine.socket_timeout
    if group is not None:
        names = [m.decode() for m in calls("SMEMBERS", keys.group_index(group), end=end)]
        return [(group, n[1:], True) if n[:1] == "/" else (group, n, False) for n in names]   # Keys.parse_member
    groups = sorted(g.decode() for g in calls("SMEMBERS", keys.groups(), end=end))
    if not groups:
        return []
    entries: list[Entry] = []
    empty = []
    for g, members in zip(groups, calls.pipeline([("SMEMBERS", keys.group_index(g)) for g in groups], end)):
        if isinstance(members, Exception):
            raise members
        if not members:
            empty.append(g)
        entries.extend((g, *keys.parse_member(m.decode())) for m in members)
    if empty:
        engine.client.register_script(_UNLIST_GROUPS)(keys=[keys.groups(), *map(keys.group_index, empty)], args=empty)
    return entries


def _cluster_entries(engine: EngineParts, group: str | None) -> list[Entry]:
    """A Cluster: every slot's index asked for ``group``'s range (everything for None),
    pipelined per master (a slot that moved meanwhile is asked again where it went)."""
    keys = engine.keys
    calls = engine._caller()
    client = engine.client
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for slot, nodes in list(client.nodes_manager.slots_cache.items()):
        if nodes:
            by_node.setdefault(nodes[0].name, (nodes[0], []))[1].append(slot)
    low, high = (f"[{group}/", f"({group}0") if group is not None else ("-", "+")    # "0" follows "/"
    # 16,384 calls that differ in their key alone: packed from pieces made once (packing
    # each as a command took most of a listing's time)
    head = b"*4\r\n$11\r\nZRANGEBYLEX\r\n"
    tail = b"".join(b"$%d\r\n%b\r\n" % (len(v), v) for v in (low.encode(), high.encode()))
    slot_keys, packed_keys = _slot_keys_of(keys)
    entries: list[Entry] = []
    for node, slots in by_node.values():
        commands = [("ZRANGEBYLEX", slot_keys[slot], low, high) for slot in slots]
        packed = b"".join([part for slot in slots for part in (head, packed_keys[slot], tail)])
        replies = calls.pipeline_on(node, commands, None, packed)
        for command, reply in zip(commands, replies):
            if isinstance(reply, rex.ResponseError):     # MOVED, ASK, TRYAGAIN: routed on its own
                reply = calls(*command)
            entries.extend(keys.parse_slot_member(_text(m)) for m in reply)
    return entries


_slot_keys: dict[str, tuple[list[str], list[bytes]]] = {}


def _slot_keys_of(keys: Any) -> tuple[list[str], list[bytes]]:
    """Every slot's index key, and packed as a bulk string (made once per prefix)."""
    made = _slot_keys.get(keys.prefix)
    if made is None:
        names = [keys.slot_index(s) for s in range(SLOTS)]
        made = _slot_keys[keys.prefix] = (names, [b"$%d\r\n%b\r\n" % (len(k), k) for k in (n.encode() for n in names)])
    return made


def _describe_many(engine: EngineParts, batch: list[Entry]) -> Iterator[Any]:
    """The describe script's replies for ``batch``, in one round trip (per node on a Cluster)."""
    keys = engine.keys
    script = engine._scripts["describe"]
    lock_keys = [keys.lock(g, n, PERMIT if semaphore else WRITE) for g, n, semaphore in batch]
    if not keys.cluster:
        yield from _pipelined(engine, script, lock_keys)
        return
    calls = engine._caller()
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for index, k in enumerate(lock_keys):
        node = calls.node_for_key(k[0])
        by_node.setdefault(node.name, (node, []))[1].append(index)
    out: list[Any] = [None] * len(batch)
    for node, indexes in by_node.values():
        commands = [("EVALSHA", script.sha, len(lock_keys[i]), *lock_keys[i]) for i in indexes]
        replies = calls.pipeline_on(node, commands, None)
        for index, reply in zip(indexes, replies):
            if isinstance(reply, rex.ResponseError):     # a redirection, or NOSCRIPT: on its own
                reply = engine._run("describe", lock_keys[index], [])
            out[index] = reply
    yield from out


def _pipelined(engine: EngineParts, script: Any, lock_keys: list[tuple[str, ...]]) -> list[Any]:
    """EVALSHA ``script`` for each key list in one round trip (packed and read as the lock
    path does: redis-py's pipeline spent most of a listing's time packing and parsing),
    loading it first if the server lost it."""
    calls = _inspection_calls(engine)
    for attempt in (0, 1):
        end = time.monotonic() + engine.socket_timeout
        replies = calls.pipeline([("EVALSHA", script.sha, len(k), *k) for k in lock_keys], end)
        if attempt == 0 and any(isinstance(r, rex.NoScriptError) for r in replies):
            script.sha = _text(calls("SCRIPT", "LOAD", script.script, end=end))
            continue
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies
    raise AssertionError("unreachable")


def _inspection_calls(engine: EngineParts) -> DirectCalls:
    """The direct calls of listings: two connections of the client's pool (the reserve the
    lock path leaves), made on first use."""
    calls: DirectCalls | None = engine._inspect_calls
    pool = engine.client.connection_pool
    if calls is None or calls.pool is not pool:
        calls = DirectCalls(pool)
        calls.share = 2
        engine._inspect_calls = calls
    return calls


def _info(entry: Entry, reply: Any) -> LockInfo | None:
    """The LockInfo of a describe script's reply (None: free, and unlisted now)."""
    group, name, semaphore = entry
    if not reply:
        return None
    writer, writer_token, writer_ms, writer_said, shared, tokens, queue, waiting, now, permits = reply
    writer = _text(writer)
    context: dict[str, Any] = {}
    waiters = []
    for i in range(0, len(waiting), 4):
        owner, mode, since, said = _text(waiting[i]), _text(waiting[i + 1]), int(waiting[i + 2]), waiting[i + 3]
        waiters.append(f"{mode}:{owner}")
        context[owner] = holder_context(owner, since / 1000 if since else None, _text(said))
    if writer:
        token = int(writer_token)
        context[writer] = holder_context(writer, _since(token), _text(writer_said))
        return LockInfo(group, name, WRITE, (writer,), tuple(waiters), max(0, int(writer_ms)) / 1000, token,
                        context=context)
    kind = SEMAPHORE if semaphore else LOCK
    count = int(permits) if semaphore and permits else None
    if shared:
        token_of: dict[str, int] = {}
        for i in range(0, len(tokens), 2):
            owner, raw = _text(tokens[i]), _text(tokens[i + 1])
            digits, _, said = raw.partition("|")
            if digits.isdigit():
                token_of[owner] = int(digits)
                context[owner] = holder_context(owner, _since(int(digits)), said)
        owners = tuple(sorted(_text(shared[i]) for i in range(0, len(shared), 2)))
        ttl = (max(float(shared[i]) for i in range(1, len(shared), 2)) - int(now)) / 1000
        latest = max((token_of[o] for o in owners if o in token_of), default=None)
        return LockInfo(group, name, PERMIT if semaphore else READ, owners, tuple(waiters), ttl, latest, kind, count,
                        context)
    return LockInfo(group, name, None, (), tuple(waiters), None, None, kind, count, context)


#: Tokens are at least the server's clock in µs at the grant (see ``next_token`` in
#: ``common.lua``); a token below this (2001) is from a counter, not a clock.
_CLOCK_TOKENS = 10 ** 15


def _since(token: int) -> float | None:
    """Since when a holder holds, from its token (the server clock in µs at the grant)."""
    return token / 1e6 if token >= _CLOCK_TOKENS else None


# -- statistics --------------------------------------------------------------------------------

#: Seconds an expired process stays in the statistics' index (clocks of hosts differ).
_STATS_SLACK = 60.0


def publish_stats(engine: EngineParts, process: str, data: bytes, ttl: float) -> None:
    """Publish ``process``'s statistics for ``ttl`` seconds, and list it in the index."""
    keys = engine.keys
    px = max(1, int(ttl * 1000))
    now = time.time()
    client = engine.client
    pipe = client if keys.cluster else client.pipeline(transaction=False)
    pipe.set(keys.stats(process), data, px=px)
    pipe.zadd(keys.stats_index(), {process: int(now * 1000) + px})
    pipe.zremrangebyscore(keys.stats_index(), "-inf", int((now - _STATS_SLACK) * 1000))
    if pipe is not client:
        pipe.execute()


def read_stats(engine: EngineParts) -> dict[str, bytes]:
    """Every process's published statistics, by process (those the index lists)."""
    keys = engine.keys
    client = engine.client
    processes = [_text(p) for p in client.zrangebyscore(keys.stats_index(),
                                                        int((time.time() - _STATS_SLACK) * 1000), "+inf")]
    if not processes:
        return {}
    stat_keys = [keys.stats(p) for p in processes]
    values: Iterable[Any]
    if keys.cluster:
        values = [client.get(k) for k in stat_keys]
    else:
        values = client.mget(stat_keys)
    return {p: v for p, v in zip(processes, values) if v is not None}
