"""A locked Django view while its Redis is frozen: the request answers 503 within one socket
timeout, and once the server thaws the next request for the same lock waits no longer than
the waiter lease (the frozen request's acquisition, run by the server when it thawed, granted
the lock to a caller that had given up: that grant lasts the waiter lease, not the lease).

This module is also the test's URLconf (``ROOT_URLCONF``): one view that writes through the
fenced register and the unfenced counter inside its lock."""
from __future__ import annotations

import time

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

import django_ylock
import ylock
from tests.faults import SLACK, Journal, owners, timed
from tests.faults.workers import write_inside

pytestmark = pytest.mark.slow

#: The test's journal, which the view writes through (set by the test).
JOURNAL: list[Journal] = []


@django_ylock.locked("faults", key="account_id", timeout=8)
def withdraw(request: HttpRequest, account_id: int) -> HttpResponse:
    lock = django_ylock.locks("faults")[str(account_id)]
    record = write_inside(lock, "view", JOURNAL[0].checkers, writes=1, release=False)   # the decorator releases
    record.outcome = "released"
    JOURNAL[0].add(record)
    return HttpResponse(f"withdrawn from {account_id} with token {record.token}")


urlpatterns = [path("withdraw/<int:account_id>/", withdraw)]


def test_frozen_redis_answers_503_in_time_and_the_next_request_waits_the_waiter_lease_only(
        settings, own_redis, journal, figures):
    settings.ROOT_URLCONF = __name__
    settings.YLOCK = {"ENGINES": {"default": {"URL": own_redis.url, "OPTIONS": {"socket_timeout": 0.5}}},
                      # Polls up to 1.5 s apart: a 4.5 s waiter lease (the default is 1.5 s), so
                      # the frozen request's unseen grant is still there to be seen on a loaded machine.
                      "LOCKS": {"faults": {"LEASE": 30, "POLLING": {"MAXIMUM": 1.5}}}}
    JOURNAL[:] = [journal]
    client = Client()
    assert client.post("/withdraw/7/").status_code == 200             # warm: the engine is built and connected
    own_redis.pause()
    try:
        frozen = timed(client.post, "/withdraw/7/").within(0.5 - 0.02, 0.5 + SLACK, "a request with Redis frozen")
    finally:
        own_redis.resume()
    thawed = time.monotonic()
    assert frozen.result.status_code == 503, frozen.result
    assert frozen.result.json()["error"] == "lock engine unavailable"
    (ghost,), _ = owners(django_ylock.engine(), "faults", "7")        # the frozen request's grant, run on thaw
    after = timed(client.post, "/withdraw/7/")
    assert after.result.status_code == 200, after.result
    waited = after.started + after.elapsed - thawed
    lease = ylock.Polling(maximum=1.5).waiter_lease
    assert lease - 0.5 < waited < lease + 1.5 + SLACK, f"the next request got the lock {waited:.3f} s after the thaw"
    verdict = journal.check()
    figures(f"Django view, Redis frozen: 503 after {frozen.elapsed:.3f} s (socket_timeout 0.5); the next request "
            f"got the lock {waited:.3f} s after the thaw (waiter lease {lease} s, lock lease 30 s); {verdict}")
