"""Validation of lock groups and names: one rule set that every engine can store."""
from __future__ import annotations

import re

MAX_GROUP_LENGTH = 64
MAX_NAME_LENGTH = 200

# "/" separates ZooKeeper path segments; "{" and "}" would break a Redis Cluster hash
# tag; control characters are unprintable in ``ylock list``. ":" separates group from
# name inside Redis keys, so only the group must avoid it (the name comes last).
_FORBIDDEN = re.compile(r"[/{}\x00-\x1f\x7f]")


def _check(kind: str, value: object, max_length: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"lock {kind} must be a str, not {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"lock {kind} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"lock {kind} is {len(value)} characters long; the limit is {max_length}: "
                         f"{value[:40]!r}...")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise ValueError(f"lock {kind} {value!r} contains {bad.group()!r}; "
                         "'/', '{', '}' and control characters are not allowed")
    if value in (".", ".."):
        raise ValueError(f"lock {kind} must not be {value!r}")
    return value


def check_group(group: object) -> str:
    """Return ``group`` if it is a valid lock group, else raise ValueError saying why."""
    group = _check("group", group, MAX_GROUP_LENGTH)
    if ":" in group:
        raise ValueError(f"lock group {group!r} contains ':'; it separates group from name in engine keys")
    return group


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid lock name, else raise ValueError saying why."""
    return _check("name", name, MAX_NAME_LENGTH)
