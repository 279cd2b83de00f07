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
queued or running. The sender detaches its hold into a :class:`ylock.tickets.Ticket` that
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

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from celery import Task, states
from celery.result import EagerResult
from celery.utils import uuid

import ylock
from celery_ylock import checks, conf, signals
from celery_ylock.hold import TaskHold, watch
from celery_ylock.spec import ENQUEUE, RETRY, SKIP, WAIT, LockSpec, TaskLocked, parameters, skipped_value
from celery_ylock.tickets import TICKET_HEADER, extend, give_back, on_task_revoked, seconds_until, ticket_of
from ylock import options as opt
from ylock.errors import ConfigurationError, EngineUnavailable, LockLost
from ylock.lock import Lock
from ylock.owner import owner_scope
from ylock.registry import Registry
from ylock.tickets import Ticket

__all__ = ["LockedTask", "install", "task_context"]

logger = logging.getLogger(__name__)


def task_context(name: str, task_id: str | None) -> Any:
    """What the holds of a task's run say it is doing (see the module docstring)."""
    return ylock.context(f"celery task {name}", task_id=task_id) if task_id else \
        ylock.context(f"celery task {name}")


class LockedTask(Task):  # type: ignore[misc,type-arg,unused-ignore]  # celery-types or none
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
    throws: tuple[type[Exception], ...] = (TaskLocked,)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        cls.ylock_spec = LockSpec.parse(cls.lock, cls.name or cls.__qualname__, parameters(cls))
        cls._ylock_checked = False
        if TaskLocked not in cls.throws:
            cls.throws = (*cls.throws, TaskLocked)
        if cls.ylock_spec is not None:
            install(app)

    def _ylock_registry(self) -> Registry:
        """The app's registry, with this task's lock checked against it (once per process)."""
        registry = conf.state(self.app).registry
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
        request: Any = self.request             # its ylock attribute is ours (celery-types know it not)
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
            watch(hold)
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
        watch(hold)
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
        undo: Callable[[Ticket], object]
        if isinstance(current, TaskHold) and task_id is not None and task_id == self.request.id \
                and not current.handed_over and current.holds(target):
            # The running task retries itself: its lock goes on to the retry's message.
            ticket = current.hand_over()
            undo = current.take_back
        else:
            # The id is chosen here (as Task.apply_async would) so that the lock says which task it is for.
            task_id = task_id or uuid()
            with task_context(self.name, task_id):
                taken = self._take_for_sending(spec, registry, target, call_args, call_kwargs)
            if not isinstance(taken, Ticket):
                return taken
            ticket = taken
            undo = lambda t: give_back(target.engine, t, "the task could not be sent")  # noqa: E731
        try:
            delay = max(seconds_until(options.get("countdown")), seconds_until(options.get("eta")))
            ttl = max(spec.queue_lease_for(self.app) + delay,
                      seconds_until(options.get("expires", self.expires)))
            extend(target.engine, ticket, min(ttl, opt.MAX_LEASE))
            options["headers"] = {**(headers or {}), TICKET_HEADER: ticket.as_dict()}
            return send(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        except BaseException:
            undo(ticket)
            raise

    def _take_for_sending(self, spec: LockSpec, registry: Registry, target: Lock, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Ticket | EagerResult[Any]:
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

        class YLockCheck(bootsteps.Step):  # type: ignore[misc,unused-ignore]
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
