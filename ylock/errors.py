"""The one exception tree of ylock.

Every error that leaves the public API is a :class:`LockError`. Driver exceptions
(``redis.exceptions.*``, ``kazoo.exceptions.*``) are translated at exactly one place per
engine and kept as ``__cause__``.
"""
from __future__ import annotations


class LockError(Exception):
    """Root of every ylock error. ``group`` and ``name`` say which lock, when known."""

    def __init__(self, message: str, *, group: str | None = None, name: str | None = None) -> None:
        self.group = group
        self.name = name
        if group is not None and name is not None:
            message = f"{message} (lock {group}/{name})"
        super().__init__(message)


class LockTimeout(LockError, TimeoutError):
    """The lock could not be acquired within the timeout."""


class LockNotOwned(LockError):
    """Released by a thread (or owner scope) that does not hold it in that mode."""


class LockLost(LockError):
    """The lease of this hold could not be renewed: another owner may have had the lock."""


class FencedOut(LockLost):
    """A fenced write was refused: a holder with a newer fencing token had already written
    the rows, so this holder's lock was lost (paused past its lease, partitioned) and its
    write would have overwritten newer work. Nothing was written. ``token`` is the refused
    token."""

    def __init__(self, message: str, *, token: int | None = None, group: str | None = None,
                 name: str | None = None) -> None:
        self.token = token
        super().__init__(message, group=group, name=name)


class LockUpgradeError(LockError):
    """A read holder asked for the write lock; that would deadlock, so it is refused."""


class EngineUnavailable(LockError, ConnectionError):
    """The engine's server could not be reached or did not answer in time."""


class ConfigurationError(LockError, ValueError):
    """A URL, setting or option is invalid.

    ``code`` says which kind of mistake (``"E002"``: an engine URL or option; the list is in
    :mod:`ylock.options`), so that a plugin can report it with a stable id (the Django app's
    system checks); ``hint`` says how to fix it, when there is more to say. The
    message (``str()``) ends with the hint in parentheses; ``problem`` is the message alone.
    """

    def __init__(self, message: str, *, code: str = "E001", hint: str = "", group: str | None = None,
                 name: str | None = None) -> None:
        self.code = code
        self.hint = hint
        self.problem = message
        super().__init__(f"{message} ({hint})" if hint else message, group=group, name=name)
