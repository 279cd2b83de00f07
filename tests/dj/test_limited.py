"""Django: @limited and named semaphores, PERMITS in the settings and their checks, the
per-user middleware with PERMITS, what the holds of a request say, the W004 pooler check.
On the session's real Redis (tests/dj/conftest.py) and PostgreSQL."""
from __future__ import annotations

import asyncio
import json
import sys
import threading

import pytest
from django.core import checks
from django.core.management import call_command
from django.http import HttpResponse
from django.test import Client, RequestFactory

import django_ylock
import ylock
from tests.dj import views
from tests.helpers import Runner, wait_until
from ylock.owner import new_owner
from ylock.testing.postgres import PostgresServer
from ylock.testing.proxy import TcpProxy


def run_checks(deploy: bool = False) -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["ylock"], include_deployment_checks=deploy)
            if m.id.startswith("django_ylock.")]


class Taken:
    """``count`` permits of ``sem`` held by owners of their own, until :meth:`give_back`."""

    def __init__(self, sem: ylock.Semaphore, count: int) -> None:
        self.sem = sem
        self.owners = [new_owner() for _ in range(count)]
        for owner in self.owners:
            assert ylock.run_as(owner, sem.try_acquire)

    def give_back(self) -> None:
        for owner in self.owners:
            ylock.run_as(owner, self.sem.release)
        self.owners = []


def test_limited_answers_429_past_its_permits_per_key(rf: RequestFactory) -> None:
    @django_ylock.limited("exports", permits=2, key="tenant")
    def export(request, tenant):
        return HttpResponse(f"export {tenant}")
    sems = django_ylock.semaphores("exports", permits=2)
    one = Taken(sems["a"], 1)
    two = None
    try:
        assert export(rf.post("/"), tenant="a").status_code == 200          # one of two taken
        two = Taken(sems["a"], 1)
        response = export(rf.post("/"), tenant="a")
        assert (response.status_code, response.reason_phrase, response["Retry-After"]) == (429, "Too Many Requests",
                                                                                           "1")
        assert json.loads(response.content) == {"error": "limited", "lock": "exports/a", "retry_after": 1,
                                   "detail": "the 2 permits of exports/a are all taken; retry later"}
        assert export(rf.post("/"), tenant="b").status_code == 200          # another key
    finally:
        one.give_back()
        if two is not None:
            two.give_back()
    assert export(rf.post("/"), tenant="a").status_code == 200


def test_limited_key_callable_status_retry_after_and_waiting(rf: RequestFactory) -> None:
    seen = []

    def key(request, *args, **kwargs):          # as @locked's: the request, then the view's arguments
        seen.append((args, kwargs))
        return request.GET["t"]

    @django_ylock.limited("exports", permits=1, key=key, status=503, retry_after=9)
    def export(request, *args, **kwargs):
        return HttpResponse("ok")

    @django_ylock.limited("exports", permits=1, key=key, timeout=5)
    def patient(request, **kwargs):
        return HttpResponse("waited")
    taken = Taken(django_ylock.semaphores("exports", permits=1)["q9"], 1)
    try:
        busy = export(rf.post("/?t=q9"), 1, tenant="x")
        assert (busy.status_code, busy["Retry-After"], json.loads(busy.content)["lock"]) == (503, "9", "exports/q9")
        assert seen == [((1,), {"tenant": "x"})]
        waiting = Runner(lambda: patient(rf.post("/?t=q9")).content)
        waiting.start()
        wait_until(lambda: any(i.waiters for i in django_ylock.engine().describe("exports")), what="a waiter")
        taken.give_back()                       # the waiting request gets the permit
        assert waiting.outcome() == b"waited"
    finally:
        taken.give_back()


@pytest.mark.django_db
def test_limited_defaults_to_one_semaphore_per_user(django_user_model) -> None:
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")

    @django_ylock.limited("exports", permits=1)
    def export(request):
        return HttpResponse("ok")
    factory = RequestFactory()

    def as_user(user):
        request = factory.post("/")
        request.user = user
        return request
    taken = Taken(django_ylock.semaphores("exports", permits=1)[f"user-{alice.pk}"], 1)
    try:
        assert export(as_user(alice)).status_code == 429
        assert export(as_user(bob)).status_code == 200
    finally:
        taken.give_back()
    assert export(as_user(alice)).status_code == 200


