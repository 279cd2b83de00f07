"""Which tags (labels) an event gets in exported metrics, and which settings would make
them grow without bound.

Every exporter tags a point with ``group``, ``name``, ``engine``, ``mode`` and
``outcome`` (the event kind). Each distinct set of values is a time series of its own
(Prometheus: one per label set and metric, about 59 with the histograms' buckets; InfluxDB:
one per tag set), and a server pays memory for each: so the values must come from a
bounded set. Groups, engines, modes and outcomes are: the code names them. Lock names
are not: a per-user lock, ``@locked(key="account_id")``, a ``Locks`` family make one name
per user or account. So by default the ``name`` tag reads ``*`` (:data:`ANY_NAME`), and
naming locks is an opt-in per group whose names are few and fixed
(``TAG_NAMES: ["orders"]``): the series then stay bounded by groups x engines x modes x
outcomes, whatever the traffic.

An opted-in group still gets at most ``MAX_NAMES`` names per process (default 100); its
further names read ``*`` (a warning on the ``ylock.metrics`` logger says so, once per
group), so a mistaken opt-in costs a bounded number of series, not the metrics server.
:func:`unbounded_labels` tells the plugins which settings would label by an unbounded key
(Django's check ``django_ylock.W007``, a warning at Flask's ``init_app``).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ylock.errors import ConfigurationError
from ylock.events import Event

logger = logging.getLogger("ylock.metrics")

#: The value of the ``name`` tag when names are not tagged.
ANY_NAME = "*"
#: The value of the ``mode`` tag for events that have no mode (e.g. waiter evictions).
NO_MODE = "none"
#: At most this many names of one opted-in group are tagged per process (``MAX_NAMES``).
MAX_NAMES = 100
#: The code of an unbounded-label warning (Django: ``django_ylock.W007``).
W_UNBOUNDED = "W007"

LABELS = ("group", "name", "engine", "mode", "outcome")


class UnboundedLabelsWarning(UserWarning):
    """Settings that tag metrics with lock names without bound (Flask warns at ``init_app``)."""


class Tagging:
    """Turn events into tag tuples, with the ``name`` policy applied.

    ``names``: False (the default: no group's names are tagged), a list of the groups whose
    names are tagged, or True (every group's: unbounded, see :func:`unbounded_labels`);
    ``untagged_groups``: groups whose names are never tagged even then; ``max_names``: at
    most this many names per group are tagged in this process, the others read ``*``.

    Called by the exporters off the lock path; the names seen are counted per group (a
    race between two exporters' threads may tag a name or two beyond the limit).
    """

    __slots__ = ("names", "groups", "untagged_groups", "max_names", "_seen", "_capped")

    def __init__(self, names: bool | Iterable[str] = False, untagged_groups: Iterable[str] = (),
                 max_names: int = MAX_NAMES) -> None:
        self.names = names if isinstance(names, bool) else False
        self.groups = frozenset(() if isinstance(names, bool) else names)
        self.untagged_groups = frozenset(untagged_groups)
        self.max_names = max_names
        self._seen: dict[str, set[str]] = {}
        self._capped: set[str] = set()

    def name(self, event: Event) -> str:
        """Return the ``name`` tag of ``event``: its lock name, or ``*``."""
        group = event.group
        if not (self.names or group in self.groups) or group in self.untagged_groups:
            return ANY_NAME
        seen = self._seen.get(group)
        if seen is None:
            seen = self._seen[group] = set()
        name = event.name
        if name not in seen:
            if len(seen) >= self.max_names:
                if group not in self._capped:
                    self._capped.add(group)
                    logger.warning("ylock: more than %d lock names in group %r: its further names are tagged "
                                   "name=%r (TAG_NAMES is for groups of few, fixed names; MAX_NAMES sets the "
                                   "limit)", self.max_names, group, ANY_NAME)
                return ANY_NAME
            seen.add(name)
        return name

    def labels(self, event: Event) -> tuple[str, str, str, str, str]:
        """Return the values of :data:`LABELS` for ``event``."""
        return (event.group, self.name(event), event.engine or "unknown", event.mode or NO_MODE, event.kind)

    def __repr__(self) -> str:
        names = self.names if self.names or not self.groups else sorted(self.groups)
        return f"Tagging(names={names}, untagged_groups={sorted(self.untagged_groups)}, max_names={self.max_names})"


def keyed_groups(registry: Any, settings: Any) -> dict[str, str]:
    """The lock groups a web app takes one key at a time (group -> how): those of the families
    :data:`ylock.web.KEYED` records (``@locked``/``@limited`` with a key), and the per-user
    lock's (``settings``: the app's :class:`ylock.web.WebSettings`; ``registry``: its
    :class:`ylock.registry.Registry`, which knows each family's group)."""
    from ylock import web

    families = dict(web.KEYED)
    if settings.user_lock is not None:
        families.setdefault(settings.user_lock.lock, "USER_LOCK (one lock per user)")
    groups: dict[str, str] = {}
    for name, how in families.items():
        try:
            groups.setdefault(registry.lock_options(name).group, how)
        except ConfigurationError:
            continue            # the settings' own checks name it
    return groups


def unbounded_labels(tag_names: bool | Iterable[str], untagged_groups: Iterable[str] = (), *,
                     keyed: Mapping[str, str] = {}, setting: str = "METRICS") -> list[ConfigurationError]:
    """Return a warning (a :class:`~ylock.ConfigurationError` with code :data:`W_UNBOUNDED`)
    for each way these settings would tag points with an unbounded lock name.

    ``tag_names``/``untagged_groups``: the ``TAG_NAMES``/``UNTAGGED_GROUPS`` settings;
    ``keyed``: the groups known to be locked one key at a time (a per-user lock, a
    ``@locked`` view keyed by a URL value or the user), each with how; ``setting``: how the
    user wrote the metrics settings (``YLOCK['METRICS']``, ``YLOCK_METRICS``)."""
    untagged = set(untagged_groups)
    where = f"{setting}['TAG_NAMES']"
    hint = f"list the groups whose lock names are few and fixed, e.g. {where} = ['orders']"
    if tag_names is True:
        families = sorted(g for g in keyed if g not in untagged)
        also = f" (here: {', '.join(f'{g!r} by {keyed[g]}' for g in families)})" if families else ""
        return [ConfigurationError(
            f"{where} is True: every lock name becomes a label value, one set of series per name, and the "
            f"names of per-user and keyed locks grow without bound{also}", code=W_UNBOUNDED, hint=hint)]
    if tag_names is False:
        return []
    return [ConfigurationError(
        f"{where} lists {group!r}, whose locks are keyed by {keyed[group]}: one set of series per key, "
        "without bound", code=W_UNBOUNDED, hint=f"leave {group!r} out of it; {hint}")
        for group in tag_names if group in keyed and group not in untagged]
