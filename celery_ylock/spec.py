"""What a locked task asks for: its ``lock`` option, validated once when the task is registered
(:class:`LockSpec`), the busy outcomes (:class:`TaskLocked`, the :func:`skipped` marker)."""
from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ylock
from celery_ylock import conf
from ylock import options as opt
from ylock.engines.base import READ, WRITE
from ylock.errors import LockTimeout
from ylock.lock import Lock
from ylock.names import check_name, name_for
from ylock.registry import Registry

__all__ = ["LockSpec", "TaskLocked", "parameters", "skipped", "skipped_value", "ON_BUSY", "SCOPES"]

RUN, ENQUEUE = "run", "enqueue"
SCOPES = (RUN, ENQUEUE)
SKIP, RETRY, WAIT, RAISE = "skip", "retry", "wait", "raise"
ON_BUSY = (SKIP, RETRY, WAIT, RAISE)
#: Seconds ``on_busy="wait"`` waits when neither the task nor the lock's TIMEOUT setting says.
DEFAULT_WAIT = 10.0
#: Seconds before a task retried by ``on_busy="retry"`` runs again, unless ``countdown`` says.
DEFAULT_COUNTDOWN = 5.0
#: The keys of a task's ``lock`` option, with their defaults.
SPEC_KEYS: dict[str, Any] = {"name": None, "key": None, "mode": WRITE, "on_busy": None, "scope": RUN,
                             "timeout": ylock.DEFAULT, "countdown": DEFAULT_COUNTDOWN, "max_retries": None,
                             "queue_lease": None}


class TaskLocked(LockTimeout):
    """A locked task's lock was busy: raised by ``delay()``/``apply_async()`` for
    ``scope="enqueue"``, or by the task run (its result's exception) for ``scope="run"``."""


# -- the marker of a skipped task ------------------------------------------------------------


def skipped_value(task: str, lock: str, scope: str) -> dict[str, Any]:
    """The result of a task that did not run because its lock was busy (JSON-ready)."""
    return {"ylock": "skipped", "task": task, "lock": lock, "scope": scope,
            "detail": f"{task} did not run: lock {lock} was busy (on_busy='skip', scope={scope!r})"}


def skipped(value: Any) -> bool:
    """Return True if ``value`` (a task's result, e.g. ``result.get()``) says the task was
    skipped because its lock was busy."""
    return isinstance(value, Mapping) and value.get("ylock") == "skipped"


# -- what a task asks for ----------------------------------------------------------------------


