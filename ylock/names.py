"""Valid lock groups and names: one rule set that every engine can store.

A name travels into Redis keys, ZooKeeper znode paths, PostgreSQL rows, log lines and
``ylock list`` tables, and it often comes from user input (a URL value, a user id). So a
bad one is refused where it is made, with a ``ValueError`` that says which argument and
why, before it can reach a driver: one unencodable character must never take down a
connection that every other lock of the process shares.
"""
from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

MAX_GROUP_LENGTH = 64
MAX_NAME_LENGTH = 200

# "/" separates ZooKeeper path segments; "{" and "}" would break a Redis Cluster hash tag.
# Refused as well: control characters (C0, DEL and C1: unprintable in `ylock list`) and lone
# surrogates (no UTF-8 form: redis-py raises UnicodeEncodeError on them and kazoo's
# connection thread died of one). What a server refuses beyond that (ZooKeeper: characters
# outside the BMP, private use) its engine escapes.
_FORBIDDEN = re.compile("[/{}\x00-\x1f\x7f-\x9f\ud800-\udfff]")


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
        raise ValueError(f"lock {kind} {value!r} contains {bad.group()!r}; '/', '{{', '}}', control characters "
                         "and lone surrogates are not allowed")
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


#: What :func:`name_for` keeps unescaped besides letters, digits and ``_.-~``: readable
#: punctuation that every engine stores as it is.
_SAFE = " !$&'()*+,;=:@~"
#: The names :func:`name_for` gives the values that would escape to a refused name. Each
#: holds a ``%`` that quote() never writes (it escapes only reserved characters, as ``%``
#: and two upper-case hex digits, never ``.``, ``-`` or a letter after it), so no other
#: value can have the same name.
_SPECIAL = {"": "%empty", ".": "%2E", "..": "%2E%2E"}
_HASHED = "sha256-"


def name_for(value: object) -> str:
    """Turn any value (a URL value, a user id, a task argument) into a valid lock name:
    characters a name may not hold are percent-escaped, and a value too long is replaced
    by its hash, so the same value always gives the same name.

    Distinct values (as ``str(value)``) get distinct names, so two keys never share a lock:
    percent-escaping keeps ``%`` apart (``%25``); ``""``, ``"."`` and ``".."`` (names no
    engine may store: a ZooKeeper path segment) become ``%empty``, ``%2E`` and ``%2E%2E``;
    a value whose escaped form starts like a hash (``sha256-``) gets its ``-`` escaped; and
    lone surrogates (no UTF-8 form) are escaped as the bytes Python's ``surrogatepass``
    gives them, which no valid character has. Only a hash collision could make two long
    values share a name."""
    name = quote(str(value), safe=_SAFE, errors="surrogatepass")
    if name.startswith(_HASHED):
        name = "sha256%2D" + name[len(_HASHED):]
    if len(name) > MAX_NAME_LENGTH:
        return check_name(_HASHED + hashlib.sha256(name.encode()).hexdigest())
    return check_name(_SPECIAL.get(name, name))
