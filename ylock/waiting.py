"""How a waiter spaces its polls: at a constant interval, or exponentially with jitter (the
two strategies of the Java ylock, the design this package follows).

An engine with a notify path (Redis) blocks on its own wake-up key for at most one poll
interval, so polling is only the fallback that bounds the cost of a lost wake-up.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from ylock.owner import after_fork

#: The jitter's own generator: a library must not draw from (and so shift) the ``random``
#: module's, which an application or its tests may have seeded to replay a run. Seeded
#: anew in every forked child, or the workers of a preforking server would draw the same.
_jitter = random.Random()
after_fork(_jitter.seed)


@dataclass(frozen=True)
class Polling:
    """Poll intervals starting at ``initial`` seconds, multiplied by ``multiplier`` after
    each poll up to ``maximum``, each scattered by up to ``jitter`` (a fraction) so that
    waiters that started together drift apart.

    ``Polling.constant(0.1)`` polls every 100 ms; ``Polling.exponential()`` is the default.
    """

    initial: float = 0.05
    maximum: float = 0.5
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.maximum >= self.initial):
            raise ValueError(f"polling needs 0 < initial <= maximum, got initial={self.initial} maximum={self.maximum}")
        if self.multiplier < 1:
            raise ValueError(f"polling multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"polling jitter must be in [0, 1), got {self.jitter}")

    @classmethod
    def constant(cls, interval: float, jitter: float = 0.0) -> Polling:
        """Return a strategy that polls every ``interval`` seconds."""
        return cls(initial=interval, maximum=interval, multiplier=1.0, jitter=jitter)

    @classmethod
    def exponential(cls, initial: float = 0.05, maximum: float = 0.5, multiplier: float = 2.0,
                    jitter: float = 0.2) -> Polling:
        """Return a strategy whose interval grows geometrically up to ``maximum``."""
        return cls(initial=initial, maximum=maximum, multiplier=multiplier, jitter=jitter)

    def intervals(self) -> Iterator[float]:
        """Yield the successive poll intervals, in seconds, forever."""
        interval = self.initial
        while True:
            if self.jitter:
                yield interval * (1.0 - self.jitter * _jitter.random())
            else:
                yield interval
            interval = min(self.maximum, interval * self.multiplier)

    @functools.cached_property
    def waiter_lease(self) -> float:
        """Seconds a queued waiter stays alive in the queue without polling.

        Three missed polls at the longest interval, and never under a second, so a
        slow poll is not mistaken for a dead waiter.
        """
        # Cached (the strategy is frozen): every first acquisition reads it twice; a cached
        # value lives in the instance's dict, read without a call.
        return max(1.0, 3.0 * self.maximum)


DEFAULT_POLLING = Polling()
