"""Idempotency records and the stores that keep them, framework-free.

A record belongs to one (scope, key) and says one of two things:

- **in flight**: a request holding the key's lock with fencing token ``t`` runs the view
  for the request whose fingerprint is ``f``;
- **done**: the response of that request (``r``), to replay to every retry.

A store offers three atomic steps, each fenced by the lock's token (see
:class:`RecordStore`): ``begin`` (mark in flight, unless done or begun by a newer token),
``commit`` (write the response, refused if a newer token has begun or written: a request
paused past its lease never overwrites a retry's response) and ``abort`` (free a key whose
request stored nothing). Being in flight is the lock's business, not the record's: a
duplicate that cannot get the lock is answered 409, and a worker killed mid-request
frees its key when its lease runs out, whatever its record says. The record's token is
the fence: the newer holder's ``begin`` raises it before its view runs.

Two stores: :class:`RedisRecords` (Lua scripts on a Redis server: the lock engine's own,
or a Redis cache of Django or Flask-Caching; fenced on the server, across processes and
machines) and :class:`LocalRecords` (a process's memory or a per-process cache, under a
mutex: fenced within the one process that can see it, for development and tests).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from ylock.errors import EngineUnavailable, LockError


def fingerprint(method: str, path: str, body: bytes) -> str:
    """Return the fingerprint of a request: a hash of its method, path (with the query
    string) and body. The same key with another fingerprint is answered 422."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode("utf-8", "surrogatepass"), hashlib.sha256(body).digest()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def record_id(scope: str, key: str) -> str:
    """Return the id of the record and lock of ``key`` in ``scope``: a hash of both, so that
    any key is safe in a store key and a lock name, two scopes never share one, and the
    key a client sent (and the user it belongs to) never appears in ``ylock list``."""
    digest = hashlib.sha256()
    for part in (scope, key):
        raw = part.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.hexdigest()


@dataclass(frozen=True)
class StoredResponse:
    """A response as it is replayed: status, reason phrase, the headers the view set (never
    ``Set-Cookie``; ``Content-Type`` included) and the body, byte for byte."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def encode(self) -> bytes:
        """Return the bytes a store keeps: a JSON line of the head, then the body as it is."""
        head = {"status": self.status, "reason": self.reason, "headers": [list(h) for h in self.headers]}
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + self.body

    @classmethod
    def decode(cls, data: bytes) -> StoredResponse:
        """Return the response that :meth:`encode` wrote."""
        head, _, body = data.partition(b"\n")
        fields = json.loads(head)
        return cls(int(fields["status"]), str(fields["reason"]), tuple((str(k), str(v)) for k, v in fields["headers"]),
                   body)


@dataclass(frozen=True)
class Record:
    """What a store holds for one key: the token of the holder that wrote it, the
    fingerprint of its request, and its response once done (None: in flight)."""

    token: int
    fingerprint: str
    response: StoredResponse | None = None

    @property
    def done(self) -> bool:
        return self.response is not None


class RecordStore(ABC):
    """Where the records of one store live. Every method is atomic on the store (all
    processes that share it see one order) and raises :class:`ylock.EngineUnavailable`
    when the store cannot be reached. ``ttl``: seconds the record lives."""

    #: How the store is named in messages and logs.
    label = "store"

    @abstractmethod
    def get(self, rid: str) -> Record | None:
        """Return the record ``rid`` or None."""

    @abstractmethod
    def begin(self, rid: str, token: int, fingerprint: str, ttl: float) -> Record | None:
        """Mark ``rid`` in flight for the holder of ``token`` and return None; but if the
        record is done, or was begun or written with a newer token, change nothing and
        return it."""

    @abstractmethod
    def commit(self, rid: str, token: int, fingerprint: str, response: StoredResponse, ttl: float) -> bool:
        """Write ``response`` as ``rid``'s, done; return False (nothing written) if a
        holder with a newer token than ``token`` has begun or written."""

    @abstractmethod
    def abort(self, rid: str, token: int) -> None:
        """Delete ``rid`` if it is still in flight for ``token`` (the key is free again)."""


# -- in one process ---------------------------------------------------------------------------


class Slots(Protocol):
    """What :class:`LocalRecords` needs of a cache: bytes by key, with an expiry."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl: float) -> None: ...

    def delete(self, key: str) -> None: ...


class MemorySlots:
    """A dict with expiries: the slots of the in-process engine."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[float, bytes]] = {}

    def get(self, key: str) -> bytes | None:
        found = self._data.get(key)
        if found is None:
            return None
        if found[0] <= time.monotonic():
            del self._data[key]
            return None
        return found[1]

    def set(self, key: str, value: bytes, ttl: float) -> None:
        now = time.monotonic()
        if len(self._data) > 10_000:        # forget the expired ones now and then
            self._data = {k: v for k, v in self._data.items() if v[0] > now}
        self._data[key] = (now + ttl, value)

    def delete(self, key: str) -> None:
        self._data.pop(key, None)


def encode_record(record: Record) -> bytes:
    """The bytes of a record in a cache: a JSON line with token and fingerprint, then the
    encoded response (nothing while in flight)."""
    head = json.dumps({"t": record.token, "f": record.fingerprint}).encode()
    return head + b"\n" + (b"" if record.response is None else b"R" + record.response.encode())


def decode_record(data: Any) -> Record | None:
    """The record that :func:`encode_record` wrote; None for anything else."""
    if not isinstance(data, bytes):
        return None
    head, _, rest = data.partition(b"\n")
    fields = json.loads(head)
    response = StoredResponse.decode(rest[1:]) if rest.startswith(b"R") else None
    return Record(int(fields["t"]), str(fields["f"]), response)


class LocalRecords(RecordStore):
    """Records in ``slots`` (a per-process cache, or memory), each step under one mutex per
    store: atomic within this process, which is all such a cache serves. Never a store for
    several processes: the system checks refuse it in production."""

    def __init__(self, slots: Slots, prefix: str = "ylock-idempotency:", label: str = "memory") -> None:
        self.slots, self.prefix, self.label = slots, prefix, label
        self._mutex = threading.Lock()

    def _read(self, rid: str) -> Record | None:
        return decode_record(self.slots.get(self.prefix + rid))

    def get(self, rid: str) -> Record | None:
        with self._mutex:
            return self._read(rid)

    def begin(self, rid: str, token: int, fingerprint: str, ttl: float) -> Record | None:
        with self._mutex:
            found = self._read(rid)
            if found is not None and (found.done or found.token > token):
                return found
            self.slots.set(self.prefix + rid, encode_record(Record(token, fingerprint)), ttl)
            return None

    def commit(self, rid: str, token: int, fingerprint: str, response: StoredResponse, ttl: float) -> bool:
        with self._mutex:
            found = self._read(rid)
            if found is not None and found.token > token:
                return False
            self.slots.set(self.prefix + rid, encode_record(Record(token, fingerprint, response)), ttl)
            return True

    def abort(self, rid: str, token: int) -> None:
        with self._mutex:
            found = self._read(rid)
            if found is not None and found.token == token and not found.done:
                self.slots.delete(self.prefix + rid)


# -- on a Redis server -------------------------------------------------------------------------


def _script(name: str) -> str:
    return resources.files("ylock.idempotency").joinpath(f"lua/{name}.lua").read_text(encoding="utf-8")


#: The Lua scripts, read once (each opens with its KEYS/ARGV contract).
SCRIPTS = {name: _script(name) for name in ("begin", "commit", "abort")}


class RedisRecords(RecordStore):
    """Records as hashes on a Redis server, each step one Lua script (one key: fine on
    Cluster), so the fence is checked where the record is written. ``client``: a redis-py
    client (the lock engine's, or a Redis cache's); ``prefix``: the keys' start (the
    engine's prefix, or the cache's key made with its KEY_PREFIX and version)."""

    def __init__(self, client: Any, prefix: str, label: str = "redis") -> None:
        self.client, self.prefix, self.label = client, prefix, label
        self._scripts = {name: client.register_script(source) for name, source in SCRIPTS.items()}

    def _call(self, name: str, rid: str, args: Iterable[Any]) -> Any:
        try:
            return self._scripts[name](keys=[self.prefix + rid], args=list(args))
        except Exception as exc:
            raise _translate(exc, self.label) from exc

    def get(self, rid: str) -> Record | None:
        try:
            t, f, r = self.client.hmget(self.prefix + rid, ["t", "f", "r"])
        except Exception as exc:
            raise _translate(exc, self.label) from exc
        return _record([t, f, r]) if t is not None else None

    def begin(self, rid: str, token: int, fingerprint: str, ttl: float) -> Record | None:
        found = self._call("begin", rid, [token, fingerprint, _ms(ttl)])
        return _record(found) if found else None

    def commit(self, rid: str, token: int, fingerprint: str, response: StoredResponse, ttl: float) -> bool:
        return bool(self._call("commit", rid, [token, fingerprint, response.encode(), _ms(ttl)]))

    def abort(self, rid: str, token: int) -> None:
        self._call("abort", rid, [token])


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(found: list[Any]) -> Record:
    t, f, r = found
    return Record(int(_text(t)), _text(f), StoredResponse.decode(r) if r else None)


def _translate(exc: Exception, label: str) -> Exception:
    """A redis-py error as ylock's: the server out of reach is EngineUnavailable (503)."""
    import redis.exceptions as rex

    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, rex.BusyLoadingError, rex.ReadOnlyError, OSError)):
        return EngineUnavailable(f"the idempotency store ({label}) is unavailable: {exc}")
    if isinstance(exc, rex.RedisError):
        text = str(exc)
        if any(word in text for word in ("CLUSTERDOWN", "READONLY", "MASTERDOWN", "NOREPLICAS", "LOADING")):
            return EngineUnavailable(f"the idempotency store ({label}) is unavailable: {exc}")
        return LockError(f"the idempotency store ({label}) failed: {exc}")
    return exc
