"""The commands the Redis engine sends, as an ACL: what a managed service's or a proxy's
restricted user must allow.

``ACL SETUSER ylock on >PASSWORD`` followed by :func:`acl_rules` (``~<prefix>:* -@all
+evalsha ...``) is enough for every path: locks, semaphores, their waits, ``describe``,
``force_release``, statistics, ``ping``, the ``ylock`` console script. Redis checks a
script's own commands against the ACL too, so the commands the Lua scripts call are in
the list (a test checks the scripts against it). No ``CLIENT`` subcommand is needed: the
waiters' notify hubs wake themselves with a list of their own (see
:mod:`ylock.engines.redis.direct`), and ``CLIENT SETINFO`` is never sent.
"""
from __future__ import annotations

from ylock.engines.redis.keys import glob_escape

__all__ = ["ACL_CLUSTER_COMMANDS", "ACL_COMMANDS", "ACL_OPTIONAL_COMMANDS", "ACL_SENTINEL_COMMANDS", "acl_rules"]

#: Every command ylock sends to a single server or a Sentinel-managed master.
ACL_COMMANDS: tuple[str, ...] = (
    # sent by ylock itself
    "evalsha", "script|load", "script|exists",   # the scripts (reloaded after SCRIPT FLUSH or a failover)
    "blpop", "lpush", "pexpire",                 # waiters' blocking pops; the notify hub's wake-up list
    "smembers", "zrangebylex",                   # describe: the index of what is held
    "set", "mget", "get", "zadd", "zrangebyscore", "zremrangebyscore",    # published statistics, indexed
    "ping", "select",                            # ping(); a database other than 0 in the URL
    # called by the Lua scripts (Redis checks them against the ACL as well)
    "del", "exists", "hdel", "hget", "hmget", "hset", "lindex", "llen", "lpop", "lpos", "lrange", "lrem",
    "ltrim", "pttl", "rpush", "sadd", "srem", "time", "zcard", "zrange", "zcount", "zrem", "zscore",
)

#: Sent only with an option that asks for it: ``WAIT`` with ``wait_replicas``; ``CLIENT
#: SETNAME`` with redis-py's ``client_name``.
ACL_OPTIONAL_COMMANDS: tuple[str, ...] = ("wait", "client|setname")

#: What a Cluster adds: the slot map and the command table redis-py routes with, and
#: ``ASKING`` (a command sent to the target of a slot being migrated, after ``ASK``).
ACL_CLUSTER_COMMANDS: tuple[str, ...] = ("cluster|slots", "cluster|shards", "command", "asking")

#: What redis-py asks the sentinels (their own ACL users, if they have any).
ACL_SENTINEL_COMMANDS: tuple[str, ...] = ("sentinel|masters", "sentinel|slaves", "sentinel|replicas",
                                          "sentinel|get-master-addr-by-name", "ping")


def acl_rules(prefix: str = "ylock", *, cluster: bool = False, wait_replicas: bool = False) -> list[str]:
    """Return the ACL rules (for ``ACL SETUSER name on >password ...``) of a user that runs
    ylock with key ``prefix``: its keys only, no pub/sub, exactly the commands it sends."""
    commands = ACL_COMMANDS + (ACL_CLUSTER_COMMANDS if cluster else ()) + (("wait",) if wait_replicas else ())
    return [f"~{glob_escape(prefix)}:*", "resetchannels", "-@all", *(f"+{c}" for c in commands)]


def acl_line(prefix: str = "ylock", user: str = "ylock", password: str = "PASSWORD", **options: bool) -> str:
    """Return the whole ``ACL SETUSER`` line for ``user`` (see :func:`acl_rules`)."""
    return " ".join(["ACL SETUSER", user, "on", f">{password}", *acl_rules(prefix, **options)])
