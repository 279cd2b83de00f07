"""Named engines and named locks from one settings dict, shared by the Django and Flask
plugins (the way Django's ``caches`` turns ``CACHES`` into backends).

The dict has the shape of Django's ``YLOCK`` setting::

    {
        "ENGINES": {"default": {"URL": "redis://127.0.0.1:6379/0", "OPTIONS": {...}},
                    "strict": {"ENGINE": "ylock.engines.zookeeper.ZooKeeperEngine",
                               "URL": "zookeeper://z1:2181/locks"}},
        "LOCKS": {"orders": {"ENGINE": "default", "GROUP": "orders", "NAME": "global",
                             "FAIR": True, "LEASE": 30, "TIMEOUT": 5,
                             "POLLING": {"INITIAL": 0.05, "MAXIMUM": 0.5, "JITTER": 0.2}}},
        "METRICS": {...},   # read by ylock.metrics, not here
    }

Engines are built lazily, once per alias per registry (one registry per process and
settings), so a forked worker builds its own. A lock name that is not in ``LOCKS`` gets
the defaults: its group is its name, on the ``default`` engine.

:meth:`Registry.problems` lists everything wrong with the settings without connecting
anywhere (Django turns each into a system check); :meth:`Registry.validate` raises the
first as :class:`~ylock.ConfigurationError` (Flask does that in ``init_app``).
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ylock.engines.base import Engine
from ylock.errors import ConfigurationError
from ylock.keys import check_group, check_name
from ylock.lock import Lock, Locks
from ylock.urls import engine_class_for_url, engine_from_path, engine_from_url
from ylock.waiting import Polling

DEFAULT_ENGINE = "default"
TOP_KEYS = {"ENGINES", "LOCKS", "METRICS", "DEFAULT_URL"}
ENGINE_KEYS = {"URL", "ENGINE", "OPTIONS"}
LOCK_DEFAULTS: dict[str, Any] = {"ENGINE": DEFAULT_ENGINE, "GROUP": None, "NAME": "global", "FAIR": True,
                                 "LEASE": 30.0, "TIMEOUT": None, "POLLING": None}
POLLING_KEYS = {"INITIAL": "initial", "MAXIMUM": "maximum", "MULTIPLIER": "multiplier", "JITTER": "jitter"}
# Kept for the Flask stand-in that predates this module.
LOCK_KEYS = LOCK_DEFAULTS


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings: a stable id, what and where, and how to fix it."""

    id: str          # "E001"... (Django prefixes "django_ylock.")
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


# Stable ids (documented in the README's settings reference).
E_SHAPE = "E001"          # YLOCK / ENGINES / LOCKS is not a dict, or has unknown keys
E_ENGINE_URL = "E002"     # an engine URL is unparseable or its scheme unknown
E_EXTRA = "E003"          # the package an engine needs is not installed
E_UNKNOWN_ENGINE = "E004"  # a lock names an engine that ENGINES does not define
E_LOCK_OPTION = "E005"    # a lock option has an invalid value
E_ENGINE_PATH = "E006"    # an ENGINE dotted path cannot be imported


