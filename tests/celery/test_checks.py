"""celery_ylock without workers: the ``lock`` option checked when a task is registered, the
settings checked when a worker starts, where the engines come from, and the behaviours in
eager mode (``task_always_eager``) on the local engine."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

import ylock
from celery_ylock import LockedTask, TaskLocked, check_app, conf, current_lock, skipped
from tests.helpers import collect

pytestmark = pytest.mark.slow


def make_app(**settings: Any) -> Celery:
    app = Celery(f"t{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update({"broker_url": "redis://127.0.0.1:1/0", **settings})
    return app


def register(app: Celery, lock: Any, func: Any = None, **options: Any) -> Any:
    """Register ``func`` (by default ``job(job, day="today")``) as a locked task, at once."""
    def job(job: str, day: str = "today") -> str:
        return f"{job}:{day}"
    options.setdefault("name", f"job-{uuid.uuid4().hex[:8]}")
    return app.task(shared=False, lazy=False, base=LockedTask, lock=lock, **options)(func or job)


# -- the lock option, checked at registration ------------------------------------------------------


@pytest.mark.parametrize(("lock", "message"), [
    ({"name": "jobs", "on_busy": "later"},
     "lock['on_busy'] must be one of 'skip', 'retry', 'wait', 'raise', got 'later'"),
    ({"name": "jobs", "scope": "always"}, "lock['scope'] must be one of 'run', 'enqueue', got 'always'"),
    ({"name": "jobs", "mode": "exclusive"}, "lock['mode'] must be one of 'write', 'read'"),
    ({"name": "jobs", "on_bussy": "skip"}, "lock has unknown key 'on_bussy'"),
    ({"name": "jobs", "key": "{user}"}, "lock['key'] = '{user}' names 'user', which is not an argument of the task "
                                        "(its arguments: job, day)"),
    ({"name": "jobs", "key": "{0}"}, "must name the task's arguments"),
    ({"name": "jobs", "key": "{job"}, "is not a valid format string"),
    ({"name": "jobs", "key": 42}, "lock['key'] must be a format string"),
    ({"name": "jobs", "scope": "enqueue", "on_busy": "retry"}, "lock['on_busy'] = 'retry' needs scope='run'"),
    ({"name": "jobs", "timeout": -1}, "lock['timeout'] must not be negative"),
    ({"name": "jobs", "max_retries": 1.5}, "lock['max_retries'] must be a whole number"),
    ({"name": "jobs", "queue_lease": 0}, "lock['queue_lease'] must be a number of seconds >= 0.01"),
    ({"name": "a/b"}, "lock['name'] 'a/b' is not a valid lock name"),
    ({"key": "{job}"}, "lock['name'] must be a non-empty string"),
    ([("name", "jobs")], "lock must be a dict"),
])
def test_a_bad_lock_option_fails_when_the_task_is_registered(lock: Any, message: str) -> None:
    with pytest.raises(ylock.ConfigurationError) as caught:
        register(make_app(), lock)
    assert message in str(caught.value) and "task 'job-" in str(caught.value)


def test_keys_are_built_from_the_bound_arguments(redis_server: Any) -> None:
    app = make_app(ylock_url=redis_server.url)

    def order(self: Any, order: Any, *, day: str = "monday", **extra: Any) -> None: ...

    bound = register(app, {"name": "orders", "key": "{order.id}-{day}-{shop}"}, order, bind=True)
    lock = bound.lock_for(SimpleNamespace(id=7), shop="a/b")
    assert (lock.group, lock.name) == ("orders", "7-monday-a%2Fb")      # escaped into a valid name
    assert register(app, "reports").lock_for("x").name == "global"       # no key: the named lock itself
    by_callable = register(app, {"name": "users", "key": lambda job, day="today": None if job == "-" else job.upper()})
    assert by_callable.lock_for("ab").name == "AB" and by_callable.lock_for("-") is None


# -- the settings ---------------------------------------------------------------------------------


def test_the_engine_comes_from_the_app_then_django_then_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                       redis_server: Any) -> None:
    monkeypatch.delenv("YLOCK_URL", raising=False)
    app = make_app(ylock_url=redis_server.url)
    assert conf.state(app).where == "app.conf.ylock_url"
    assert conf.state(app).registry.engine().url_for_display().startswith("redis://127.0.0.1")

    app = make_app(ylock={"LOCKS": {"jobs": {"LEASE": 5}}}, ylock_url=redis_server.url)   # the URL fills "default"
    assert conf.state(app).registry.lock_options("jobs").lease == 5.0

    app = make_app()                            # nothing in the app: django_ylock's, in this Django test run
    assert conf.state(app).where.startswith("django_ylock")

    monkeypatch.setattr(conf, "_django_ylock_installed", lambda: False)
    monkeypatch.setenv("YLOCK_URL", "local://")
    assert conf.state(make_app()).where == "$YLOCK_URL"
    monkeypatch.delenv("YLOCK_URL")
    with pytest.raises(ylock.ConfigurationError, match="celery_ylock has no engine: set app.conf.ylock_url"):
        conf.state(make_app())
    with pytest.raises(ylock.ConfigurationError, match=r"app.conf.ylock\['LOCKS'\]\['jobs'\] has unknown key 'TIMOUT'"):
        conf.state(make_app(ylock={"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": {"jobs": {"TIMOUT": 1}}}))


@pytest.mark.parametrize(("settings", "lock", "options", "message"), [
    ({"ylock_url": "local://"}, "jobs", {}, "uses the local:// engine 'default': it excludes threads of one process"),
    ({"ylock_url": "zookeeper://127.0.0.1:1/t"}, {"name": "jobs", "scope": "enqueue"}, {},
     "lock['scope'] = 'enqueue' needs an engine whose holds can move to another process"),
    ({"broker_transport_options": {"visibility_timeout": 20}}, {"name": "jobs", "on_busy": "skip"},
     {"acks_late": True}, "LOCKS['jobs']['LEASE'] (30 s) must be shorter than the broker's visibility_timeout "
                          "(20 s) for an acks_late task with on_busy='skip'"),
    ({"broker_transport_options": {"visibility_timeout": 60}, "task_acks_late": True},
     {"name": "jobs", "on_busy": "wait", "timeout": None}, {}, "lock['timeout'] (forever) must be shorter than"),
    ({"broker_transport_options": {"visibility_timeout": 60}}, {"name": "jobs", "on_busy": "retry", "countdown": 60},
     {}, "lock['countdown'] (60 s) must be shorter than the broker's visibility_timeout (60 s)"),
    ({"broker_transport_options": {"visibility_timeout": 600}}, {"name": "jobs", "scope": "enqueue", "queue_lease": 60},
     {}, "lock['queue_lease'] (60 s) must not be shorter than the broker's visibility_timeout (600 s)"),
    ({"broker_url": "sqs://"}, {"name": "jobs", "scope": "enqueue", "queue_lease": 60}, {},
     "must not be shorter than the broker's visibility_timeout (1800 s)"),
])
def test_settings_that_contradict_each_other_stop_the_worker(redis_server: Any, settings: dict[str, Any], lock: Any,
                                                              options: dict[str, Any], message: str) -> None:
    app = make_app(**{"ylock_url": redis_server.url, **settings})
    task = register(app, lock, **options)
    with pytest.raises(ylock.ConfigurationError) as caught:
        check_app(app)
    assert message in str(caught.value)
    with pytest.raises(ylock.ConfigurationError):      # and on first use, in any process
        task.lock_for("x")


@pytest.mark.parametrize(("settings", "lock", "options"), [
    ({"broker_transport_options": {"visibility_timeout": 20}}, {"name": "jobs", "on_busy": "retry"},
     {"acks_late": True}),                              # a retry outlasts the dead worker's lock
    ({"broker_url": "amqp://127.0.0.1:1//"}, {"name": "jobs", "scope": "enqueue", "queue_lease": 60},
     {"acks_late": True}),                              # RabbitMQ has no visibility timeout
    ({"task_always_eager": True, "ylock_url": "local://"}, {"name": "jobs", "scope": "enqueue"}, {}),
])
def test_settings_that_fit_together_pass(redis_server: Any, settings: dict[str, Any], lock: Any,
                                         options: dict[str, Any]) -> None:
    app = make_app(**{"ylock_url": redis_server.url, **settings})
    register(app, lock, **options)
    check_app(app)


def test_every_problem_is_listed(redis_server: Any) -> None:
    app = make_app(ylock_url="local://")
    register(app, "jobs", name="first")
    register(app, "jobs", name="second")
    with pytest.raises(ylock.ConfigurationError, match="(?s)invalid settings:.*'first'.*'second'"):
        check_app(app)


# -- eager mode on the local engine: the behaviours without a broker ---------------------------------


@pytest.fixture
def eager() -> Iterator[Celery]:
    app = make_app(task_always_eager=True, task_eager_propagates=True, ylock_url="local://")
    yield app
    conf.reset(app)


def held_elsewhere(lock: ylock.Lock) -> tuple[threading.Event, threading.Thread]:
    """Hold ``lock`` in another thread until the returned event is set."""
    done, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with lock.write(timeout=5):
            taken.set()
            done.wait(10)
    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(5)
    return done, thread


def test_run_scope_in_eager_mode(eager: Celery) -> None:
    def job(self: Any, job: str) -> Any:
        return self.request.ylock.token, self.request.ylock.lost

    skip = register(eager, {"name": "jobs", "key": "{job}", "on_busy": "skip"}, job, bind=True, name="skip")
    fail = register(eager, {"name": "jobs", "key": "{job}", "on_busy": "raise"}, job, bind=True, name="fail")
    retry = register(eager, {"name": "jobs", "key": "{job}"}, job, bind=True, name="retry")
    done, thread = held_elsewhere(skip.lock_for("a"))
    try:
        assert skipped(skip.delay("a").get())
        with pytest.raises(TaskLocked, match="another owner holds it"):
            fail.delay("a")
        with pytest.raises(TaskLocked):
            retry("a")                      # a direct call cannot be retried: on_busy "retry" raises
        token, lost = skip.delay("b").get()
        assert isinstance(token, int) and lost is False
    finally:
        done.set()
        thread.join(5)
    token, lost = skip("a")                 # a direct call takes the lock too
    assert isinstance(token, int) and not lost and skip.lock_for("a").try_lock()


def test_current_lock_is_the_runs_hold_and_says_when_there_is_none(eager: Celery) -> None:
    """``current_lock(self)``: the run's TaskHold, typed (``self.request.ylock``); a LookupError
    naming the task where the run holds no lock (no lock= option, or no key for its arguments)."""
    def job(self: Any, job: str | None) -> Any:
        hold = current_lock(self)
        return hold.token, hold.lock.name, hold is self.request.ylock

    locked = register(eager, {"name": "jobs", "key": lambda job: job}, job, bind=True, name="current")
    token, name, same = locked.delay("a").get()
    assert isinstance(token, int) and name == "a" and same
    with pytest.raises(LookupError, match="task current holds no ylock lock in this run"):
        locked.delay(None).get()            # no key: no lock for this run

    @eager.task(bind=True, name="plain", shared=False)
    def plain(self: Any) -> Any:
        return current_lock(self)
    with pytest.raises(LookupError, match="task plain holds no ylock lock"):
        plain.delay().get()


def test_enqueue_scope_in_eager_mode(eager: Celery) -> None:
    def job(self: Any, job: str) -> Any:
        return self.request.ylock.token, self.request.ylock.adopted

    once = register(eager, {"name": "jobs", "key": "{job}", "scope": "enqueue"}, job, bind=True, name="once")
    done, thread = held_elsewhere(once.lock_for("a"))
    try:
        with pytest.raises(TaskLocked, match="queued or running"):
            once.delay("a")
    finally:
        done.set()
        thread.join(5)
    with collect(ylock.events.DETACHED) as detached:
        assert once.delay("a").get() == (detached[0].token, True)    # the sender's hold, adopted
    assert once.lock_for("a").try_lock()                               # and released after the run


def test_readers_share_and_writers_exclude_in_eager_mode(eager: Celery) -> None:
    def job(job: str) -> str:
        return "ran"

    reader = register(eager, {"name": "books", "key": "{job}", "mode": "read", "on_busy": "raise"}, job, name="r")
    writer = register(eager, {"name": "books", "key": "{job}", "on_busy": "raise"}, job, name="w")
    lock = reader.lock_for("a")
    done, taken = threading.Event(), threading.Event()

    def read_elsewhere() -> None:
        with lock.read(timeout=5):
            taken.set()
            done.wait(10)
    thread = threading.Thread(target=read_elsewhere, daemon=True)
    thread.start()
    try:
        assert taken.wait(5)
        assert reader.delay("a").get() == "ran"          # another reader holds it: readers share
        with pytest.raises(TaskLocked, match="write lock"):
            writer.delay("a")
    finally:
        done.set()
        thread.join(5)
    assert writer.delay("a").get() == "ran"
