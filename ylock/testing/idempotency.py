"""Testing idempotent views (``@django_ylock.idempotent``, ``@ylock.idempotent`` in Flask):
the two things a test of such a view wants, framework-free. The pytest plugin hands them
out as the ``ylock_idempotency`` fixture.

    first, replay = assert_replays(lambda key: client.post("/payments", data, HTTP_IDEMPOTENCY_KEY=key))
    with in_flight(django_ylock.locks("idempotency"), key):     # as if a first request ran now
        assert client.post("/payments", data, HTTP_IDEMPOTENCY_KEY=key).status_code == 409

Responses are read as Django's test client and Flask's return them (``status_code``,
``headers``, ``content`` or ``data``).
"""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ylock.clients import user_name
from ylock.idempotency import ANONYMOUS, REPLAYED, record_id
from ylock.lock import Lock, Locks
from ylock.owner import new_owner, owner_scope

__all__ = ["assert_replays", "in_flight", "key_lock", "user_scope"]


def _body(response: Any) -> bytes:
    body = getattr(response, "content", None)
    if body is None:
        body = response.get_data()
    return bytes(body)


def assert_replays(send: Callable[[str], Any], key: str | None = None) -> tuple[Any, Any]:
    """Send a request twice with one idempotency key (``send(key)`` sends it; ``key``: a new
    UUID unless given) and assert that the second is the first replayed: same status,
    content type and body byte for byte, ``Idempotent-Replayed: true``, the first not
    marked. Return both responses (e.g. to check what the view did once)."""
    key = key or str(uuid.uuid4())
    first = send(key)
    replay = send(key)
    assert first.headers.get(REPLAYED) is None, f"the first response says {REPLAYED}: the key was used before"
    assert replay.headers.get(REPLAYED) == "true", \
        f"the retry was not replayed (status {replay.status_code}): did the view run again? is it @idempotent, " \
        "and is the method POST, PUT, PATCH or DELETE?"
    assert replay.status_code == first.status_code, f"replayed status {replay.status_code} != {first.status_code}"
    assert replay.headers.get("Content-Type") == first.headers.get("Content-Type")
    assert _body(replay) == _body(first), "the replayed body differs from the first"
    return first, replay


def user_scope(user: Any) -> str:
    """The scope of an authenticated user's keys under ``scope="user"`` (a Django user, a
    Flask-Login user or its id)."""
    if hasattr(user, "pk"):
        return user_name(user.pk)
    if hasattr(user, "get_id"):
        return user_name(user.get_id())
    return user_name(user)


def key_lock(locks: Locks, key: str, scope: str = ANONYMOUS) -> Lock:
    """The lock of ``key`` in ``scope`` (``user_scope(user)``, ``""`` for ``scope="global"``,
    or your callable's value) in the lock family ``locks`` (the views' ``lock``, default
    ``"idempotency"``: ``django_ylock.locks("idempotency")``, ``ylock.locks(...)`` in Flask)."""
    return locks[record_id(scope, key)]


@contextlib.contextmanager
def in_flight(locks: Locks, key: str, scope: str = ANONYMOUS) -> Iterator[Lock]:
    """Hold ``key``'s lock as another request would while its view runs: requests with that
    key get 409 (or, with ``timeout``, wait) until the block ends."""
    lock = key_lock(locks, key, scope)
    with owner_scope(new_owner()):
        lock.lock(timeout=5)
        try:
            yield lock
        finally:
            lock.unlock()
