"""What the engine's helper modules (:mod:`.steps`, :mod:`.aio`, :mod:`.inspection`) use
of the engine, as a Protocol: they are handed the engine but never import its module,
which imports them (no import circle)."""
from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ylock.engines.redis.clients import Clients
from ylock.engines.redis.direct import Refusals
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
    _refusals: Refusals                               # commands the server refused (direct.py)
    _async: dict[asyncio.AbstractEventLoop, Any]      # each loop's AsyncSide (aio.py)

    @property
    def client(self) -> Any: ...

    def url_for_display(self) -> str: ...

    def _run(self, name: str, key: str, args: list[Any], timeout: float | None = None) -> Any: ...

    def _publish_evicted(self, group: str, name: str, evicted: list[Any]) -> None: ...