@dataclass(frozen=True)
class LockSpec:
    """A task's validated ``lock`` option (checked once, when the task is registered)."""

    task: str                               # the task's name, for messages
    name: str                               # the named lock (LOCKS) or family
    key: str | Callable[..., object] | None
    mode: str
    on_busy: str
    scope: str
    timeout: Any                            # seconds, None (forever) or ylock.DEFAULT (the lock's TIMEOUT)
    countdown: float
    max_retries: int | None
    queue_lease: float | None               # None: the broker's visibility timeout, else DEFAULT_QUEUE_LEASE
    signature: inspect.Signature            # the task's parameters (without self), for keys

    @classmethod
    def parse(cls, value: Any, task: str, signature: inspect.Signature) -> LockSpec | None:
        """Validate a task's ``lock`` option (None: the task takes no lock); raise
        :class:`~ylock.ConfigurationError` naming the bad key."""
        if value is None:
            return None
        where = f"task {task!r}: lock"
        if isinstance(value, str):
            value = {"name": value}
        conf_ = opt.section(value, where, SPEC_KEYS, code=opt.E_LOCK_OPTION)
        name = opt.text(conf_["name"], f"{where}['name']")
        try:
            check_name(name)
        except ValueError as exc:
            raise opt.fail(f"{where}['name']", f"{name!r} is not a valid lock name: {exc}", opt.E_LOCK_OPTION) \
                from exc
        scope = opt.choice(conf_["scope"], f"{where}['scope']", SCOPES)
        on_busy = opt.choice(conf_["on_busy"] or (RETRY if scope == RUN else RAISE), f"{where}['on_busy']", ON_BUSY)
        if scope == ENQUEUE and on_busy == RETRY:
            raise opt.fail(f"{where}['on_busy']", "= 'retry' needs scope='run': at enqueue time no task runs yet "
                           "that could be retried", opt.E_LOCK_OPTION, "use 'raise', 'skip' or 'wait'")
        key = conf_["key"]
        if not (key is None or isinstance(key, str) or callable(key)):
            raise opt.fail(f"{where}['key']", f"must be a format string over the task's arguments (e.g. "
                           f"'{{user_id}}'), a callable or None, got {key!r}", opt.E_LOCK_OPTION)
        if isinstance(key, str):
            _check_key(key, signature, f"{where}['key']")
        timeout = conf_["timeout"]
        if timeout is not ylock.DEFAULT:
            timeout = opt.timeout(timeout, f"{where}['timeout']")
        max_retries = conf_["max_retries"]
        if max_retries is not None:
            max_retries = opt.number(max_retries, f"{where}['max_retries']", minimum=0, integer=True)
        queue_lease = conf_["queue_lease"]
        if queue_lease is not None:
            queue_lease = opt.lease(queue_lease, f"{where}['queue_lease']")
        return cls(task=task, name=name, key=key, mode=opt.choice(conf_["mode"], f"{where}['mode']", (WRITE, READ)),
                   on_busy=on_busy, scope=scope, timeout=timeout,
                   countdown=opt.seconds(conf_["countdown"], f"{where}['countdown']", minimum=0, above=None),
                   max_retries=max_retries, queue_lease=queue_lease, signature=signature)

    # -- per call ----------------------------------------------------------------------------

    def arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The task's arguments by name (defaults filled in; ``**kwargs`` flattened)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            else:
                values[name] = value
        return values

    def target(self, registry: Registry, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Lock | None:
        """The lock that a call with these arguments holds (None: no lock for it)."""
        if self.key is None:
            return registry.lock(self.name)
        if callable(self.key):
            value = self.key(*args, **kwargs)
            if value is None:
                return None
        else:
            value = self.key.format_map(self.arguments(args, kwargs))
        return registry.locks(self.name)[name_for(value)]

    def wait_for(self, registry: Registry) -> float | None:
        """How long ``on_busy="wait"`` waits: ``timeout``, else the lock's TIMEOUT, else DEFAULT_WAIT."""
        if self.timeout is not ylock.DEFAULT:
            return self.timeout  # type: ignore[no-any-return]
        options = registry.lock_options(self.name)
        return options.timeout if options.timeout_set else DEFAULT_WAIT

    def queue_lease_for(self, app: Any) -> float:
        """How long an enqueue-scope lock lasts in the queue (before any countdown or ETA)."""
        if self.queue_lease is not None:
            return self.queue_lease
        return conf.visibility_timeout(app) or conf.DEFAULT_QUEUE_LEASE

    # -- against the settings (at worker startup and on first use) ----------------------------

    def check(self, task: Any, registry: Registry) -> None:
        """Raise :class:`~ylock.ConfigurationError` if this lock contradicts the settings,
        the engine or the broker (see docs/celery.md, "Startup checks")."""
        where = f"task {self.task!r}: lock"
        options = registry.lock_options(self.name)
        engine = registry.engine(options.engine)
        app = task.app
        if engine.scheme == "local" and not app.conf.get("task_always_eager"):
            raise opt.fail(where, f"uses the local:// engine {options.engine!r}: it excludes threads of one "
                           "process, and Celery runs tasks in other processes", opt.E_LOCK_OPTION,
                           "point the engine at Redis or ZooKeeper (app.conf.ylock_url)")
        if self.scope == ENQUEUE and not engine.adopts_across_processes:
            raise opt.fail(f"{where}['scope']", f"= 'enqueue' needs an engine whose holds can move to another "
                           f"process; {type(engine).__name__} ({options.engine!r}) cannot", opt.E_LOCK_OPTION,
                           "use a Redis engine for this lock, or scope='run'")
        visibility = conf.visibility_timeout(app)
        if visibility is None:
            return
        vt = f"the broker's visibility_timeout ({visibility:g} s)"
        if self.on_busy == RETRY and self.countdown >= visibility:
            raise opt.fail(f"{where}['countdown']", f"({self.countdown:g} s) must be shorter than {vt}: a retried "
                           "message waits for its countdown unacknowledged in a worker, and the broker delivers "
                           "it again after the visibility timeout", opt.E_LOCK_OPTION)
        acks_late = bool(getattr(task, "acks_late", False))
        if acks_late and self.on_busy != RETRY and options.lease >= visibility:
            raise opt.fail(f"task {self.task!r}: LOCKS[{self.name!r}]['LEASE']", f"({options.lease:g} s) must be "
                           f"shorter than {vt} for an acks_late task "
                           f"with on_busy={self.on_busy!r}: the broker delivers the task again once a worker dies "
                           "running it, and the dead worker's lock would still be held then, so the new delivery "
                           "would find it busy", opt.E_LOCK_OPTION,
                           f"shorten LOCKS[{self.name!r}]['LEASE'] or raise visibility_timeout")
        if acks_late and self.on_busy == WAIT:
            wait = self.wait_for(registry)
            if wait is None or wait >= visibility:
                raise opt.fail(f"{where}['timeout']", f"({'forever' if wait is None else f'{wait:g} s'}) must be "
                               f"shorter than {vt} for an acks_late task: a task still waiting for its lock then "
                               "is delivered again to another worker", opt.E_LOCK_OPTION)
        if self.scope == ENQUEUE and self.queue_lease_for(app) < visibility:
            raise opt.fail(f"{where}['queue_lease']", f"({self.queue_lease_for(app):g} s) must not be shorter "
                           f"than {vt}: a message taken by a worker that dies before starting it comes back only "
                           "after the visibility timeout, and its lock must still be there to keep duplicates "
                           "out meanwhile", opt.E_LOCK_OPTION, "leave queue_lease unset to follow the broker")


def _check_key(key: str, signature: inspect.Signature, where: str) -> None:
    """Raise unless every field of the format string ``key`` names a parameter of the task."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(key) if field is not None]
    except ValueError as exc:
        raise opt.fail(where, f"= {key!r} is not a valid format string: {exc}", opt.E_LOCK_OPTION) from exc
    params = signature.parameters
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for field in fields:
        head = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not head or head.isdigit():
            raise opt.fail(where, f"= {key!r} must name the task's arguments ('{{user_id}}'), not positions",
                           opt.E_LOCK_OPTION)
        if head not in params and not open_kwargs:
            raise opt.fail(where, f"= {key!r} names {head!r}, which is not an argument of the task",
                           opt.E_LOCK_OPTION, f"its arguments: {', '.join(named) or 'none'}")


def parameters(cls: type) -> inspect.Signature:
    """The parameters of the task's ``run`` as callers pass them (without ``self``)."""
    run = inspect.getattr_static(cls, "run")
    func = run.__func__ if isinstance(run, (staticmethod, classmethod)) else run
    signature = inspect.signature(func)
    if not isinstance(run, staticmethod):     # bind=True, or a class-based task: drop self
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature
