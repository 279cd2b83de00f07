"""What the engine's helper modules (:mod:`.steps`, :mod:`.aio`, :mod:`.averbs`,
:mod:`.renewal`, :mod:`.inspection`) use of the engine, as a Protocol: they are handed the
engine (or are its base class) but never import its module, which imports them (no import
circle)."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from ylock.engines.base import AcquireRequest
from ylock.engines.redis.clients import Clients
from ylock.engines.redis.hubs import Refusals
from ylock.engines.redis.keys import Keys


class EngineParts(Protocol):
    """The attributes of :class:`~ylock.engines.redis.engine.RedisEngine` its helpers read."""

    keys: Keys
    clients: Clients
    kind: str
    notify: bool
    socket_timeout: float
    wait_replicas: int
    wait_timeout_ms: int
    renew_chunk: int
    _refusals: Refusals                               # commands the server refused (hubs.py)
    _async: dict[asyncio.AbstractEventLoop, Any]      # each loop's AsyncSide (aio.py)
    _scripts: dict[str, Any]                          # the registered scripts, by name
    _renew_calls: Any                                 # the watchdog's direct calls (renewal.py)
    _inspect_calls: Any                               # the listings' direct calls (inspection.py)
    _lock_keys: dict[tuple[str, str, str], tuple[str, ...]]   # the keys of the locks in use

    @property
    def client(self) -> Any: ...

    def url_for_display(self) -> str: ...

    def _run(self, name: str, keys: tuple[str, ...], args: list[Any], end: float | None = None) -> Any: ...

    def _caller(self) -> Any: ...

    def _publish_evicted(self, group: str, name: str, evicted: list[Any]) -> None: ...

    def _request(self, r: AcquireRequest) -> tuple[tuple[str, ...], list[Any]]: ...

    def _keys_of(self, group: str, name: str, mode: str) -> tuple[str, ...]: ...

    def _translate(self, exc: Exception, group: str | None, name: str | None) -> Exception: ...

    def _released(self, group: str, name: str, reply: Any) -> bool: ...

    def _errors(self, group: str | None = None, name: str | None = None) -> contextlib.AbstractContextManager[None]: ...