def test_limited_releases_when_the_view_raises(rf: RequestFactory) -> None:
    @django_ylock.limited("exports", permits=1, key=False)
    def fail(request):
        raise KeyError("boom")
    with pytest.raises(KeyError):
        fail(rf.post("/"))
    sem = django_ylock.semaphore("exports", permits=1)
    assert sem.try_acquire()                     # given back: free for anyone
    sem.release()


def test_a_cancelled_async_view_gives_its_permit_back(rf: RequestFactory) -> None:
    inside = threading.Event()

    @django_ylock.limited("exports", permits=1, key="tenant", timeout=10)
    async def export(request, tenant):
        inside.set()
        await asyncio.Event().wait()            # until cancelled (the client went away)

    async def scenario() -> None:
        sem = django_ylock.semaphores("exports", permits=1)["c1"]
        # Cancelled inside the view: the permit comes back.
        task = asyncio.create_task(export(rf.post("/"), tenant="c1"))
        await asyncio.to_thread(inside.wait, 10)
        assert not await sem.atry_acquire()     # the view holds it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await sem.atry_acquire()
        # Cancelled while it waits for a permit: it leaves the queue, its view never runs.
        inside.clear()
        task = asyncio.create_task(export(rf.post("/"), tenant="c1"))
        await asyncio.to_thread(wait_until, lambda: any(i.waiters for i in sem.engine.describe("exports")))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not inside.is_set()
        assert [i.waiters for i in sem.engine.describe("exports")] == [()]
        await sem.arelease()
    asyncio.run(scenario())
    assert not list(django_ylock.engine().describe("exports"))


def test_bad_limited_arguments_are_named_where_written(settings) -> None:
    for permits in (0, -1, True, 2.5, "3"):
        with pytest.raises(ylock.ConfigurationError, match=r"@limited permits must be a whole number"):
            django_ylock.limited("exports", permits=permits)  # type: ignore[arg-type]
    with pytest.raises(ylock.ConfigurationError, match="@limited key"):
        django_ylock.limited("exports", permits=1, key=3.5)  # type: ignore[arg-type]
    with pytest.raises(ylock.ConfigurationError, match="@limited timeout"):
        django_ylock.limited("exports", permits=1, timeout=-1)
    with pytest.raises(ylock.ConfigurationError, match=r"@limited\('exports'\) needs permits=N, or PERMITS in "
                                                       r"YLOCK\['LOCKS'\]\['exports'\]"):
        django_ylock.limited("exports")
    with pytest.raises(ylock.ConfigurationError, match="needs PERMITS"):
        django_ylock.semaphore("exports")


def test_named_semaphores_take_their_permits_from_the_settings(settings, rf: RequestFactory) -> None:
    settings.YLOCK = {**settings.YLOCK, "LOCKS": {"exports": {"GROUP": "exp", "NAME": "all", "PERMITS": 3}}}
    sem = django_ylock.semaphore("exports")
    assert (sem.group, sem.name, sem.permits) == ("exp", "all", 3)
    assert django_ylock.semaphores("exports")["t1"].permits == 3
    assert django_ylock.semaphores("exports", permits=5)["t1"].permits == 5      # given wins

    @django_ylock.limited("exports", key="tenant")
    def export(request, tenant):
        return HttpResponse("ok")
    taken = Taken(django_ylock.semaphores("exports")["t1"], 3)
    try:
        response = export(rf.post("/"), tenant="t1")
        assert response.status_code == 429 and json.loads(response.content)["lock"] == "exp/t1"
    finally:
        taken.give_back()


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "3", 10**7])
def test_a_bad_permits_setting_is_a_system_check_error(settings, bad) -> None:
    settings.YLOCK = {**settings.YLOCK, "LOCKS": {"exports": {"PERMITS": bad}},
                      "USER_LOCK": {"LOCK": "users", "PERMITS": bad}}
    found = {m.id: m.msg for m in run_checks()}
    assert set(found) == {"django_ylock.E005", "django_ylock.E010"}, found
    assert found["django_ylock.E005"].startswith("YLOCK['LOCKS']['exports']['PERMITS'] must be a whole number")
    assert found["django_ylock.E010"].startswith("YLOCK['USER_LOCK']['PERMITS'] must be a whole number")
    assert repr(bad)[:10] in found["django_ylock.E005"]


def test_good_permits_settings_pass_the_checks(settings) -> None:
    settings.YLOCK = {**settings.YLOCK, "LOCKS": {"exports": {"PERMITS": 4}},
                      "USER_LOCK": {"LOCK": "users", "PERMITS": 3}}
    assert run_checks() == []


