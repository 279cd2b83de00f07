"""Which tags (labels) an event gets in exported metrics.

Every exporter tags a point with ``group``, ``name``, ``engine``, ``mode`` and
``outcome`` (the event kind). Lock names of fine-grained families (one lock per user,
per order...) would make one time series per name, so the ``name`` tag can be switched
off globally or per group; it then reads ``*``.
"""
from __future__ import annotations

from collections.abc import Iterable

from ylock.events import Event

#: The value of the ``name`` tag when names are not tagged.
ANY_NAME = "*"
#: The value of the ``mode`` tag for events that have no mode (e.g. waiter evictions).
NO_MODE = "none"

LABELS = ("group", "name", "engine", "mode", "outcome")


class Tagging:
    """Turn events into tag tuples, with the ``name`` policy applied.

    ``names``: tag lock names at all; ``untagged_groups``: groups whose names are never
    tagged even then (e.g. a per-user ``Locks`` family).
    """

    __slots__ = ("names", "untagged_groups")

    def __init__(self, names: bool = True, untagged_groups: Iterable[str] = ()) -> None:
        self.names = bool(names)
        self.untagged_groups = frozenset(untagged_groups)

    def name(self, event: Event) -> str:
        """Return the ``name`` tag of ``event``: its lock name, or ``*``."""
        if self.names and event.group not in self.untagged_groups:
            return event.name
        return ANY_NAME

    def labels(self, event: Event) -> tuple[str, str, str, str, str]:
        """Return the values of :data:`LABELS` for ``event``."""
        return (event.group, self.name(event), event.engine or "unknown", event.mode or NO_MODE, event.kind)

    def __repr__(self) -> str:
        return f"Tagging(names={self.names}, untagged_groups={sorted(self.untagged_groups)})"
