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

Each engine is built once per alias per registry (one registry per process and
settings), so a forked worker builds its own; it connects on its own first use. Each
lock's options are validated once and the :class:`~ylock.Lock` / :class:`~ylock.Locks`
built from them are kept: asking for a named lock on every request costs a dict lookup.
A lock name that is not in ``LOCKS`` gets the defaults: its group is its name, on the
``default`` engine.

:meth:`Registry.problems` lists everything wrong with the settings without connecting
anywhere (Django turns each into a system check); :meth:`Registry.validate` raises the
first as :class:`~ylock.ConfigurationError` (Flask's ``init_app`` and Django's
``ready()`` do that, so a bad setting stops the app at startup).
:func:`with_default_engine` is the one rule by which every plugin fills in the
``default`` engine; the plugins only translate their own settings into this dict.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ylock import options as opt
from ylock.engines import engine_class_for_url, engine_from_path, engine_from_url
from ylock.engines.base import Engine
from ylock.errors import ConfigurationError
from ylock.lock import Lock, Locks
from ylock.names import check_group, check_name
from ylock.semaphore import Semaphore, Semaphores
from ylock.waiting import Polling

DEFAULT_ENGINE = "default"
TOP_KEYS = {"ENGINES": None, "LOCKS": None, "METRICS": None}
ENGINE_KEYS = {"URL": None, "ENGINE": None, "OPTIONS": None}
LOCK_DEFAULTS: dict[str, Any] = {"ENGINE": DEFAULT_ENGINE, "GROUP": None, "NAME": "global", "FAIR": True,
                                 "LEASE": 30.0, "TIMEOUT": None, "POLLING": None, "PERMITS": None}
POLLING_KEYS = {"INITIAL": "initial", "MAXIMUM": "maximum", "MULTIPLIER": "multiplier", "JITTER": "jitter"}


@dataclass(frozen=True)
class LockOptions:
    """One named lock's validated options."""

    name: str                 # the name in LOCKS (or the name asked for)
    engine: str               # engine alias
    group: str
    lock_name: str            # NAME: the single lock's name within its group
    fair: bool
    lease: float
    timeout: float | None     # None: wait forever
    timeout_set: bool         # TIMEOUT was given (the web plugins' default applies otherwise)
    polling: Polling | None
    permits: int | None       # PERMITS: the name is also a semaphore with this many permits