# -- the per-user middleware with PERMITS ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)           # the requests run in threads: they see the users
def test_middleware_permits_let_n_requests_of_a_user_in(settings, django_user_model) -> None:
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"], "TIMEOUT": 0.1,
                                                      "PERMITS": 2}}
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")

    def client(user) -> Client:
        c = Client()
        c.force_login(user)
        return c
    views.park_gate = gate = views.Park()
    logged_in = [(method, client(alice)) for method in ("get", "post")]   # in this thread: the database's
    parked = [Runner(lambda m=m, c=c: getattr(c, m)("/api/park/").status_code) for m, c in logged_in]
    for runner in parked:
        runner.start()
    try:
        assert gate.wait_inside(2)                         # two of alice's requests at once, whatever method
        third = client(alice).post("/api/plain/")
        assert (third.status_code, third["Retry-After"]) == (429, "1")
        assert third.json() == {"error": "limited", "lock": f"users/user-{alice.pk}", "retry_after": 1,
                                "detail": f"the 2 permits of users/user-{alice.pk} are all taken; retry later"}
        assert client(bob).post("/api/plain/").status_code == 200         # bob is not held up
        assert client(alice).get("/health/").status_code == 200            # outside PATHS
        [info] = [i for i in django_ylock.engine().describe("users") if i.owners]
        assert info.kind == "semaphore" and len(info.owners) == 2
        assert sorted(c["what"] for c in info.context.values()) == ["GET /api/park/", "POST /api/park/"]
    finally:
        gate.leave.set()
        assert [r.outcome() for r in parked] == [200, 200]
    assert client(alice).post("/api/plain/").status_code == 200


@pytest.mark.django_db
def test_middleware_permits_one_keeps_the_read_write_lock(settings, django_user_model) -> None:
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"], "TIMEOUT": 0.1,
                                                      "PERMITS": 1}}
    alice = django_user_model.objects.create_user("alice")
    c = Client()
    c.force_login(alice)
    lock = django_ylock.locks("users")[f"user-{alice.pk}"]
    with ylock.owner_scope():
        with lock.read():
            assert c.get("/api/plain/").status_code == 200         # reads share
            assert c.post("/api/plain/").status_code == 423        # a write waits: 423, not 429


# -- what the holds of a request say --------------------------------------------------------------


def test_the_views_own_locks_say_what_the_request_does(settings) -> None:
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"]}}
    response = Client().post("/api/own/?secret=s3cret")
    assert response.status_code == 200 and response.content == b"POST /api/own/"


def test_a_run_command_says_what_it_runs(settings, redis_server, tmp_path) -> None:
    settings.YLOCK = {**settings.YLOCK, "LOCKS": {"nightly": {"GROUP": "jobs", "NAME": "report", "LEASE": 5}}}
    script = ("import json, sys, ylock; e = ylock.engine_from_url(sys.argv[1]); "
              "[i] = [i for i in e.describe('jobs') if i.name == 'report']; "
              "open(sys.argv[2], 'w').write(json.dumps([c['what'] for c in i.context.values()]))")
    call_command("ylock", "run", "nightly", "--", sys.executable, "-c", script, redis_server.url + "?prefix=dj",
                 str(tmp_path / "out"), "--password=hunter2")           # exit code 0: no SystemExit
    said = json.loads((tmp_path / "out").read_text())
    assert said == [f"manage.py ylock run {sys.executable.rsplit('/', 1)[-1]}"]     # no arguments


# -- W004: a pooler in front of a PostgreSQL engine --------------------------------------------------


def test_deploy_check_warns_about_a_proxy_in_front_of_postgresql(settings, postgres_server: PostgresServer) -> None:
    settings.YLOCK = {"ENGINES": {"default": {"URL": postgres_server.url}}}
    direct = run_checks(deploy=True)
    assert direct == [], direct
    with TcpProxy(postgres_server.port) as proxy:
        proxied_url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        settings.YLOCK = {"ENGINES": {"default": {"URL": proxied_url}}}
        [warning] = run_checks(deploy=True)
        assert warning.id == "django_ylock.W004"
        assert warning.msg.startswith("YLOCK engine 'default': a proxy stands between the PostgreSQL engine")
        assert "?scope=transaction" in warning.hint
        settings.YLOCK = {"ENGINES": {"default": {"URL": proxied_url + "?pooler=session"}}}
        assert run_checks(deploy=True) == []                        # told: it keeps sessions
        settings.YLOCK = {"ENGINES": {"default": {"URL": proxied_url + "?scope=transaction"}}}
        assert run_checks(deploy=True) == []
