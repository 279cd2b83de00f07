"""ylock's pytest plugin: an in-memory engine per test, wired into Django, Flask or Celery
settings, with switches for a busy lock, an engine that is down and a lost hold.

Installed with ylock (the ``pytest11`` entry point ``ylock``); it does nothing until a
test asks for one of its fixtures, and imports neither ylock's engines nor Django, Flask
or Celery before then. See docs/testing.md.

``ylock_engine``
    a fresh :class:`~ylock.testing.local.LocalTestEngine` for the test: ``busy()``,
    ``unavailable()``, ``lost()``, ``lose()``.
``ylock_django``
    the same engine, as every engine of Django's ``YLOCK`` setting (the project's
    ``LOCKS`` kept) for the test's duration (``override_settings``, so django_ylock
    rebuilds its registry on the way in and out).
``ylock_flask``
    a function ``ylock_flask(app)`` that points ``app``'s ylock engines at the test engine
    for the test's duration (``app`` with ``YLock(app)`` or ``init_app`` done) and returns
    the engine.
``ylock_idempotency``
    helpers for ``@idempotent`` views (:mod:`ylock.testing.idempotency`):
    ``assert_replays(send)`` sends a request twice with one key and asserts the replay;
    ``in_flight(key, lock="idempotency", scope=..., app=None)`` holds the key's lock as a
    request in flight would (Django's named lock family, or Flask ``app``'s), for a 409;
    ``user_scope(user)`` is a user's scope.
``ylock_celery``
    a function ``ylock_celery(app)`` doing the same for a Celery app whose ylock settings
    are its own (``app.conf.ylock`` / ``ylock_url``); a Celery app that follows
    django_ylock needs only ``ylock_django``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ylock.testing.local import LocalTestEngine


@pytest.fixture
def ylock_engine() -> Iterator[LocalTestEngine]:
    """Return an in-memory engine of the test's own (see :mod:`ylock.testing.local`)."""
    from ylock.testing.local import LocalTestEngine

    engine = LocalTestEngine()
    yield engine
    # Holds a failing test left behind would be renewed for the rest of the session.
    engine.forget_holds()


@pytest.fixture
def ylock_django(ylock_engine: LocalTestEngine) -> Iterator[LocalTestEngine]:
    """Point every engine of ``settings.YLOCK`` at ``ylock_engine`` for this test; return it.

    The project's ``LOCKS`` and other keys stay. A test that sets ``YLOCK`` itself (with
    pytest-django's ``settings``) replaces this: give it ``ylock_engine.django_setting(...)``."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(YLOCK=ylock_engine.django_setting(getattr(settings, "YLOCK", None))):
        yield ylock_engine


@pytest.fixture
def ylock_flask(ylock_engine: LocalTestEngine) -> Iterator[Callable[[Any], LocalTestEngine]]:
    """Return ``use(app)``: it points ``app``'s ylock engines at ``ylock_engine`` until the
    test ends and returns the engine."""
    restore: list[Callable[[], None]] = []

    def use(app: Any) -> LocalTestEngine:
        from flask_ylock.state import state
        from ylock.registry import Registry

        current = state(app)
        before, keys = current.registry, {k: app.config.get(k) for k in ("YLOCK_ENGINES", "YLOCK_URL")}
        settings = dict(before.settings)
        settings["ENGINES"] = ylock_engine.django_setting(settings)["ENGINES"]
        current.registry = Registry(settings, where="YLOCK")
        app.config.update(YLOCK_ENGINES=settings["ENGINES"], YLOCK_URL=None)

        def undo() -> None:
            current.registry = before
            app.config.update(keys)
        restore.append(undo)
        return ylock_engine

    yield use
    for undo in reversed(restore):
        undo()


@pytest.fixture
def ylock_celery(ylock_engine: LocalTestEngine) -> Iterator[Callable[[Any], LocalTestEngine]]:
    """Return ``use(app)``: it points a Celery app's own ylock engines (``app.conf.ylock``,
    ``ylock_url``) at ``ylock_engine`` until the test ends and returns the engine. Run the
    tasks eagerly (``task_always_eager``): the engine lives in the test's process."""
    restore: list[Callable[[], None]] = []

    def use(app: Any) -> LocalTestEngine:
        from celery_ylock import conf

        before = {k: app.conf.get(k) for k in ("ylock", "ylock_url")}
        app.conf.update(ylock=ylock_engine.django_setting(before["ylock"]), ylock_url=None)
        conf.reset(app)

        def undo() -> None:
            app.conf.update(before)
            conf.reset(app)
        restore.append(undo)
        return ylock_engine

    yield use
    for undo in reversed(restore):
        undo()


class IdempotencyHelpers:
    """What ``ylock_idempotency`` hands a test (see :mod:`ylock.testing.idempotency`)."""

    def assert_replays(self, send: Callable[[str], Any], key: str | None = None) -> tuple[Any, Any]:
        """Send a request twice with one key (``send(key)``); assert the second replays the first."""
        from ylock.testing.idempotency import assert_replays

        return assert_replays(send, key)

    def user_scope(self, user: Any) -> str:
        """The scope of ``user``'s keys under ``scope="user"``."""
        from ylock.testing.idempotency import user_scope

        return user_scope(user)

    def in_flight(self, key: str, *, lock: str = "idempotency", scope: str | None = None,
                  app: Any = None) -> Any:
        """A context manager holding ``key``'s lock (in ``scope``: default the anonymous
        requests'; ``user_scope(user)`` for a user's) as a request in flight would: the
        view answers 409 meanwhile. The lock family ``lock`` is Django's, or Flask
        ``app``'s."""
        from ylock.idempotency import ANONYMOUS
        from ylock.testing.idempotency import in_flight

        if app is not None:
            from flask_ylock.state import state

            locks = state(app).registry.locks(lock)
        else:
            import django_ylock

            locks = django_ylock.locks(lock)
        return in_flight(locks, key, ANONYMOUS if scope is None else scope)


@pytest.fixture
def ylock_idempotency() -> IdempotencyHelpers:
    """Helpers to test ``@idempotent`` views: ``assert_replays``, ``in_flight``, ``user_scope``."""
    return IdempotencyHelpers()