class Registry:
    """Engines and named locks from a ``YLOCK``-shaped dict (see module docstring)."""

    def __init__(self, settings: Mapping[str, Any] | None = None, *,
                 where: str | Callable[..., str] = "YLOCK") -> None:
        """``where`` names the settings in errors as the user wrote them: the name of the
        dict (``"YLOCK"``: ``YLOCK['LOCKS']['orders']``), or a function of a setting's path
        (``where("LOCKS", "orders")``; ``where()`` is the whole dict) for a framework whose
        settings are not one dict (Flask's ``YLOCK_LOCKS``)."""
        self.where = where
        settings = settings or {}
        if not isinstance(settings, Mapping):
            raise ConfigurationError(f"{self.setting()} must be a dict, got {type(settings).__name__}")
        self.settings = settings
        engines = settings.get("ENGINES") or {}
        self.engines_settings: dict[str, Any] = dict(engines) if isinstance(engines, Mapping) else {}
        locks = settings.get("LOCKS") or {}
        self.locks_settings: dict[str, Any] = dict(locks) if isinstance(locks, Mapping) else {}
        self._engines: dict[str, Engine] = {}
        self._options: dict[str, LockOptions] = {}
        self._locks: dict[str, Lock] = {}
        self._families: dict[str, Locks] = {}
        self._sem_families: dict[tuple[str, int | None], Semaphores] = {}
        self._mutex = threading.RLock()

    def setting(self, *path: str) -> str:
        """How the user wrote the setting at ``path`` (``("LOCKS", "orders", "LEASE")``)."""
        if callable(self.where):
            return self.where(*path)
        return self.where + "".join(f"[{part!r}]" for part in path)

    # -- validation -------------------------------------------------------------------

    def problems(self, *, known: Mapping[str, Any] = TOP_KEYS) -> list[ConfigurationError]:
        """Return every problem in the settings (``known``: the top-level keys the caller
        reads). Nothing connects; engine modules are imported and engines built (cached)."""
        found: list[ConfigurationError] = []
        s = self.settings
        for check in (lambda: opt.section(s, self.setting(), known),
                      lambda: opt.mapping(s.get("ENGINES"), self.setting("ENGINES")),
                      lambda: opt.mapping(s.get("LOCKS"), self.setting("LOCKS"))):
            try:
                check()
            except ConfigurationError as exc:
                found.append(exc)
        for alias in self.engines_settings:
            try:
                self.engine(alias)
            except ConfigurationError as exc:
                found.append(exc)
        for name in self.locks_settings:
            try:
                self.lock_options(name)
            except ConfigurationError as exc:
                found.append(exc)
        return found

    def validate(self, *, known: Mapping[str, Any] = TOP_KEYS) -> None:
        """Raise :class:`ConfigurationError` for the first problem in the settings."""
        problems = self.problems(known=known)
        if problems:
            raise problems[0]

    # -- engines ------------------------------------------------------------------------

    def engine(self, alias: str = DEFAULT_ENGINE) -> Engine:
        """Return engine ``alias``, built (and its options checked) on first use; it
        connects on its own first use."""
        engine = self._engines.get(alias)
        if engine is None:
            with self._mutex:
                engine = self._engines.get(alias)
                if engine is None:
                    engine = self._engines[alias] = self._build(alias)
        return engine

    def _build(self, alias: str) -> Engine:
        where = self.setting("ENGINES", alias)
        conf = self.engines_settings.get(alias)
        if conf is None:
            raise ConfigurationError(f"no engine {alias!r} in ENGINES", code=opt.E_UNKNOWN_ENGINE,
                                     hint=f"defined: {', '.join(map(repr, self.engines_settings)) or 'none'}")
        if not isinstance(conf, Mapping) or not ({"URL", "ENGINE"} & set(conf)):
            raise opt.fail(where, f"must be a dict with 'URL' or 'ENGINE', got {conf!r}", opt.E_SHAPE,
                           "e.g. {'URL': 'redis://127.0.0.1:6379/0'}")
        conf = opt.section(conf, where, ENGINE_KEYS)
        options = opt.mapping(conf["OPTIONS"], f"{where}['OPTIONS']")
        try:
            if conf["ENGINE"] is not None:
                engine = engine_from_path(conf["ENGINE"], conf["URL"], **options)
            else:
                engine_class_for_url(conf["URL"])
                engine = engine_from_url(conf["URL"], **options)
            engine.check_options()
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc.problem}", code=exc.code, hint=exc.hint) from exc
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{where}: {exc}", code=opt.E_ENGINE_URL) from exc
        return engine

    def aliases(self) -> list[str]:
        """Return the engine aliases, in settings order."""
        return list(self.engines_settings)

    def close_all(self) -> None:
        """Close every engine built so far."""
        for engine in list(self._engines.values()):
            engine.close()

    # -- named locks ---------------------------------------------------------------------

    def lock_options(self, name: str) -> LockOptions:
        """Return the validated options of lock ``name`` (defaults if it is not in LOCKS);
        validated once, then cached."""
        found = self._options.get(name)
        if found is None:
            found = self._options[name] = self._lock_options(name)
        return found

    def _lock_options(self, name: str) -> LockOptions:
        where = self.setting("LOCKS", name)
        try:
            check_name(name)
        except ValueError as exc:
            raise ConfigurationError(f"lock name {name!r} is invalid: {exc}", code=opt.E_LOCK_OPTION) from exc
        raw = self.locks_settings.get(name, {})
        conf = opt.section(raw, where, LOCK_DEFAULTS, code=opt.E_LOCK_OPTION)
        if conf["ENGINE"] not in self.engines_settings:
            raise ConfigurationError(f"{where} names no engine {conf['ENGINE']!r} in {self.setting('ENGINES')}",
                                     code=opt.E_UNKNOWN_ENGINE,
                                     hint=f"defined: {', '.join(map(repr, self.engines_settings)) or 'none'}")
        group = conf["GROUP"] or name
        for key, check in (("GROUP", check_group), ("NAME", check_name)):
            try:
                check(conf[key] if key == "NAME" else group)
            except ValueError as exc:
                raise opt.fail(f"{where}['{key}']", f"is invalid: {exc}", opt.E_LOCK_OPTION) from exc
        return LockOptions(
            name=name, engine=conf["ENGINE"], group=group, lock_name=conf["NAME"],
            fair=opt.boolean(conf["FAIR"], f"{where}['FAIR']"),
            lease=opt.lease(conf["LEASE"], f"{where}['LEASE']"),
            timeout=opt.timeout(conf["TIMEOUT"], f"{where}['TIMEOUT']"),
            timeout_set=isinstance(raw, Mapping) and "TIMEOUT" in raw,
            polling=polling(conf["POLLING"], f"{where}['POLLING']"),
            permits=None if conf["PERMITS"] is None else opt.number(
                conf["PERMITS"], f"{where}['PERMITS']", minimum=1, maximum=1_000_000, integer=True))

    def lock(self, name: str) -> Lock:
        """Return the named :class:`~ylock.Lock` (built once)."""
        lock = self._locks.get(name)
        if lock is None:
            o = self.lock_options(name)
            lock = self._locks[name] = Lock(self.engine(o.engine), o.group, o.lock_name, fair=o.fair,
                                            lease=o.lease, timeout=o.timeout, polling=o.polling)
        return lock

    def locks(self, name: str) -> Locks:
        """Return the named :class:`~ylock.Locks` family (its group is the lock's GROUP; built once)."""
        family = self._families.get(name)
        if family is None:
            o = self.lock_options(name)
            family = self._families[name] = Locks(self.engine(o.engine), o.group, fair=o.fair, lease=o.lease,
                                                  timeout=o.timeout, polling=o.polling)
        return family


    def semaphore(self, name: str, permits: int | None = None) -> Semaphore:
        """Return the named :class:`~ylock.Semaphore` (``permits``, else the PERMITS setting)."""
        o = self.lock_options(name)
        return Semaphore(self.engine(o.engine), o.group, o.lock_name, permits=self._permits(o, permits),
                         fair=o.fair, lease=o.lease, timeout=o.timeout, polling=o.polling)

    def semaphores(self, name: str, permits: int | None = None) -> Semaphores:
        """Return the named :class:`~ylock.Semaphores` family (one semaphore per key)."""
        key = (name, permits)
        family = self._sem_families.get(key)
        if family is None:
            o = self.lock_options(name)
            family = self._sem_families[key] = Semaphores(self.engine(o.engine), o.group,
                                                          permits=self._permits(o, permits), fair=o.fair,
                                                          lease=o.lease, timeout=o.timeout, polling=o.polling)
        return family

    def _permits(self, o: LockOptions, permits: int | None) -> int:
        if permits is None:
            permits = o.permits
        if permits is None:
            raise ConfigurationError(f"{self.setting('LOCKS', o.name)} needs PERMITS to be used as a semaphore "
                                     "(or give permits= where it is used)", code=opt.E_LOCK_OPTION)
        return permits