class Registry:
    """Engines and named locks from a ``YLOCK``-shaped dict (see module docstring)."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        settings = settings or {}
        if not isinstance(settings, Mapping):
            raise ConfigurationError(f"ylock settings must be a dict, got {type(settings).__name__}")
        self.settings = settings
        engines = settings.get("ENGINES") or {}
        self.engines_settings: dict[str, Any] = dict(engines) if isinstance(engines, Mapping) else {}
        if not self.engines_settings and settings.get("DEFAULT_URL"):
            self.engines_settings = {DEFAULT_ENGINE: {"URL": settings["DEFAULT_URL"]}}
        locks = settings.get("LOCKS") or {}
        self.locks_settings: dict[str, Any] = dict(locks) if isinstance(locks, Mapping) else {}
        self._engines: dict[str, Engine] = {}
        self._mutex = threading.Lock()

    # -- validation -------------------------------------------------------------------

    def problems(self) -> list[Problem]:
        """Return every problem in the settings (nothing is imported but engine modules,
        nothing connects)."""
        found: list[Problem] = []
        s = self.settings
        unknown = sorted(set(s) - TOP_KEYS)
        if unknown:
            found.append(Problem(E_SHAPE, f"unknown ylock setting key(s) {unknown}",
                                 f"known keys: {sorted(TOP_KEYS)}"))
        for key in ("ENGINES", "LOCKS"):
            if s.get(key) is not None and not isinstance(s.get(key), Mapping):
                found.append(Problem(E_SHAPE, f"ylock setting {key} must be a dict, got {type(s[key]).__name__}"))
        for alias, conf in self.engines_settings.items():
            found.extend(self._engine_problems(alias, conf))
        for name, conf in self.locks_settings.items():
            found.extend(self._lock_problems(name, conf))
        return found

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` for the first problem in the settings."""
        problems = self.problems()
        if problems:
            raise ConfigurationError(str(problems[0]))

    def _engine_problems(self, alias: str, conf: Any) -> list[Problem]:
        where = f"ENGINES[{alias!r}]"
        if not isinstance(conf, Mapping) or not ({"URL", "ENGINE"} & set(conf)):
            return [Problem(E_SHAPE, f"{where} must be a dict with 'URL' or 'ENGINE', got {conf!r}",
                            "e.g. {'URL': 'redis://127.0.0.1:6379/0'}")]
        unknown = sorted(set(conf) - ENGINE_KEYS)
        if unknown:
            return [Problem(E_SHAPE, f"{where} has unknown keys {unknown}", f"known keys: {sorted(ENGINE_KEYS)}")]
        if conf.get("OPTIONS") is not None and not isinstance(conf["OPTIONS"], Mapping):
            return [Problem(E_SHAPE, f"{where}['OPTIONS'] must be a dict")]
        if "ENGINE" in conf:
            path = conf["ENGINE"]
            module, _, attr = str(path).rpartition(".")
            try:
                import importlib

                getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError, ValueError) as exc:
                return [Problem(E_ENGINE_PATH, f"{where}['ENGINE'] = {path!r} cannot be imported: {exc}",
                                "give the dotted path of an Engine class, e.g. 'ylock.engines.redis.RedisEngine'")]
            return []
        url = conf["URL"]
        try:
            engine_class_for_url(url)
        except ConfigurationError as exc:
            ident = E_EXTRA if "extra" in str(exc) else E_ENGINE_URL
            hint = "install the extra named above" if ident == E_EXTRA else \
                "e.g. redis://host:6379/0, zookeeper://host:2181/chroot, local://"
            return [Problem(ident, f"{where}['URL']: {exc}", hint)]
        try:
            self._build(alias, conf).check_options()   # parses the URL and options; does not connect
        except (ConfigurationError, ValueError, TypeError) as exc:
            return [Problem(E_ENGINE_URL, f"{where}: {exc}")]
        return []

    def _lock_problems(self, name: str, conf: Any) -> list[Problem]:
        try:
            self.lock_options(name)
        except ConfigurationError as exc:
            ident = E_UNKNOWN_ENGINE if "no engine" in str(exc) else E_LOCK_OPTION
            return [Problem(ident, str(exc), f"engines defined: {sorted(self.engines_settings)}"
                            if ident == E_UNKNOWN_ENGINE else "")]
        return []

    # -- engines ------------------------------------------------------------------------

    def _build(self, alias: str, conf: Mapping[str, Any]) -> Engine:
        options = dict(conf.get("OPTIONS") or {})
        if "ENGINE" in conf:
            return engine_from_path(conf["ENGINE"], conf.get("URL"), **options)
        return engine_from_url(conf["URL"], **options)

    def engine(self, alias: str = DEFAULT_ENGINE) -> Engine:
        """Return engine ``alias``, built on first use (it connects on its own first use)."""
        engine = self._engines.get(alias)
        if engine is None:
            with self._mutex:
                engine = self._engines.get(alias)
                if engine is None:
                    conf = self.engines_settings.get(alias)
                    if conf is None:
                        raise ConfigurationError(f"no engine {alias!r} in ENGINES "
                                                 f"(defined: {sorted(self.engines_settings)})")
                    problems = self._engine_problems(alias, conf)
                    if problems:
                        raise ConfigurationError(str(problems[0]))
                    engine = self._engines[alias] = self._build(alias, conf)
        return engine

    def aliases(self) -> list[str]:
        """Return the engine aliases, in settings order."""
        return list(self.engines_settings)

    def all_engines(self) -> list[Engine]:
        """Return every configured engine (building those not built yet)."""
        return [self.engine(alias) for alias in self.engines_settings]

    def close_all(self) -> None:
        """Close every engine built so far."""
        for engine in list(self._engines.values()):
            engine.close()

    close = close_all

    # -- named locks ---------------------------------------------------------------------

    def lock_options(self, name: str) -> dict[str, Any]:
        """Return the validated options of lock ``name`` (defaults if it is not in LOCKS)."""
        check_name(name)
        conf = self.locks_settings.get(name, {})
        where = f"LOCKS[{name!r}]"
        if not isinstance(conf, Mapping):
            raise ConfigurationError(f"{where} must be a dict, got {conf!r}")
        unknown = sorted(set(conf) - set(LOCK_DEFAULTS))
        if unknown:
            raise ConfigurationError(f"{where} has unknown keys {unknown}; known: {sorted(LOCK_DEFAULTS)}")
        out = {**LOCK_DEFAULTS, **conf}
        out["GROUP"] = out["GROUP"] or name
        if out["ENGINE"] not in self.engines_settings:
            raise ConfigurationError(f"{where} names no engine {out['ENGINE']!r} in ENGINES")
        try:
            check_group(out["GROUP"])
            check_name(out["NAME"])
            out["POLLING"] = _polling(out["POLLING"])
            # Build a throwaway lock on a dummy engine to validate FAIR, LEASE and TIMEOUT.
            Lock(_VALIDATOR, out["GROUP"], out["NAME"], fair=out["FAIR"], lease=out["LEASE"],
                 timeout=out["TIMEOUT"], polling=out["POLLING"])
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {exc}") from exc
        return out

    def lock(self, name: str) -> Lock:
        """Return the named :class:`~ylock.Lock`."""
        o = self.lock_options(name)
        return Lock(self.engine(o["ENGINE"]), o["GROUP"], o["NAME"], fair=o["FAIR"], lease=o["LEASE"],
                    timeout=o["TIMEOUT"], polling=o["POLLING"])

    def locks(self, name: str) -> Locks:
        """Return the named :class:`~ylock.Locks` family (its group is the lock's GROUP)."""
        o = self.lock_options(name)
        return Locks(self.engine(o["ENGINE"]), o["GROUP"], fair=o["FAIR"], lease=o["LEASE"],
                     timeout=o["TIMEOUT"], polling=o["POLLING"])


