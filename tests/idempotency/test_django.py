"""@django_ylock.idempotent through Django's test client, on a real Redis (records in a Redis
cache, or on the engine's server): every answer of the table in ylock.idempotency, for a
function view, a class-based view, an async view and Django REST framework views."""
from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import Client

from tests.idempotency.views import runs

VIEWS = ["fbv", "cbv", "async", "drf", "drf-fn", "engine"]


def post(path: str, key: str | None, body: Any = None, method: str = "post", **headers: str) -> Any:
    extra = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    extra.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    return getattr(Client(), method)(path, json.dumps(body or {"amount": 10}), content_type="application/json",
                                     **extra)


@pytest.mark.parametrize("view", VIEWS)
def test_a_retry_replays_the_first_response_byte_for_byte(django_site: str, view: str) -> None:
    key = uuid.uuid4().hex
    first = post(f"/{view}/pay", key)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    for _ in range(2):
        again = post(f"/{view}/pay", key)
        assert again.status_code == 201
        assert again.content == first.content
        assert again["Content-Type"] == first["Content-Type"] == "application/json"
        assert again["Idempotent-Replayed"] == "true"
        assert again["X-Payment-Run"] == "1"
        assert not again.cookies                 # the view's cookie is not replayed
    assert runs(view, key) == 1
    assert json.loads(first.content)["run"] == 1
    assert isinstance(json.loads(first.content)["token"], int)   # current_lock(request, "idempotency") in the view


@pytest.mark.parametrize("view", VIEWS)
def test_the_same_key_for_another_request_is_422(django_site: str, view: str) -> None:
    key = uuid.uuid4().hex
    assert post(f"/{view}/pay", key).status_code == 201
    other = post(f"/{view}/pay", key, {"amount": 11})
    assert other.status_code == 422
    assert other.json()["error"] == "idempotency key reused"
    assert post(f"/{view}/pay?x=1", key).status_code == 422          # another path (query)
    assert runs(view, key) == 1


def test_another_method_on_the_same_view_is_422(django_site: str) -> None:
    key = uuid.uuid4().hex
    assert post("/cbv/pay", key).status_code == 201
    assert post("/cbv/pay", key, method="put").status_code == 422


@pytest.mark.parametrize("view", VIEWS)
def test_a_missing_or_bad_key_is_400(django_site: str, view: str) -> None:
    before = runs(view, None)
    missing = post(f"/{view}/pay", None)
    assert missing.status_code == 400
    assert missing.json()["error"] == "idempotency key missing"
    assert missing.json()["header"] == "Idempotency-Key"
    long = post(f"/{view}/pay", "k" * 256)
    assert long.status_code == 400 and long.json()["error"] == "idempotency key too long"
    assert post(f"/{view}/pay", "k" * 255).status_code == 201      # the limit itself is fine
    assert runs(view, None) == before


@pytest.mark.parametrize("view", ["fbv", "async", "drf"])
def test_a_500_or_an_exception_is_not_stored(django_site: str, view: str) -> None:
    key = uuid.uuid4().hex
    failed = post(f"/{view}/pay", key, {"fail": "first"})
    assert failed.status_code == 500
    retried = post(f"/{view}/pay", key, {"fail": "first"})
    assert retried.status_code == 201 and "Idempotent-Replayed" not in retried.headers
    assert post(f"/{view}/pay", key, {"fail": "first"})["Idempotent-Replayed"] == "true"
    assert runs(view, key) == 2

    key = uuid.uuid4().hex
    client = Client(raise_request_exception=False)
    raised = client.post(f"/{view}/pay", json.dumps({"raise": "first"}), content_type="application/json",
                         HTTP_IDEMPOTENCY_KEY=key)
    assert raised.status_code == 500
    assert post(f"/{view}/pay", key, {"raise": "first"}).status_code == 201
    assert runs(view, key) == 2


def test_safe_methods_pass_through(django_site: str) -> None:
    assert Client().get("/cbv/pay", HTTP_IDEMPOTENCY_KEY="k").status_code == 405      # the view's own answer


@pytest.mark.django_db
@pytest.mark.parametrize("view", ["fbv", "async"])
def test_two_users_equal_keys_are_independent(django_site: str, django_user_model: Any, view: str) -> None:
    key = uuid.uuid4().hex
    clients = []
    for name in ("ann", "bob"):
        client = Client()
        client.force_login(django_user_model.objects.create_user(name))
        clients.append(client)
    ann, bob = (c.post(f"/{view}/pay", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
                for c in clients)
    assert ann.status_code == bob.status_code == 201
    assert "Idempotent-Replayed" not in bob.headers and runs(view, key) == 2
    again = clients[1].post(f"/{view}/pay", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.content == bob.content and again["Idempotent-Replayed"] == "true"
    anonymous = post(f"/{view}/pay", key, {})
    assert "Idempotent-Replayed" not in anonymous.headers and runs(view, key) == 3


def test_in_flight_is_409_with_retry_after(django_site: str, ylock_idempotency: Any, settings: Any) -> None:
    key = uuid.uuid4().hex
    with ylock_idempotency.in_flight(key):
        busy = post("/fbv/pay", key)
    assert busy.status_code == 409
    assert busy["Retry-After"] == "1"
    assert busy.json()["error"] == "idempotency key in use"
    assert runs("fbv", key) == 0
    assert post("/fbv/pay", key).status_code == 201
