"""The schedule state that the beats of one lock share, kept on the lock's engine, fenced.

What is shared: when each schedule entry last ran (its record: the run's time, the run
count, the fencing token of the term that sent it and the sender), which term is the newest
(``fence``: its token), who leads it and since when (``leader``), and how many terms began
(``terms``: the takeovers, the first election included).

Two operations change it, each one atomic round trip on the server:

``open_term(token, leader)``
    A new leader raises the fence to its token and reads every record, before it sends
    anything. A term whose token is below the fence is refused (its lock was lost: a newer
    leader exists).
``claim(token, entry, seen, record)``
    Before each send, the leader records the run, if the fence is still its token (no newer
    term began: the check a leader paused past its lease fails after it resumes, whatever
    its local clocks say) and the entry's record is still the one it saw (nobody recorded a
    run it does not know of).

So a run recorded by an old leader is seen by the next one (which read after raising the
fence), and an old leader's claim after the next one began is refused: no run is sent twice
by two terms. What remains is the gap between a granted claim and the message reaching the
broker (a leader that dies there loses that run; one paused there sends it late, with its
old token in the headers): see docs/celery.md.

Engines: Redis (one hash per beat lock, ``<prefix>:beat:{<group>:<name>}``, changed by two
Lua scripts in ``lua/``; Cluster-safe, in the lock's own hash slot), ZooKeeper (one znode,
``<root>/:beat/<group>/<name>``, changed by versioned writes) and the local engine (in
memory). Records are kept until the key is deleted (``ylock``'s commands do not list it).
"""
from __future__ import annotations

import abc
import json
import threading
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ylock import options as opt
from ylock.engines.base import Engine
from ylock.errors import EngineUnavailable

__all__ = ["CLAIMED", "FENCED", "CONFLICT", "ENTRY", "Opened", "StateStore", "check_engine", "store_for"]

#: The outcomes of :meth:`StateStore.claim`.
CLAIMED, FENCED, CONFLICT = "claimed", "fenced", "conflict"
#: The prefix of an entry's field (Redis) or key (elsewhere).
ENTRY = "e:"


@dataclass(frozen=True)
class Opened:
    """A term's start: the previous leader's description (JSON, or None for the first term),
    the number of terms so far (this one included) and every entry's record (raw JSON)."""

    previous: str | None
    terms: int
    records: dict[str, str]


class StateStore(abc.ABC):
    """The shared schedule state of one beat lock (see the module docstring)."""

    def __init__(self, group: str, name: str) -> None:
        self.group = group
        self.name = name

    @abc.abstractmethod
    def open_term(self, token: int, leader: str) -> Opened | int:
        """Raise the fence to ``token`` and return the state, or return the fence (an int
        greater than ``token``) if a newer term holds it."""

    @abc.abstractmethod
    def claim(self, token: int, entry: str, seen: str | None, record: str) -> tuple[str, str | None]:
        """Record ``record`` as ``entry``'s last run if the fence is ``token`` and the entry's
        record is ``seen`` (None: no record); return ``(CLAIMED, None)``, ``(FENCED, fence)`` or
        ``(CONFLICT, the current record)``."""

    @abc.abstractmethod
    def read(self) -> dict[str, str]:
        """Return the whole state as stored (``fence``, ``terms``, ``leader``, ``e:<entry>``)."""

    def fail(self, exc: Exception) -> EngineUnavailable:
        """The error of a call that the server did not answer."""
        return EngineUnavailable(f"the beat's schedule state could not be read or written: {exc}",
                                 group=self.group, name=self.name)


# -- Redis ---------------------------------------------------------------------------------------


def _lua(name: str) -> str:
    return resources.files("celery_ylock.beat").joinpath("lua", name).read_text()


class RedisStateStore(StateStore):
    """The state in one hash next to the lock's keys (same hash slot)."""

    def __init__(self, engine: Any, group: str, name: str) -> None:
        super().__init__(group, name)
        self.engine = engine
        self.key = f"{engine.prefix}:beat:{{{group}:{name}}}"
        self._scripts: tuple[Any, Any, Any] | None = None

    def _script(self, which: int) -> Any:
        client = self.engine.client          # a new one after fork: scripts follow it
        scripts = self._scripts
        if scripts is None or scripts[0] is not client:
            scripts = self._scripts = (client, client.register_script(_lua("lead.lua")),
                                       client.register_script(_lua("claim.lua")))
        return scripts[which]

    def _call(self, which: int, args: list[str]) -> Any:
        import redis.exceptions

        try:
            return self._script(which)(keys=[self.key], args=args)
        except redis.exceptions.RedisError as exc:
            raise self.fail(exc) from exc

    def open_term(self, token: int, leader: str) -> Opened | int:
        reply = self._call(1, [str(token), leader])
        if int(reply[0]) == 0:
            return int(reply[1])
        items = [_text(v) for v in reply[3:]]
        records = {items[i][len(ENTRY):]: items[i + 1] for i in range(0, len(items), 2)}
        return Opened(_text(reply[1]) or None, int(reply[2]), records)

    def claim(self, token: int, entry: str, seen: str | None, record: str) -> tuple[str, str | None]:
        reply = self._call(2, [str(token), ENTRY + entry, seen or "", record])
        code = int(reply[0])
        if code == 1:
            return CLAIMED, None
        if code == 0:
            return FENCED, _text(reply[1])
        return CONFLICT, _text(reply[1]) or None

    def read(self) -> dict[str, str]:
        import redis.exceptions

        try:
            raw = self.engine.client.hgetall(self.key)
        except redis.exceptions.RedisError as exc:
            raise self.fail(exc) from exc
        return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- ZooKeeper -------------------------------------------------------------------------------------


