"""What the Redis engine tells about its locks and processes: ``describe`` (a scan of the
lock keys, one script call per live lock) and the statistics processes publish."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ylock.engines.base import LOCK, PERMIT, READ, SEMAPHORE, WRITE, LockInfo, holder_context
from ylock.engines.redis.parts import EngineParts

__all__ = ["describe", "describe_base", "publish_stats", "read_stats"]


def _scan(engine: EngineParts, pattern: str) -> Iterator[str]:
    for key in engine.client.scan_iter(match=pattern, count=1000):
        yield key.decode() if isinstance(key, bytes) else key


def describe(engine: EngineParts, group: str | None) -> list[LockInfo]:
    """Every held or waited-for lock and semaphore (of ``group``, if given)."""
    keys = engine.keys
    # A lock whose only key is its fence is free and unqueued: skip it without a round
    # trip (fences outnumber live locks by far).
    bases = {base for base in map(keys.describe_base, _scan(engine, keys.scan_pattern(group))) if base is not None}
    infos = []
    for base in sorted(bases):
        info = describe_base(engine, base)
        if info is not None:
            infos.append(info)
    return infos


def describe_base(engine: EngineParts, base: str) -> LockInfo | None:
    """The lock (or semaphore) whose keys start with ``base``, or None if free and unqueued."""
    group, name, semaphore = engine.keys.parse_base(base)
    writer, writer_token, writer_ttl, shared, queue, modes, tokens, now, permits, notes = \
        engine._run("describe", engine.keys.x_of_base(base), [])
    dec = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    writer = dec(writer)
    if not writer and not shared and not queue:
        return None
    token_of = {dec(tokens[i]): int(tokens[i + 1]) for i in range(0, len(tokens), 2)}
    mode_of = {dec(modes[i]): dec(modes[i + 1]) for i in range(0, len(modes), 2)}
    waiters = tuple(f"{mode_of.get(dec(o), '?')}:{dec(o)}" for o in queue)
    context = {}
    for i in range(0, len(notes), 2):
        since, _, said = dec(notes[i + 1]).partition("|")
        context[dec(notes[i])] = holder_context(dec(notes[i]), int(since) / 1000 if since.isdigit() else None,
                                                said)
    if writer:
        _granted_at(context, writer, int(writer_token))
        return LockInfo(group, name, WRITE, (writer,), waiters, max(0, writer_ttl) / 1000, int(writer_token),
                        context=context)
    kind, count = (SEMAPHORE, int(permits)) if semaphore and permits else (LOCK, None)
    if shared:
        owners = tuple(sorted(dec(shared[i]) for i in range(0, len(shared), 2)))
        for owner in owners:
            if owner in token_of:
                _granted_at(context, owner, token_of[owner])
        ttl = (max(float(shared[i]) for i in range(1, len(shared), 2)) - now) / 1000
        token = max((token_of[o] for o in owners if o in token_of), default=None)
        return LockInfo(group, name, PERMIT if semaphore else READ, owners, waiters, ttl, token, kind, count,
                        context)
    return LockInfo(group, name, None, (), waiters, None, None, kind, count, context)


#: Tokens are at least the server's clock in µs at the grant (see ``next_token`` in
#: ``common.lua``); a token below this (2001) is from a counter, not a clock.
_CLOCK_TOKENS = 10 ** 15


def _granted_at(context: dict[str, Any], owner: str, token: int) -> None:
    """Describe a holder that left no note (one with nothing to say, granted on a fast path
    or handed the lock from the queue, see ``fast_note`` in ``common.lua``): since when
    comes from its token."""
    if owner not in context and token >= _CLOCK_TOKENS:
        context[owner] = holder_context(owner, token / 1e6, None)


def publish_stats(engine: EngineParts, process: str, data: bytes, ttl: float) -> None:
    """Publish ``process``'s statistics for ``ttl`` seconds."""
    engine.client.set(engine.keys.stats(process), data, px=max(1, int(ttl * 1000)))


def read_stats(engine: EngineParts) -> dict[str, bytes]:
    """Every process's published statistics, by process."""
    keys = list(_scan(engine, engine.keys.stats_pattern()))
    if not keys:
        return {}
    values: list[Any]
    if engine.kind == "redis+cluster":
        values = [engine.client.get(k) for k in keys]
    else:
        values = engine.client.mget(keys)
    return {engine.keys.stats_process(k): v for k, v in zip(keys, values) if v is not None}
