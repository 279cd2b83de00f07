"""``LockedTask``: a Celery task that holds a ylock lock, per run or from the moment it is sent.

    @app.task(base=LockedTask, lock={"name": "reports", "key": "{user_id}", "on_busy": "skip"})
    def build_report(user_id): ...

**Which lock.** ``name`` is a named lock of the settings (``LOCKS``; a name not listed gets
the defaults, its group being its name). Without ``key`` the task holds that one lock;
with ``key`` it holds one lock of the ``name`` family per key: a format string over the
task's arguments as they are bound to its signature (``"{user_id}"``,
``"{order.id}-{day}"``), or a callable taking the task's arguments and returning the key
(None: no lock for that call). Keys are escaped into valid lock names
(:func:`ylock.names.name_for`), so any value is safe.

**When.** ``scope="run"`` takes the lock when a worker starts the task and releases it
when the run ends (returns, raises, retries). ``scope="enqueue"`` takes it in
``delay()``/``apply_async()``: a second task for the same key is refused while one is
queued or running. The sender detaches its hold into a :class:`ylock.lock.Ticket` that
travels in the message's headers; the worker that starts the task adopts it (same fencing
token) and releases it when the run ends; a task revoked or expired before it ran has its
lock released by the worker that drops it (``task_revoked``); a send that fails releases
it at once. A ticket lasts ``queue_lease`` seconds in the queue (nobody renews it there);
from adoption on, the worker's watchdog renews it with the lock's ``LEASE`` however long
the task runs, so a worker killed with SIGKILL frees it within ``LEASE``. A task that
starts after its ticket is gone (it waited longer than ``queue_lease``, it was sent by
``send_task()`` or ``celery beat`` without this module, or its message was delivered
twice) takes the lock afresh, as ``scope="run"`` would, and applies ``on_busy``.

**When it is busy** (``on_busy``): ``"skip"`` (the task does not run: a warning is
logged, :data:`celery_ylock.signals.task_skipped` is sent, and its result is the
:func:`skipped` marker), ``"retry"`` (``self.retry(countdown=countdown)`` up to
``max_retries``, then the task fails with :class:`TaskLocked`; scope "run" only),
``"wait"`` (up to ``timeout`` seconds, then :class:`TaskLocked`), ``"raise"``
(:class:`TaskLocked` at once). At enqueue time they act in the sender: ``"raise"`` makes
``delay()`` raise, ``"skip"`` makes it return a result whose value is the marker,
``"wait"`` makes it wait. Defaults: ``"retry"`` for scope "run", ``"raise"`` for "enqueue".

**In the task body**, ``self.request.ylock`` (``bind=True``) is the run's
:class:`TaskHold`: its ``token`` (the fencing token: pass it to the storage you write),
``lost`` (True once the lease could not be renewed: another worker may hold the lock) and
``check()``, which raises :class:`ylock.LockLost` then: call it between steps to stop
work that is no longer protected.

The run's owner is the run itself (an owner scope), not its thread: a gevent, eventlet or
threads pool running several tasks in one thread does not let them re-enter each other's
locks.

**What it is doing.** The task's lock, and every lock the task body takes, says so
(:func:`ylock.context`, shown by ``engine.describe()``, ``ylock list`` and the admin page):
``"celery task <name>"`` with ``task_id``. An enqueue-scope lock says it from the moment
it is sent (the task id is chosen then), and keeps saying it once a worker adopts it.
"""
from __future__ import annotations

import datetime
import inspect
import logging
import re
import string
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from celery import Task, states
from celery.result import EagerResult
from celery.utils import uuid

import ylock
from celery_ylock import checks, conf, signals
from ylock import events
from ylock import options as opt
from ylock.engines.base import READ, WRITE, Engine, RenewItem
from ylock.errors import ConfigurationError, EngineUnavailable, LockError, LockLost, LockTimeout
from ylock.lock import Lock, Ticket
from ylock.names import check_name, name_for
from ylock.owner import owner_scope, run_as
from ylock.registry import Registry

