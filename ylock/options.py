"""The validation vocabulary: the few checks that every setting and option is made of.

The core (lock options, engine options), the registry (``YLOCK`` / ``YLOCK_*`` settings),
both plugins and the metrics configuration validate with these functions, so that every
mistake gets the same kind of message: *where* (``LOCKS['orders']['LEASE']``, ``lease``,
``?socket_timeout=``), *what was given*, *what is allowed*. Each raises
:class:`~ylock.ConfigurationError` (a ``ValueError``) carrying a ``code`` that a plugin turns
into an id of its own (the Django app's system checks).

Numbers are checked without converting first: ``10**400`` or ``nan`` never reach
``float()`` or a driver as an ``OverflowError``.
"""
from __future__ import annotations

import math
import pkgutil
from collections.abc import Iterable, Mapping
from typing import Any

from ylock.errors import ConfigurationError

# Error codes (prefixed by a plugin for its ids); documented in the README's settings reference.
E_SHAPE = "E001"          # a settings section is not a dict, or has unknown keys
E_ENGINE_URL = "E002"     # an engine URL or option is invalid
E_EXTRA = "E003"          # the package an engine or exporter needs is not installed
E_UNKNOWN_ENGINE = "E004"  # a lock names an engine that ENGINES does not define
E_LOCK_OPTION = "E005"    # a lock option has an invalid value
E_IMPORT = "E006"         # a dotted path cannot be imported
E_USER_LOCK = "E010"      # invalid per-user lock settings
E_METRICS = "E011"        # invalid metrics settings
E_RESPONSE = "E012"       # invalid answer settings (status, Retry-After, ON_LOCKED)
E_IDEMPOTENCY = "E013"    # invalid IDEMPOTENCY settings, or a store that cannot keep idempotency records

#: Timeouts at or above this many seconds (about 31 years) wait forever, like None.
FOREVER = 1e9
#: The valid range of a lease, in seconds (10 ms to 7 days).
MIN_LEASE, MAX_LEASE = 0.01, 7 * 86400.0


def fail(where: str, problem: str, code: str, hint: str = "") -> ConfigurationError:
    """Return the error for ``where``: ``"{where} {problem}"`` (raise it)."""
    return ConfigurationError(f"{where} {problem}", code=code, hint=hint)


def section(value: Any, where: str, defaults: Mapping[str, Any], *, code: str = E_SHAPE) -> dict[str, Any]:
    """Return ``defaults`` updated with ``value`` (a dict; None means all defaults); raise if
    ``value`` is not a dict or has a key that ``defaults`` does not."""
    if value is None:
        return dict(defaults)
    if not isinstance(value, Mapping):
        raise fail(where, f"must be a dict, got {value!r}", code)
    unknown = sorted(set(value) - set(defaults), key=str)
    if unknown:
        raise fail(where, f"has unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                   code, f"known keys: {', '.join(sorted(defaults))}")
    return {**defaults, **value}


def mapping(value: Any, where: str, *, code: str = E_SHAPE) -> dict[Any, Any]:
    """Return ``value`` as a dict if it is a mapping (None: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(where, f"must be a dict, got {value!r}", code)
    return dict(value)


def number(value: Any, where: str, *, minimum: float | None = None, maximum: float | None = None,
           above: float | None = None, integer: bool = False, code: str = E_LOCK_OPTION,
           unit: str = "") -> Any:
    """Return ``value`` if it is a finite number (an int if ``integer``) within the bounds
    (``minimum``/``maximum`` inclusive, ``above`` exclusive); raise naming ``where`` otherwise."""
    kind = "a whole number" if integer else "a number"
    if unit:
        kind += f" of {unit}"
    allowed = _range(minimum, maximum, above)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise fail(where, f"must be {kind}{allowed}, got {value!r}", code)
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(where, f"must be a finite {kind[2:]}{allowed}, got {value!r}", code)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum) \
            or (above is not None and value <= above):
        raise fail(where, f"must be {kind}{allowed}, got {_short(value)}", code)
    return value


def seconds(value: Any, where: str, *, minimum: float | None = None, maximum: float | None = None,
            above: float | None = 0.0, code: str = E_LOCK_OPTION) -> float:
    """Return ``value`` as a float number of seconds (positive unless bounds say otherwise)."""
    return float(number(value, where, minimum=minimum, maximum=maximum, above=above, code=code, unit="seconds"))


def timeout(value: Any, where: str = "timeout", *, code: str = E_LOCK_OPTION) -> float | None:
    """Return a timeout in seconds, or None for "wait forever" (None, ``inf`` or anything at
    or above :data:`FOREVER`); raise for a negative number, ``nan`` or a non-number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise fail(where, f"must be None (wait forever) or a number of seconds >= 0, got {value!r}", code)
    if value < 0:
        raise fail(where, f"must not be negative, got {_short(value)}", code)
    if value >= FOREVER:
        return None
    return float(value)


def lease(value: Any, where: str = "lease", *, code: str = E_LOCK_OPTION) -> float:
    """Return a lease in seconds, within [:data:`MIN_LEASE`, :data:`MAX_LEASE`]."""
    return seconds(value, where, minimum=MIN_LEASE, maximum=MAX_LEASE, above=None, code=code)


def boolean(value: Any, where: str, *, code: str = E_LOCK_OPTION) -> bool:
    """Return ``value`` if it is True or False."""
    if not isinstance(value, bool):
        raise fail(where, f"must be True or False, got {value!r}", code)
    return value


def choice(value: Any, where: str, choices: Iterable[Any], *, code: str = E_LOCK_OPTION) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    options = list(choices)
    if value not in options:
        raise fail(where, f"must be one of {', '.join(map(repr, options))}, got {value!r}", code)
    return value


def text(value: Any, where: str, *, code: str = E_LOCK_OPTION, empty: bool = False) -> str:
    """Return ``value`` if it is a str (non-empty unless ``empty``)."""
    if not isinstance(value, str) or not (value or empty):
        raise fail(where, f"must be a {'' if empty else 'non-empty '}string, got {value!r}", code)
    return value


def strings(value: Any, where: str, *, code: str = E_LOCK_OPTION, prefix: str = "") -> list[str]:
    """Return ``value`` as a list if it is a list or tuple of str (each starting with ``prefix``)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) \
            or not all(isinstance(v, str) and v.startswith(prefix) for v in value):
        what = f"strings starting with {prefix!r}" if prefix else "strings"
        raise fail(where, f"must be a list of {what}, got {value!r}", code)
    return list(value)


def importable(value: Any, where: str, *, code: str = E_IMPORT, call: bool = False) -> Any:
    """Return the object that the dotted path ``value`` names (``value`` itself if it is not a
    str); raise if it cannot be imported, or (``call``) is not callable."""
    obj = value
    if isinstance(value, str):
        if "." not in value.strip("."):
            raise fail(where, f"must be a dotted path like 'package.module.name', got {value!r}", code)
        try:
            obj = pkgutil.resolve_name(value)
        except (ImportError, AttributeError, ValueError) as exc:
            raise fail(where, f"= {value!r} cannot be imported: {exc}", code) from exc
    if call and not callable(obj):
        raise fail(where, f"must be callable (or the dotted path of one), got {value!r}", code)
    return obj


def _range(minimum: float | None, maximum: float | None, above: float | None) -> str:
    low = f"> {_short(above)}" if above is not None else f">= {_short(minimum)}" if minimum is not None else ""
    high = f"<= {_short(maximum)}" if maximum is not None else ""
    return f" {low}{' and ' if low and high else ''}{high}" if low or high else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"