def with_default_engine(engines: Any, url: str | None, fallback: Callable[[], str]) -> Any:
    """Return the ENGINES setting ``engines`` with its ``default`` engine filled in, the one
    rule of every plugin: no engines at all (None or empty) make ``default`` the engine at
    ``url`` (the plugin's URL setting or ``$YLOCK_URL``), else at ``fallback()`` (an
    embedded server; a plugin without one raises its ConfigurationError there); engines
    without a ``default`` get ``url`` as theirs when it is given. Anything that is not a
    mapping comes back as it is, for :meth:`Registry.problems` to name."""
    if not engines:
        return {DEFAULT_ENGINE: {"URL": url or fallback()}}
    if isinstance(engines, Mapping) and DEFAULT_ENGINE not in engines and url:
        return {DEFAULT_ENGINE: {"URL": url}, **engines}
    return engines


def polling(value: Any, where: str) -> Polling | None:
    """Return the :class:`~ylock.Polling` that a POLLING setting describes (None: the default)."""
    if value is None or isinstance(value, Polling):
        return value
    conf = opt.section(value, where, {**dict.fromkeys(POLLING_KEYS), "CONSTANT": None}, code=opt.E_LOCK_OPTION)
    given = {k: v for k, v in conf.items() if v is not None}
    for key, number in given.items():
        opt.number(number, f"{where}[{key!r}]", minimum=0)
    try:
        if "CONSTANT" in given:
            return Polling.constant(given["CONSTANT"])
        return Polling(**{POLLING_KEYS[k]: v for k, v in given.items()})
    except ValueError as exc:
        raise opt.fail(where, f"is invalid: {exc}", opt.E_LOCK_OPTION) from exc
