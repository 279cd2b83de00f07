"""Stand-in for ``ylock.registry.Registry`` (engines and named locks from a ``YLOCK``-shaped
dict) until the shared core module is available; same surface: ``engine(alias)``,
``lock(name)``, ``locks(name)``, ``validate()``."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import ylock
from ylock.errors import ConfigurationError

LOCK_KEYS = {"ENGINE": "default", "GROUP": None, "NAME": "global", "FAIR": True, "LEASE": 30.0, "TIMEOUT": None}


class Registry:
    """Named engines (built lazily, one per alias) and named lock options."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.engines_settings = dict(settings.get("ENGINES") or {})
        self.locks_settings = dict(settings.get("LOCKS") or {})
        self._engines: dict[str, ylock.Engine] = {}
        self._mutex = threading.Lock()

    def validate(self) -> None:
        """Raise ConfigurationError naming the first invalid engine or lock setting."""
        for alias, conf in self.engines_settings.items():
            if not isinstance(conf, Mapping) or not ({"URL", "ENGINE"} & set(conf)):
                raise ConfigurationError(f"ENGINES[{alias!r}] must be a dict with 'URL' or 'ENGINE', got {conf!r}")
            if "URL" in conf and "ENGINE" not in conf:
                ylock.urls.engine_class_for_url(conf["URL"])
        for name in self.locks_settings:
            self.lock_options(name)

    def engine(self, alias: str = "default") -> ylock.Engine:
        """Return the engine ``alias`` (built on first use)."""
        engine = self._engines.get(alias)
        if engine is None:
            with self._mutex:
                engine = self._engines.get(alias)
                if engine is None:
                    conf = self.engines_settings.get(alias)
                    if conf is None:
                        known = sorted(self.engines_settings)
                        raise ConfigurationError(f"no engine {alias!r} in ENGINES (known: {known})")
                    options = dict(conf.get("OPTIONS") or {})
                    if "ENGINE" in conf:
                        engine = ylock.engine_from_path(conf["ENGINE"], conf.get("URL"), **options)
                    else:
                        engine = ylock.engine_from_url(conf["URL"], **options)
                    self._engines[alias] = engine
        return engine

    def lock_options(self, name: str) -> dict[str, Any]:
        conf = self.locks_settings.get(name, {})
        if not isinstance(conf, Mapping):
            raise ConfigurationError(f"LOCKS[{name!r}] must be a dict, got {conf!r}")
        unknown = sorted(set(conf) - set(LOCK_KEYS))
        if unknown:
            raise ConfigurationError(f"LOCKS[{name!r}] has unknown keys {unknown}; known: {sorted(LOCK_KEYS)}")
        out = {**LOCK_KEYS, **conf}
        out["GROUP"] = out["GROUP"] or name
        return out

    def lock(self, name: str) -> ylock.Lock:
        """Return the named :class:`ylock.Lock`."""
        o = self.lock_options(name)
        return ylock.Lock(self.engine(o["ENGINE"]), o["GROUP"], o["NAME"], fair=o["FAIR"], lease=o["LEASE"],
                          timeout=o["TIMEOUT"])

    def locks(self, name: str) -> ylock.Locks:
        """Return the named :class:`ylock.Locks` family."""
        o = self.lock_options(name)
        return ylock.Locks(self.engine(o["ENGINE"]), o["GROUP"], fair=o["FAIR"], lease=o["LEASE"],
                           timeout=o["TIMEOUT"])

    def all_engines(self) -> list[ylock.Engine]:
        """Return every engine (building them)."""
        return [self.engine(alias) for alias in self.engines_settings]

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