logger = logging.getLogger(__name__)

#: The message header that carries an enqueue-scope task's ticket to its worker.
TICKET_HEADER = "ylock_ticket"
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

    def check(self, task: Task, registry: Registry) -> None:
        """Raise :class:`~ylock.ConfigurationError` if this lock contradicts the settings,
        the engine or the broker (see docs/celery.md, "Startup checks")."""
        where = f"task {self.task!r}: lock"
        options = registry.lock_options(self.name)
        engine = registry.engine(options.engine)
        app = task._get_app()
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


def _parameters(cls: type) -> inspect.Signature:
    """The parameters of the task's ``run`` as callers pass them (without ``self``)."""
    run = inspect.getattr_static(cls, "run")
    func = run.__func__ if isinstance(run, (staticmethod, classmethod)) else run
    signature = inspect.signature(func)
    if not isinstance(run, staticmethod):     # bind=True, or a class-based task: drop self
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


# -- the hold of one run -----------------------------------------------------------------------


class TaskHold:
    """The lock that one task run holds: ``self.request.ylock`` in a bound task's body.

    ``token`` is the fencing token (strictly increasing per lock; unchanged when the
    run adopted its sender's ticket): pass it to the storage the task writes, so that it
    can refuse a stale holder. ``lost`` turns True once the lease could not be renewed
    (another worker may hold the lock now); ``lost_event`` is set at that moment (wait on
    it from a helper thread); ``check()`` raises :class:`ylock.LockLost` then.
    """

    __slots__ = ("lock", "mode", "owner", "token", "scope", "adopted", "lost_event", "handed_over")

    def __init__(self, lock: Lock, mode: str, owner: str, scope: str, adopted: bool) -> None:
        self.lock = lock
        self.mode = mode
        self.owner = owner
        self.scope = scope
        self.adopted = adopted            # taken over from the sender's ticket (scope "enqueue")
        self.lost_event = threading.Event()
        self.handed_over = False          # detached into a retry's message
        with owner_scope(owner):
            self.token: int | None = lock.token

    def __repr__(self) -> str:
        return f"<TaskHold {self.lock.group}/{self.lock.name} {self.mode} token={self.token}>"

    @property
    def lost(self) -> bool:
        """True once this run's hold was lost (it may be another worker's now)."""
        if self.lost_event.is_set():
            return True
        with owner_scope(self.owner):
            return self.lock.lost

    def check(self) -> None:
        """Raise :class:`ylock.LockLost` if this run's hold was lost: call it between the
        steps of long work, so that nothing more is done unprotected."""
        if self.lost:
            raise LockLost("this task's lock was lost (its lease could not be renewed): stop; another worker "
                           "may hold it now", group=self.lock.group, name=self.lock.name)

    def holds(self, lock: Lock) -> bool:
        return (lock.engine, lock.group, lock.name) == (self.lock.engine, self.lock.group, self.lock.name)

    def hand_over(self) -> Ticket:
        """Detach this run's hold into a ticket for the message that retries the task."""
        ticket: Ticket = run_as(self.owner, self.lock.detach)  # type: ignore[assignment]
        self.handed_over = True
        _unwatch(self)
        return ticket

    def take_back(self, ticket: Ticket) -> None:
        """Adopt ``ticket`` again (the retry could not be sent): the run releases it as usual."""
        self.lock = run_as(self.owner, Lock.adopt, self.lock.engine, ticket)  # type: ignore[assignment]
        self.handed_over = False
        _watch(self)

    def release(self) -> None:
        """Release the run's hold (unless it went on to a retry); a lost lease or an
        unreachable engine is logged: the task's outcome stands."""
        if self.handed_over:
            return
        _unwatch(self)
        try:
            with owner_scope(self.owner):
                self.lock.guard(self.mode).release()
        except LockLost as exc:
            logger.error("celery_ylock: %s", exc)
        except EngineUnavailable as exc:
            logger.error("celery_ylock: could not release %s/%s (its lease frees it): %s",
                         self.lock.group, self.lock.name, exc)
        except LockError as exc:            # e.g. the task body released it itself
            logger.error("celery_ylock: releasing %s/%s: %s", self.lock.group, self.lock.name, exc)