class ZooKeeperStateStore(StateStore):
    """The state as one JSON znode, changed by compare-and-set on its version."""

    def __init__(self, engine: Any, group: str, name: str) -> None:
        from ylock.engines.zookeeper.paths import escape

        super().__init__(group, name)
        self.engine = engine
        # Under the engine's root, beside its locks: a group never starts with ":", so
        # `ylock list` does not take this for a lock.
        self.path = f"{engine.root.rstrip('/')}/:beat/{escape(group)}/{escape(name)}"

    def _client(self) -> Any:
        client = self.engine.client
        if not client.connected:
            self.engine.ping()          # waits for the connection (EngineUnavailable if none comes)
        return client

    def _load(self) -> tuple[dict[str, str], int | None]:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self._client().get(self.path)
        except NoNodeError:
            return {}, None
        state = json.loads(data.decode() or "{}") if data else {}
        return {str(k): str(v) for k, v in state.items()}, stat.version

    def _update(self, change: Any) -> Any:
        """Apply ``change(state) -> (new state or None, result)`` with a versioned write,
        again if another writer came between the read and the write."""
        from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError

        try:
            while True:
                state, version = self._load()
                new, result = change(dict(state))
                if new is None:
                    return result
                data = json.dumps(new, separators=(",", ":")).encode()
                try:
                    if version is None:
                        self._client().create(self.path, data, makepath=True)
                    else:
                        self._client().set(self.path, data, version=version)
                    return result
                except (BadVersionError, NodeExistsError):
                    continue
        except KazooException as exc:
            raise self.fail(exc) from exc

    def open_term(self, token: int, leader: str) -> Opened | int:
        def change(state: dict[str, str]) -> tuple[dict[str, str] | None, Opened | int]:
            fence = int(state.get("fence", "0"))
            if fence > token:
                return None, fence
            previous = state.get("leader")
            if fence != token:
                state.update(fence=str(token), leader=leader, terms=str(int(state.get("terms", "0")) + 1))
            records = {k[len(ENTRY):]: v for k, v in state.items() if k.startswith(ENTRY)}
            return (state if fence != token else None), Opened(previous, int(state.get("terms", "0")), records)
        result: Opened | int = self._update(change)
        return result

    def claim(self, token: int, entry: str, seen: str | None, record: str) -> tuple[str, str | None]:
        def change(state: dict[str, str]) -> tuple[dict[str, str] | None, tuple[str, str | None]]:
            fence = state.get("fence", "0")
            if fence != str(token):
                return None, (FENCED, fence)
            current = state.get(ENTRY + entry)
            if current != seen:
                return None, (CONFLICT, current)
            state[ENTRY + entry] = record
            return state, (CLAIMED, None)
        result: tuple[str, str | None] = self._update(change)
        return result

    def read(self) -> dict[str, str]:
        from kazoo.exceptions import KazooException

        try:
            return self._load()[0]
        except KazooException as exc:
            raise self.fail(exc) from exc


# -- the local engine (one process: tests, development) ----------------------------------------------

_local: weakref.WeakKeyDictionary[Engine, dict[tuple[str, str], dict[str, str]]] = weakref.WeakKeyDictionary()
_local_mutex = threading.Lock()


class LocalStateStore(StateStore):
    """The state in this process's memory, per local engine (its locks are as local)."""

    def __init__(self, engine: Engine, group: str, name: str) -> None:
        super().__init__(group, name)
        with _local_mutex:
            self.state = _local.setdefault(engine, {}).setdefault((group, name), {})

    def open_term(self, token: int, leader: str) -> Opened | int:
        with _local_mutex:
            state = self.state
            fence = int(state.get("fence", "0"))
            if fence > token:
                return fence
            previous = state.get("leader")
            if fence != token:
                state.update(fence=str(token), leader=leader, terms=str(int(state.get("terms", "0")) + 1))
            records = {k[len(ENTRY):]: v for k, v in state.items() if k.startswith(ENTRY)}
            return Opened(previous, int(state["terms"]), records)

    def claim(self, token: int, entry: str, seen: str | None, record: str) -> tuple[str, str | None]:
        with _local_mutex:
            state = self.state
            if state.get("fence", "0") != str(token):
                return FENCED, state.get("fence", "0")
            current = state.get(ENTRY + entry)
            if current != seen:
                return CONFLICT, current
            state[ENTRY + entry] = record
            return CLAIMED, None

    def read(self) -> dict[str, str]:
        with _local_mutex:
            return dict(self.state)


# -- which one -----------------------------------------------------------------------------------------


def check_engine(engine: Engine, where: str = "app.conf.ylock_beat['lock']") -> None:
    """Raise :class:`~ylock.ConfigurationError` (naming ``where``) if ``engine`` cannot keep a
    beat's shared state."""
    if engine.scheme not in ("redis", "zookeeper", "local") or (
            engine.scheme != "local" and not hasattr(engine, "client")):
        raise opt.fail(where, f"names a lock on a {engine.scheme} engine ({engine.url_for_display()}): the beat "
                       "keeps its shared schedule state on Redis, ZooKeeper or the local engine", opt.E_LOCK_OPTION,
                       "give the beat's lock an ENGINE of one of those in LOCKS")


def store_for(engine: Engine, group: str, name: str) -> StateStore:
    """Return the state store of the beat lock ``group/name`` on ``engine`` (checked with
    :func:`check_engine`)."""
    check_engine(engine)
    if engine.scheme == "redis":
        return RedisStateStore(engine, group, name)
    if engine.scheme == "zookeeper":
        return ZooKeeperStateStore(engine, group, name)
    return LocalStateStore(engine, group, name)
