"""An in-process model of exactly the Redis commands the engine's Lua scripts call (and the
client's BLPOP), on a virtual clock: strings, lists, hashes and sorted sets, with ``PX`` /
``PEXPIRE`` expiry judged against the model's own clock, never the machine's.

It answers as Redis 7 does (``tests/simulation/test_model.py`` sends the same commands to a
real ``redis-server`` and compares every answer): integer, bulk (bytes), nil (None), arrays
(lists), status (:class:`Status`) and errors (:class:`CommandError`). Time is frozen while a
script runs, as in Redis 7, so every expiry check of one script call sees one instant.

Hand-written rather than a library: fakeredis runs on the real clock and carries a whole
server; the simulation needs a few hundred lines it can freeze, jump and copy (a failover
promotes a copy of the keyspace as a replica had it).
"""
from __future__ import annotations

import bisect
from typing import Any

__all__ = ["CommandError", "Keyspace", "Status", "command_handler", "fmt_number"]

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


class CommandError(Exception):
    """A Redis error reply."""


class Status(str):
    """A Redis status reply (``+OK``)."""


def fmt_number(value: float | int) -> bytes:
    """A Lua number as Redis writes it into a command's argument (``%.17g``), and a score
    as Redis replies it (integral doubles as integers)."""
    if isinstance(value, int):
        return str(value).encode()
    if value.is_integer() and abs(value) < 2 ** 63:
        return str(int(value)).encode()
    return (b"%.17g" % value)


def _int(arg: bytes, what: str = "value is not an integer or out of range") -> int:
    try:
        text = arg.decode()
        if text != text.strip() or not text or (text[0] == "+"):
            raise ValueError
        return int(text)
    except (ValueError, UnicodeDecodeError):
        raise CommandError(f"ERR {what}") from None


def _float(arg: bytes) -> float:
    text = arg.decode().lower()
    if text in ("-inf", "+inf", "inf"):
        return float(text if text != "inf" else "+inf")
    try:
        value = float(text)
    except ValueError:
        raise CommandError("ERR value is not a valid float") from None
    if value != value:
        raise CommandError("ERR value is not a valid float")
    return value


def _bound(arg: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (value, exclusive)."""
    if arg.startswith(b"("):
        return _float(arg[1:]), True
    return _float(arg), False


class Keyspace:
    """One server's keys: ``data`` (key -> str | list | dict | Zset) and ``expires`` (key ->
    absolute ms on the server's clock). ``now_ms`` is set by the server before each command
    or script call."""

    __slots__ = ("data", "expires", "now_ms", "writes")

    def __init__(self) -> None:
        self.data: dict[bytes, Any] = {}
        self.expires: dict[bytes, int] = {}
        self.now_ms = 0
        self.writes = 0          # commands that changed something (the model's dirty counter)

    def copy(self) -> Keyspace:
        """A copy with copied values (a replica's keyspace at one point of the stream)."""
        other = Keyspace()
        for key, value in self.data.items():
            other.data[key] = value if isinstance(value, bytes) else value.copy()
        other.expires = dict(self.expires)
        other.now_ms = self.now_ms
        return other

    # -- the keyspace ----------------------------------------------------------------------

    def _live(self, key: bytes) -> Any:
        when = self.expires.get(key)
        if when is not None and self.now_ms > when:
            del self.expires[key]
            del self.data[key]
            return None
        return self.data.get(key)

    def _get(self, key: bytes, kind: type) -> Any:
        value = self._live(key)
        if value is not None and not isinstance(value, kind):
            raise CommandError(WRONGTYPE)
        return value

    def _delete(self, key: bytes) -> bool:
        if self._live(key) is None:
            return False
        del self.data[key]
        self.expires.pop(key, None)
        return True

    def _tidy(self, key: bytes, value: Any) -> None:
        """Delete a container that became empty (Redis never keeps an empty one)."""
        if not value:
            del self.data[key]
            self.expires.pop(key, None)

    def keys(self) -> list[bytes]:
        """The live keys (for tests and failure reports)."""
        return sorted(k for k in list(self.data) if self._live(k) is not None)

    # -- commands --------------------------------------------------------------------------

    def call(self, name: bytes | str, *args: bytes) -> Any:
        """Run one command; raise CommandError for an error reply."""
        command = (name.decode() if isinstance(name, bytes) else name).upper()
        handler: Any = _COMMANDS.get(command)
        if handler is None:
            raise CommandError(f"ERR unknown command '{command}'")
        return handler(self, *args)

    def time(self) -> list[bytes]:
        raise AssertionError("TIME is answered by the server, which knows its clock")

    def get(self, key: bytes) -> Any:
        return self._get(key, bytes)

    def mget(self, *keys: bytes) -> list[Any]:
        out = []
        for key in keys:
            value = self._live(key)
            out.append(value if isinstance(value, bytes) else None)
        return out

    def set(self, key: bytes, value: bytes, *options: bytes) -> Any:
        px = None
        keepttl = get = False
        i = 0
        while i < len(options):
            option = options[i].upper()
            if option in (b"PX", b"EX") and i + 1 < len(options):
                amount = _int(options[i + 1])
                if amount <= 0:
                    raise CommandError("ERR invalid expire time in 'set' command")
                px = amount if option == b"PX" else amount * 1000
                i += 2
            elif option == b"KEEPTTL":
                keepttl = True
                i += 1
            elif option == b"GET":
                get = True
                i += 1
            else:
                raise CommandError("ERR syntax error")
        old = self._get(key, bytes) if get else self._live(key)
        self.data[key] = value
        if px is not None:
            self.expires[key] = self.now_ms + px
        elif not keepttl:
            self.expires.pop(key, None)
        self.writes += 1
        return old if get else Status("OK")

    def delete(self, *keys: bytes) -> int:
        n = sum(self._delete(key) for key in keys)
        self.writes += n
        return n

    def exists(self, *keys: bytes) -> int:
        return sum(self._live(key) is not None for key in keys)

    def pexpire(self, key: bytes, ms: bytes) -> int:
        amount = _int(ms)
        if self._live(key) is None:
            return 0
        self.writes += 1
        if amount <= 0:
            self._delete(key)
            return 1
        self.expires[key] = self.now_ms + amount
        return 1

    def pttl(self, key: bytes) -> int:
        if self._live(key) is None:
            return -2
        when = self.expires.get(key)
        return -1 if when is None else max(0, when - self.now_ms)

    def rename(self, key: bytes, new: bytes) -> Status:
        value = self._live(key)
        if value is None:
            raise CommandError("ERR no such key")
        if new == key:
            return Status("OK")
        when = self.expires.pop(key, None)
        del self.data[key]
        self._delete(new)
        self.data[new] = value
        if when is not None:
            self.expires[new] = when
        self.writes += 1
        return Status("OK")

    # lists
    def llen(self, key: bytes) -> int:
        value = self._get(key, list)
        return len(value) if value else 0

    def lindex(self, key: bytes, index: bytes) -> Any:
        value = self._get(key, list) or []
        i = _int(index)
        if i < 0:
            i += len(value)
        return value[i] if 0 <= i < len(value) else None

    def lpos(self, key: bytes, element: bytes) -> Any:
        value = self._get(key, list) or []
        try:
            return value.index(element)
        except ValueError:
            return None

    def lrange(self, key: bytes, start: bytes, stop: bytes) -> list[bytes]:
        value = self._get(key, list) or []
        return value[slice(*_range(len(value), _int(start), _int(stop)))]

    def _push(self, key: bytes, elements: tuple[bytes, ...], left: bool) -> int:
        if not elements:
            raise CommandError(f"ERR wrong number of arguments for '{'lpush' if left else 'rpush'}' command")
        value = self._get(key, list)
        if value is None:
            value = self.data[key] = []
        for element in elements:
            if left:
                value.insert(0, element)
            else:
                value.append(element)
        self.writes += 1
        return len(value)

    def rpush(self, key: bytes, *elements: bytes) -> int:
        return self._push(key, elements, False)

    def lpush(self, key: bytes, *elements: bytes) -> int:
        return self._push(key, elements, True)

    def lpop(self, key: bytes) -> Any:
        value = self._get(key, list)
        if not value:
            return None
        head = value.pop(0)
        self._tidy(key, value)
        self.writes += 1
        return head

    def lrem(self, key: bytes, count: bytes, element: bytes) -> int:
        value = self._get(key, list)
        n = _int(count)
        if not value:
            return 0
        removed = 0
        if n >= 0:
            i = 0
            while i < len(value) and (n == 0 or removed < n):
                if value[i] == element:
                    del value[i]
                    removed += 1
                else:
                    i += 1
        else:
            i = len(value) - 1
            while i >= 0 and removed < -n:
                if value[i] == element:
                    del value[i]
                    removed += 1
                i -= 1
        self._tidy(key, value)
        self.writes += bool(removed)
        return removed

    def ltrim(self, key: bytes, start: bytes, stop: bytes) -> Status:
        value = self._get(key, list)
        if value is not None:
            a, b = _range(len(value), _int(start), _int(stop))
            value[:] = value[a:b]
            self._tidy(key, value)
            self.writes += 1
        return Status("OK")

    # hashes
    def hset(self, key: bytes, *pairs: bytes) -> int:
        if not pairs or len(pairs) % 2:
            raise CommandError("ERR wrong number of arguments for 'hset' command")
        value = self._get(key, dict)
        if value is None:
            value = self.data[key] = {}
        added = 0
        for i in range(0, len(pairs), 2):
            added += pairs[i] not in value
            value[pairs[i]] = pairs[i + 1]
        self.writes += 1
        return added

    def hget(self, key: bytes, field: bytes) -> Any:
        value = self._get(key, dict)
        return None if value is None else value.get(field)

    def hmget(self, key: bytes, *fields: bytes) -> list[Any]:
        if not fields:
            raise CommandError("ERR wrong number of arguments for 'hmget' command")
        value = self._get(key, dict) or {}
        return [value.get(field) for field in fields]

    def hdel(self, key: bytes, *fields: bytes) -> int:
        value = self._get(key, dict)
        if not value:
            return 0
        removed = 0
        for field in fields:
            if field in value:
                del value[field]
                removed += 1
        self._tidy(key, value)
        self.writes += bool(removed)
        return removed

    def hgetall(self, key: bytes) -> list[bytes]:
        value = self._get(key, dict) or {}
        return [x for pair in value.items() for x in pair]

    # sets (the index of what is held and queued)
    def sadd(self, key: bytes, *members: bytes) -> int:
        if not members:
            raise CommandError("ERR wrong number of arguments for 'sadd' command")
        value = self._get(key, set)
        if value is None:
            value = self.data[key] = set()
        before = len(value)
        value.update(members)
        added = len(value) - before
        self.writes += bool(added)
        return added

    def srem(self, key: bytes, *members: bytes) -> int:
        if not members:
            raise CommandError("ERR wrong number of arguments for 'srem' command")
        value = self._get(key, set)
        if not value:
            return 0
        before = len(value)
        value.difference_update(members)
        removed = before - len(value)
        self._tidy(key, value)
        self.writes += bool(removed)
        return removed

    def smembers(self, key: bytes) -> list[bytes]:
        return sorted(self._get(key, set) or ())

    def scard(self, key: bytes) -> int:
        return len(self._get(key, set) or ())

    def sismember(self, key: bytes, member: bytes) -> int:
        return int(member in (self._get(key, set) or ()))

    # sorted sets
    def zadd(self, key: bytes, *pairs: bytes) -> int:
        if not pairs or len(pairs) % 2:
            raise CommandError("ERR syntax error")
        scores = [(_float(pairs[i]), pairs[i + 1]) for i in range(0, len(pairs), 2)]
        value = self._get(key, Zset)
        if value is None:
            value = self.data[key] = Zset()
        added: int = sum(value.add(score, member) for score, member in scores)
        self.writes += 1
        return added

    def zscore(self, key: bytes, member: bytes) -> Any:
        value = self._get(key, Zset)
        score = None if value is None else value.scores.get(member)
        return None if score is None else fmt_number(score)

    def zrem(self, key: bytes, *members: bytes) -> int:
        value = self._get(key, Zset)
        if not value:
            return 0
        removed: int = sum(value.remove(member) for member in members)
        self._tidy(key, value)
        self.writes += bool(removed)
        return removed

    def zcard(self, key: bytes) -> int:
        value = self._get(key, Zset)
        return len(value) if value else 0

    def zrange(self, key: bytes, start: bytes, stop: bytes, *options: bytes) -> list[bytes]:
        value = self._get(key, Zset)
        withscores = _withscores(options)
        if not value:
            return []
        a, b = _range(len(value), _int(start), _int(stop))
        return _flatten(value.order[a:b], withscores)

    def _by_score(self, value: Zset, low: bytes, high: bytes) -> list[tuple[float, bytes]]:
        (lo, lo_open), (hi, hi_open) = _bound(low), _bound(high)
        return [(s, m) for s, m in value.order
                if (s > lo if lo_open else s >= lo) and (s < hi if hi_open else s <= hi)]

    def zrangebyscore(self, key: bytes, low: bytes, high: bytes, *options: bytes) -> list[bytes]:
        value = self._get(key, Zset)
        withscores = _withscores(options)
        return _flatten(self._by_score(value, low, high), withscores) if value else []

    def zcount(self, key: bytes, low: bytes, high: bytes) -> int:
        value = self._get(key, Zset)
        return len(self._by_score(value, low, high)) if value else 0

    def zremrangebyscore(self, key: bytes, low: bytes, high: bytes) -> int:
        value = self._get(key, Zset)
        if not value:
            return 0
        gone = self._by_score(value, low, high)
        for _, member in gone:
            value.remove(member)
        self._tidy(key, value)
        self.writes += bool(gone)
        return len(gone)

    def blpop_now(self, key: bytes) -> Any:
        """The non-blocking half of BLPOP (the server blocks a client by calling it again
        whenever the key is pushed to): ``[key, value]`` or None."""
        value = self.lpop(key)
        return None if value is None else [key, value]


class Zset:
    """A sorted set: scores by member, and (score, member) pairs kept in order."""

    __slots__ = ("scores", "order")

    def __init__(self) -> None:
        self.scores: dict[bytes, float] = {}
        self.order: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self.scores)

    def copy(self) -> Zset:
        other = Zset()
        other.scores = dict(self.scores)
        other.order = list(self.order)
        return other

    def add(self, score: float, member: bytes) -> bool:
        old = self.scores.get(member)
        if old is not None:
            self.order.remove((old, member))
        self.scores[member] = score
        bisect.insort(self.order, (score, member))
        return old is None

    def remove(self, member: bytes) -> bool:
        old = self.scores.pop(member, None)
        if old is None:
            return False
        self.order.remove((old, member))
        return True


def _range(n: int, start: int, stop: int) -> tuple[int, int]:
    """Redis's inclusive, negative-capable range as a Python slice's bounds."""
    if start < 0:
        start = max(0, n + start)
    if stop < 0:
        stop = n + stop
    stop = min(stop, n - 1)
    if start > stop:
        return 0, 0
    return start, stop + 1


def _withscores(options: tuple[bytes, ...]) -> bool:
    if not options:
        return False
    if len(options) == 1 and options[0].upper() == b"WITHSCORES":
        return True
    raise CommandError("ERR syntax error")


def _flatten(pairs: list[tuple[float, bytes]], withscores: bool) -> list[bytes]:
    if not withscores:
        return [m for _, m in pairs]
    return [x for s, m in pairs for x in (m, fmt_number(s))]


_COMMANDS = {
    "GET": Keyspace.get, "MGET": Keyspace.mget, "SET": Keyspace.set, "DEL": Keyspace.delete,
    "EXISTS": Keyspace.exists, "PEXPIRE": Keyspace.pexpire, "PTTL": Keyspace.pttl, "RENAME": Keyspace.rename,
    "LLEN": Keyspace.llen, "LINDEX": Keyspace.lindex, "LPOS": Keyspace.lpos, "LRANGE": Keyspace.lrange,
    "RPUSH": Keyspace.rpush, "LPUSH": Keyspace.lpush, "LPOP": Keyspace.lpop, "LREM": Keyspace.lrem,
    "LTRIM": Keyspace.ltrim, "HSET": Keyspace.hset, "HGET": Keyspace.hget, "HDEL": Keyspace.hdel,
    "HGETALL": Keyspace.hgetall, "HMGET": Keyspace.hmget, "SADD": Keyspace.sadd, "SREM": Keyspace.srem,
    "SMEMBERS": Keyspace.smembers, "SCARD": Keyspace.scard, "SISMEMBER": Keyspace.sismember,
    "ZADD": Keyspace.zadd, "ZSCORE": Keyspace.zscore, "ZREM": Keyspace.zrem,
    "ZCARD": Keyspace.zcard, "ZRANGE": Keyspace.zrange, "ZRANGEBYSCORE": Keyspace.zrangebyscore,
    "ZCOUNT": Keyspace.zcount, "ZREMRANGEBYSCORE": Keyspace.zremrangebyscore,
}


def command_handler(command: str) -> Any:
    """The method that runs ``command`` (upper case) on a keyspace, or None if unknown."""
    return _COMMANDS.get(command)
