"""Run user exporters (callables taking an :class:`~ylock.events.Event`) off the lock path.

``METRICS["EXPORTERS"] = ["myapp.metrics.to_statsd"]`` imports each dotted path and
calls it with every event, in order, from one background thread with a bounded buffer
(:class:`~ylock.metrics.background.Shipper`): a slow or failing exporter drops and
counts events; it never delays or fails a lock call.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ylock import options as opt
from ylock.events import Event
from ylock.metrics.background import Shipper

logger = logging.getLogger(__name__)


def import_callable(path: str, setting: str = "METRICS['EXPORTERS']") -> Callable[[Event], object]:
    """Import ``"package.module.attribute"`` and return it; raise ConfigurationError if that fails."""
    return opt.importable(opt.text(path, setting, code=opt.E_METRICS), setting,  # type: ignore[no-any-return]
                          code=opt.E_METRICS, call=True)


class CallbackExporter(Shipper):
    """Call each of ``callbacks`` with every event, from a background thread."""

    kind = "custom"

    def __init__(self, callbacks: Sequence[Callable[[Event], object]], *, buffer_size: int = 10_000,
                 batch_size: int = 500, flush_interval: float = 0.2) -> None:
        super().__init__(buffer_size=buffer_size, batch_size=batch_size, flush_interval=flush_interval)
        self.callbacks = tuple(callbacks)

    def __repr__(self) -> str:
        return f"<CallbackExporter {[getattr(c, '__qualname__', c) for c in self.callbacks]}>"

    def ship(self, batch: list[Event]) -> None:
        """Hand every event to every callback; raise the first error after trying them all."""
        first: Exception | None = None
        for event in batch:
            for callback in self.callbacks:
                try:
                    callback(event)
                except Exception as exc:  # noqa: BLE001 - counted and logged by the shipper
                    first = first or exc
        if first is not None:
            raise first