_watched: dict[tuple[str, str, str], TaskHold] = {}


def _on_lock_event(event: events.Event) -> None:
    if event.kind == events.LOST and event.owner is not None:
        hold = _watched.get((event.group, event.name, event.owner))
        if hold is not None:
            hold.lost_event.set()


def _watch(hold: TaskHold) -> None:
    events.subscribe(_on_lock_event)        # once per process (subscribe ignores repeats)
    _watched[(hold.lock.group, hold.lock.name, hold.owner)] = hold


def _unwatch(hold: TaskHold) -> None:
    _watched.pop((hold.lock.group, hold.lock.name, hold.owner), None)


# -- tickets -------------------------------------------------------------------------------------


def ticket_of(request: Any) -> Mapping[str, Any] | None:
    """The ticket an enqueue-scope task was sent with (its message header), or None."""
    value = getattr(request, TICKET_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(TICKET_HEADER)
    return value if isinstance(value, Mapping) else None


def _extend(engine: Engine, ticket: Ticket, seconds: float) -> None:
    """Make the server keep a detached hold ``seconds`` from now: its time in the queue,
    known only once the message's countdown, eta and expiry are (after the detach)."""
    if not engine.needs_renewal:
        return
    result = engine.renew([RenewItem(ticket.group, ticket.name, ticket.owner, ticket.mode, seconds)])[0]
    if result is False:
        raise LockLost("the lock was lost before its task could be sent", group=ticket.group, name=ticket.name)
    if result is None:
        raise EngineUnavailable("could not extend the lock for the queue: the engine did not answer",
                                group=ticket.group, name=ticket.name)


def _give_back(engine: Engine, ticket: Ticket, why: str) -> bool:
    """Adopt ``ticket`` and release it at once; return whether there was anything to release."""
    try:
        with owner_scope():
            Lock.adopt(engine, ticket).guard(ticket.mode).release()
        logger.info("celery_ylock: released %s/%s (%s)", ticket.group, ticket.name, why)
        return True
    except LockLost:
        return False            # adopted by a run already, or expired: nothing of ours to release
    except LockError as exc:
        logger.warning("celery_ylock: could not release %s/%s (%s); its queue lease frees it: %s",
                       ticket.group, ticket.name, why, exc)
        return False


def _seconds_until(value: Any) -> float:
    """Seconds from now until ``value`` (a number of seconds, a datetime or an ISO string)."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.0, float(value))
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return 0.0
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:            # naive: UTC, as Celery reads it
            value = value.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, float((value - datetime.datetime.now(datetime.timezone.utc)).total_seconds()))
    return 0.0


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked`` receiver (connected by :func:`install`): a worker
    drops an enqueue-scope task that never ran (revoked, expired): release the lock it was
    sent with. (A terminated task's run adopted the ticket already; nothing is released then.)"""
    spec: LockSpec | None = getattr(type(sender), "ylock_spec", None)
    data = None if spec is None or spec.scope != ENQUEUE else ticket_of(request)
    if spec is None or data is None:
        return
    try:
        ticket = Ticket.from_dict(data)
        registry = conf.state(sender._get_app()).registry
        engine = registry.engine(registry.lock_options(spec.name).engine)
    except LockError as exc:
        logger.warning("celery_ylock: cannot release the lock of revoked task %s: %s", getattr(request, "id", "?"),
                       exc)
        return
    _give_back(engine, ticket, f"task {getattr(request, 'id', '?')} revoked")


# -- the task class ------------------------------------------------------------------------------


def task_context(name: str, task_id: str | None) -> Any:
    """What the holds of a task's run say it is doing (see the module docstring)."""
    return ylock.context(f"celery task {name}", task_id=task_id) if task_id else \
        ylock.context(f"celery task {name}")


class LockedTask(Task):  # type: ignore[misc]
    """A task that holds a ylock lock (see the module docstring)::

        @app.task(base=LockedTask, lock={"name": "reports", "key": "{user_id}", "on_busy": "skip"})
        def build_report(user_id): ...

    ``lock`` is a named lock (a str) or a dict: ``name``, ``key``, ``mode`` ("write" or
    "read"), ``on_busy`` ("skip", "retry", "wait", "raise"), ``scope`` ("run" or
    "enqueue"), ``timeout`` (for "wait"), ``countdown`` and ``max_retries`` (for "retry"),
    ``queue_lease`` (for "enqueue"). It is checked when the task is registered; the
    settings it depends on are checked when a worker starts (and on first use anywhere).
    A task whose ``lock`` is None takes no lock, so ``LockedTask`` can be an app's
    ``task_cls``.
    """

    #: The lock the task holds (see the class docstring); None: none.
    lock: Any = None
    #: ``lock``, validated when the task class is bound to its app.
    ylock_spec: ClassVar[LockSpec | None] = None
    #: Set once this task's lock was checked against the settings in this process.
    _ylock_checked: ClassVar[bool] = False
    #: A busy lock is an expected outcome, not a bug: Celery logs the exceptions named in
    #: ``throws`` at INFO, without a traceback (on_bound adds it to a task's own ``throws``).
    throws: ClassVar[tuple[type[BaseException], ...]] = (TaskLocked,)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        cls.ylock_spec = LockSpec.parse(cls.lock, cls.name or cls.__qualname__, _parameters(cls))
        cls._ylock_checked = False
        if TaskLocked not in cls.throws:
            cls.throws = (*cls.throws, TaskLocked)
        if cls.ylock_spec is not None:
            install(app)

    def _ylock_registry(self) -> Registry:
        """The app's registry, with this task's lock checked against it (once per process)."""
        registry = conf.state(self._get_app()).registry
        cls = type(self)
        if not cls._ylock_checked:
            cls.ylock_spec.check(self, registry)  # type: ignore[union-attr]
            cls._ylock_checked = True
        return registry

    def lock_for(self, *args: Any, **kwargs: Any) -> Lock | None:
        """Return the :class:`ylock.Lock` that a call with these arguments holds (None if
        the task takes no lock for them): to look at it, or hold it from elsewhere."""
        spec = type(self).ylock_spec
        return None if spec is None else spec.target(self._ylock_registry(), args, kwargs)

    # -- the run ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec = type(self).ylock_spec
        if spec is None:
            top = self.request_stack.top
            with task_context(self.name, None if top is None else top.id):
                return super().__call__(*args, **kwargs)
        if self.request_stack.top is None:
            # A direct call (task(...)): push a request, as Task.__call__ does, to carry the hold.
            self.push_request(args=args, kwargs=kwargs)
            try:
                return self._run_locked(spec, args, kwargs)
            finally:
                self.pop_request()
        return self._run_locked(spec, args, kwargs)

    def _run_locked(self, spec: LockSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with task_context(self.name, self.request.id):
            return self._run_locked_as_said(spec, args, kwargs)

    def _run_locked_as_said(self, spec: LockSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = self.request
        registry = self._ylock_registry()
        target = spec.target(registry, args, kwargs)
        if target is None:
            request.ylock = None
            return self.run(*args, **kwargs)
        # The run is the owner, whatever thread runs it (see the module docstring).
        with owner_scope() as owner:
            hold = self._take_for_run(spec, registry, target, request, owner, args, kwargs)
            if not isinstance(hold, TaskHold):
                return hold                     # skipped
            request.ylock = hold
            try:
                return self.run(*args, **kwargs)
            finally:
                hold.release()

    def _take_for_run(self, spec: LockSpec, registry: Registry, target: Lock, request: Any, owner: str,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> TaskHold | dict[str, Any]:
        data = ticket_of(request) if spec.scope == ENQUEUE else None
        if data is not None:
            hold = self._adopt(spec, target, data, owner, request)
            if hold is not None:
                return hold
        wait = spec.wait_for(registry) if spec.on_busy == WAIT else 0.0
        try:
            got = target.guard(spec.mode).try_acquire(wait)
        except EngineUnavailable as exc:
            if spec.on_busy == RETRY:        # an outage is retried like a busy lock
                raise self.retry(exc=exc, countdown=spec.countdown, max_retries=spec.max_retries) from exc
            raise
        if got:
            hold = TaskHold(target, spec.mode, owner, spec.scope, adopted=False)
            _watch(hold)
            return hold
        return self._busy(spec, target, request.id, args, kwargs, wait)

    def _adopt(self, spec: LockSpec, target: Lock, data: Mapping[str, Any], owner: str, request: Any) -> \
            TaskHold | None:
        try:
            ticket = Ticket.from_dict(data)
        except ConfigurationError as exc:
            logger.warning("celery_ylock: task %s[%s] carries a bad ticket, ignored: %s", self.name, request.id, exc)
            return None
        if (ticket.group, ticket.name, ticket.mode) != (target.group, target.name, spec.mode):
            logger.warning("celery_ylock: task %s[%s] carries the ticket of %s/%s, not of its lock %s/%s: ignored",
                           self.name, request.id, ticket.group, ticket.name, target.group, target.name)
            return None
        try:
            lock = Lock.adopt(target.engine, ticket, fair=target.fair, polling=target.polling,
                              timeout=target.timeout)
        except LockLost:
            logger.info("celery_ylock: task %s[%s]: the lock it was sent with is gone (queue lease over, released, "
                        "or adopted by another delivery); taking %s/%s afresh",
                        self.name, request.id, target.group, target.name)
            return None
        # (Lock.adopt brings the server's lease down from the queue lease to the lock's LEASE.)
        hold = TaskHold(lock, spec.mode, owner, spec.scope, adopted=True)
        _watch(hold)
        return hold

    def _busy(self, spec: LockSpec, target: Lock, task_id: str | None, args: tuple[Any, ...],
              kwargs: Mapping[str, Any], wait: float | None) -> dict[str, Any]:
        """Do what ``on_busy`` says (after waiting ``wait`` seconds for the lock); return the
        skipped marker, or raise."""
        lock = f"{target.group}/{target.name}"
        if spec.on_busy == SKIP:
            logger.warning("celery_ylock: task %s[%s] skipped: lock %s is busy", self.name, task_id, lock)
            signals.task_skipped.send(sender=self, task_id=task_id, lock=lock, scope=spec.scope, args=args,
                                      kwargs=kwargs)
            return skipped_value(self.name, lock, spec.scope)
        held = "another task for it is queued or running" if spec.scope == ENQUEUE else "another owner holds it"
        # The wait it was given, not the time measured around it (which includes the round trips).
        waited_text = f" within {wait:g} s" if spec.on_busy == WAIT and wait is not None else ""
        exc = TaskLocked(f"task {self.name} could not take its {spec.mode} lock{waited_text}: {held} "
                         f"(on_busy={spec.on_busy!r}, scope={spec.scope!r})", group=target.group, name=target.name)
        if spec.on_busy == RETRY:
            raise self.retry(exc=exc, countdown=spec.countdown, max_retries=spec.max_retries)
        raise exc

    # -- sending -------------------------------------------------------------------------

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, producer: Any = None,
                    link: Any = None, link_error: Any = None, shadow: str | None = None, **options: Any) -> Any:
        spec = type(self).ylock_spec
        headers = options.get("headers")
        if headers and TICKET_HEADER in headers:
            # A retry copies its request's headers: a ticket is good for one delivery only.
            options["headers"] = headers = {k: v for k, v in headers.items() if k != TICKET_HEADER}
        send = super().apply_async
        if spec is None or spec.scope != ENQUEUE:
            return send(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        registry = self._ylock_registry()
        call_args, call_kwargs = tuple(args or ()), dict(kwargs or {})
        target = spec.target(registry, call_args, call_kwargs)
        if target is None:
            return send(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        current = getattr(self.request, "ylock", None)
        give_back: Callable[[Ticket], object]
        if isinstance(current, TaskHold) and task_id is not None and task_id == self.request.id \
                and not current.handed_over and current.holds(target):
            # The running task retries itself: its lock goes on to the retry's message.
            ticket = current.hand_over()
            give_back = current.take_back
        else:
            # The id is chosen here (as Task.apply_async would) so that the lock says which task it is for.
            task_id = task_id or uuid()
            with task_context(self.name, task_id):
                taken = self._take_for_sending(spec, registry, target, call_args, call_kwargs)
            if not isinstance(taken, Ticket):
                return taken
            ticket = taken
            give_back = lambda t: _give_back(target.engine, t, "the task could not be sent")  # noqa: E731
        try:
            delay = max(_seconds_until(options.get("countdown")), _seconds_until(options.get("eta")))
            ttl = max(spec.queue_lease_for(self._get_app()) + delay,
                      _seconds_until(options.get("expires", self.expires)))
            _extend(target.engine, ticket, min(ttl, opt.MAX_LEASE))
            options["headers"] = {**(headers or {}), TICKET_HEADER: ticket.as_dict()}
            return send(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        except BaseException:
            give_back(ticket)
            raise

    def _take_for_sending(self, spec: LockSpec, registry: Registry, target: Lock, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Ticket | EagerResult:
        """Take the lock for a task about to be sent and detach it into its ticket; or do
        what ``on_busy`` says (a skipped result, or raise)."""
        wait = spec.wait_for(registry) if spec.on_busy == WAIT else 0.0
        # A fresh owner: the sender (perhaps a task holding this very lock) never re-enters.
        with owner_scope():
            if target.guard(spec.mode).try_acquire(wait):
                return target.detach()
            task_id = uuid()
            value = self._busy(spec, target, task_id, args, kwargs, wait)
        return EagerResult(task_id, value, states.SUCCESS, name=self.name)


_installed: weakref.WeakSet[Any] = weakref.WeakSet()
_install_mutex = threading.Lock()


def install(app: Any) -> None:
    """Wire ylock into ``app`` (once): a worker bootstep that checks the settings at
    startup (:mod:`celery_ylock.checks`), and the revoked-task receiver. Called when the
    first locked task is bound to the app, so there is nothing to set up by hand."""
    if app in _installed:
        return
    with _install_mutex:
        if app in _installed:
            return
        from celery import bootsteps
        from celery.signals import task_revoked, worker_process_shutdown

        class YLockCheck(bootsteps.Step):  # type: ignore[misc]
            """Stop the worker at startup when the ylock settings contradict each other.
            (A ``worker_init`` receiver could not: Celery logs what its receivers raise.)"""

            name = "celery_ylock.check"

            def __init__(self, worker: Any, **kwargs: Any) -> None:
                checks.check_app(worker.app)

        app.steps["worker"].add(YLockCheck)
        task_revoked.connect(on_task_revoked, weak=False, dispatch_uid="celery_ylock.task_revoked")
        # A prefork child leaves with os._exit (no atexit): write its pending metrics first,
        # or a child recycled by --max-tasks-per-child loses its last events' counts.
        worker_process_shutdown.connect(_drain_metrics, weak=False, dispatch_uid="celery_ylock.metrics")
        _installed.add(app)


def _drain_metrics(**kwargs: Any) -> None:
    """``worker_process_shutdown`` receiver: apply every pending metrics event of this process."""
    from ylock.metrics.deferred import drain_all

    drain_all()
