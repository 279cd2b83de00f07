"""The test engine's switches (ylock.testing.local) and the plugin's fixtures, in process:
a busy lock, an engine that is down and a lost hold, for sync, async and Celery code."""
from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

import pytest
from celery import Celery

import pytest_ylock as pytest_plugin
import ylock
from celery_ylock import LockedTask, TaskLocked, conf
from ylock.holds import HOLDS
from ylock.testing.local import LocalTestEngine, shared

# The plugin's fixtures, as a user's session has them (its entry point loads them there).
ylock_engine = pytest_plugin.ylock_engine
ylock_celery = pytest_plugin.ylock_celery


def test_busy_lock_times_out_others_and_frees_after(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    with ylock_engine.busy(lock) as owners:
        assert len(owners) == 1
        assert not lock.try_lock(0.05)
        with pytest.raises(ylock.LockTimeout):
            lock.lock(timeout=0.05)
        info = ylock_engine.describe_lock("orders", "42")
        assert info is not None and info.owners == tuple(owners)
    assert lock.try_lock(0)
    lock.unlock()


def test_busy_read_lets_readers_in(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    with ylock_engine.busy("orders", "42", mode="read"):
        assert lock.try_rlock(0)
        lock.runlock()
        assert not lock.try_lock(0)


def test_busy_semaphore_takes_every_permit(ylock_engine: LocalTestEngine) -> None:
    sem = ylock.Semaphore(ylock_engine, "exports", "acme", permits=3)
    with ylock_engine.busy(sem) as owners:
        assert len(set(owners)) == 3
        assert not sem.try_acquire(0)
    assert sem.try_acquire(0)
    sem.release()
    with ylock_engine.busy("exports", "acme", permits=3) as owners:     # by name: a semaphore
        assert len(owners) == 3 and not sem.try_acquire(0)


def test_busy_refuses_what_is_held_or_foreign(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    with lock.write(timeout=1), pytest.raises(RuntimeError, match="held already"), ylock_engine.busy(lock):
        pass
    with pytest.raises(ValueError, match="not on this test engine"), \
            ylock_engine.busy(ylock.Lock(ylock.engine_from_url("local://"), "orders", "42")):
        pass
    with pytest.raises(TypeError, match="a group and a name"), ylock_engine.busy("orders"):
        pass
    with pytest.raises(ValueError, match="mode"), ylock_engine.busy(lock, mode="both"):
        pass
    with pytest.raises(TypeError, match="permits= is for a semaphore"), ylock_engine.busy(lock, permits=2):
        pass


def test_unavailable_raises_engine_unavailable_then_recovers(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    with ylock_engine.unavailable():
        with pytest.raises(ylock.EngineUnavailable, match="unavailable"):
            lock.try_lock(0)
        with pytest.raises(ConnectionError):
            ylock_engine.ping()
        with pytest.raises(ylock.EngineUnavailable):
            list(ylock_engine.describe())
    lock.lock(timeout=1)
    with ylock_engine.unavailable(), pytest.raises(ylock.EngineUnavailable):
        lock.unlock()             # the release could not reach the engine: its lease frees it there
    assert ylock_engine.describe_lock("orders", "42") is not None
    assert ylock_engine.force_release("orders", "42")


def test_lose_marks_a_current_hold_lost_and_frees_it(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    lost: list[ylock.events.Event] = []
    ylock.events.subscribe(lost.append)
    try:
        with pytest.raises(ylock.LockLost, match="lease ran out"), lock.write(timeout=1):
            assert ylock_engine.lose(lock) == 1
            assert lock.lost
            other = threading.Thread(target=lambda: box.append(lock.try_lock(0) and (lock.unlock() or True)))
            box: list[bool] = []
            other.start()
            other.join(5)
            assert box == [True]       # the engine let another owner in: the lease ran out there
    finally:
        ylock.events.unsubscribe(lost.append)
    assert [e.kind for e in lost if e.kind == ylock.events.LOST and e.name == "42"] == ["lost"]
    assert not HOLDS.holds(ylock_engine)


def test_lost_loses_each_hold_taken_in_the_block(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")
    other = ylock.Lock(ylock_engine, "orders", "43")
    with ylock_engine.lost(lock):
        for _ in range(2):
            with pytest.raises(ylock.LockLost), lock.write(timeout=1):
                assert lock.lost
        with other.write(timeout=1):
            assert not other.lost          # another lock is not touched
    with lock.write(timeout=1):
        assert not lock.lost               # nor holds taken after the block


def test_a_semaphores_permit_is_lost_too(ylock_engine: LocalTestEngine) -> None:
    sem = ylock.Semaphore(ylock_engine, "exports", "acme", permits=2)
    lock = ylock.Lock(ylock_engine, "exports", "acme")        # same names, another thing
    with ylock_engine.lost(sem), lock.write(timeout=1):
        with pytest.raises(ylock.LockLost), sem.hold(timeout=1):
            assert sem.lost
        assert not lock.lost
    with lock.write(timeout=1), pytest.raises(ylock.LockLost), sem.hold(timeout=1):
        assert ylock_engine.lose(sem) == 1
        assert sem.lost and not lock.lost


def test_async_code_sees_the_same_paths(ylock_engine: LocalTestEngine) -> None:
    lock = ylock.Lock(ylock_engine, "orders", "42")

    async def main() -> list[Any]:
        seen: list[Any] = []
        with ylock_engine.busy(lock):
            seen.append(await lock.atry_lock(0.05))
        with ylock_engine.unavailable():
            try:
                await lock.alock(timeout=1)
            except ylock.EngineUnavailable:
                seen.append("503")
        with ylock_engine.lost(lock):
            try:
                async with lock.write(timeout=1):
                    seen.append(lock.lost)
            except ylock.LockLost:
                seen.append("LockLost")
        return seen

    assert asyncio.run(main()) == [False, "503", True, "LockLost"]


def test_shared_names_the_live_engine_only() -> None:
    engine = LocalTestEngine()
    assert shared(engine.name) is engine
    assert ylock.engine_from_path("ylock.testing.local.shared", **engine.engine_setting()["OPTIONS"]) is engine
    name = engine.name
    del engine
    with pytest.raises(LookupError, match="outlived"):
        shared(name)


def test_django_setting_points_every_alias_and_drops_metrics(ylock_engine: LocalTestEngine) -> None:
    base = {"ENGINES": {"pg": {"URL": "postgresql://db/app"}}, "LOCKS": {"a": {"ENGINE": "pg"}},
            "METRICS": {"PROMETHEUS": {}}}
    setting = ylock_engine.django_setting(base)
    assert set(setting["ENGINES"]) == {"default", "pg"}
    assert setting["LOCKS"] == base["LOCKS"] and "METRICS" not in setting
    registry = ylock.registry.Registry(setting)
    assert registry.engine("pg") is ylock_engine and registry.lock("a").engine is ylock_engine


def test_flask_config_wires_an_app_factory(ylock_engine: LocalTestEngine) -> None:
    from flask import Flask

    from flask_ylock import YLock

    app = Flask("factory")
    app.config.update(YLOCK_URL="redis://127.0.0.1:9/0", YLOCK_ENGINES={"reports": {"URL": "redis://127.0.0.1:9/1"}})
    app.config.update(ylock_engine.flask_config(app.config))
    ext = YLock(app)
    with app.app_context():
        assert ext.engine() is ylock_engine and ext.engine("reports") is ylock_engine


# -- Celery tasks run eagerly --------------------------------------------------------------------


@pytest.fixture
def celery_app(ylock_celery: Any) -> tuple[Celery, LocalTestEngine, Any]:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, broker_url="memory://",
                    ylock_url="redis://127.0.0.1:9/0")     # never reached: the fixture replaces it
    engine = ylock_celery(app)

    @app.task(bind=True, shared=False, lazy=False, base=LockedTask, name="settle",
              lock={"name": "accounts", "key": "{account}", "on_busy": "raise"})
    def settle(self: Any, account: str) -> Any:
        return {"token": self.request.ylock.token, "lost": self.request.ylock.lost}

    return app, engine, settle


def test_celery_task_busy_unavailable_and_lost(celery_app: tuple[Celery, LocalTestEngine, Any]) -> None:
    app, engine, settle = celery_app
    assert conf.state(app).registry.engine() is engine
    assert settle.delay("7").get()["lost"] is False
    with engine.busy(settle.lock_for("7")), pytest.raises(TaskLocked, match="another owner holds it"):
        settle.delay("7").get()
    with engine.unavailable(), pytest.raises(ylock.EngineUnavailable):
        settle.delay("7").get()
    with engine.lost("accounts", "7"):
        assert settle.delay("7").get()["lost"] is True


def test_task_locked_is_an_expected_failure_logged_without_traceback(
        celery_app: tuple[Celery, LocalTestEngine, Any], caplog: pytest.LogCaptureFixture) -> None:
    app, engine, settle = celery_app
    app.conf.task_eager_propagates = False
    with engine.busy(settle.lock_for("7")), caplog.at_level(logging.INFO, logger="celery"):
        result = settle.delay("7")
    assert isinstance(result.result, TaskLocked)
    records = [r for r in caplog.records if "TaskLocked" in r.getMessage() or "settle" in r.getMessage()]
    assert records, [r.getMessage() for r in caplog.records]
    assert all(r.levelno < logging.ERROR and r.exc_info is None for r in records), \
        [(r.levelname, r.getMessage(), r.exc_info) for r in records]