def _polling(value: Any) -> Polling | None:
    if value is None or isinstance(value, Polling):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"POLLING must be a dict like {{'INITIAL': 0.05, 'MAXIMUM': 0.5}}, got {value!r}")
    unknown = sorted(set(value) - set(POLLING_KEYS) - {"CONSTANT"})
    if unknown:
        raise ValueError(f"POLLING has unknown keys {unknown}; known: {sorted(POLLING_KEYS) + ['CONSTANT']}")
    try:
        if "CONSTANT" in value:
            return Polling.constant(value["CONSTANT"])
        return Polling(**{POLLING_KEYS[k]: v for k, v in value.items()})
    except TypeError as exc:
        raise ValueError(f"POLLING values must be numbers: {exc}") from exc


class _Validator(Engine):
    """Never used for locking: lets the registry validate lock options without an engine."""

    scheme = "validator"

    def acquire(self, request: Any) -> int | None:
        raise NotImplementedError

    def release(self, group: str, name: str, owner: str, mode: str) -> bool:
        raise NotImplementedError

    def renew(self, items: Any) -> list[bool | None]:
        raise NotImplementedError

    def describe(self, group: str | None = None) -> list[Any]:
        return []

    def force_release(self, group: str, name: str) -> bool:
        return False


_VALIDATOR = _Validator()
