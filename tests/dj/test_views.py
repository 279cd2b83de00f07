"""@locked and the per-user middleware, through Django's test client, on real Redis."""
from __future__ import annotations

import asyncio
import threading

import pytest
from django.test import AsyncClient, Client

import django_ylock
import ylock
from tests.dj import views
from tests.helpers import Runner
from ylock.testing import free_port


def held_elsewhere(name: str, key: str, mode: str = "write") -> tuple[threading.Event, threading.Event, Runner]:
    """Hold ``locks(name)[key]`` in another thread until the returned event is set."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        lock = django_ylock.locks(name)[key]
        with (lock.write() if mode == "write" else lock.read()):
            holding.set()
            done.wait(10)
    runner = Runner(hold)
    runner.start()
    assert holding.wait(10)
    return holding, done, runner


def test_free_lock_runs_the_view(client: Client):
    response = client.post("/transfer/1/")
    assert response.status_code == 200 and response.content == b"moved from 1"


def test_the_view_runs_as_the_lock_owner(rf):
    @django_ylock.locked("accounts", key="account_id", timeout=1)
    def view(request, account_id):
        lock = django_ylock.locks("accounts")[str(account_id)]
        with lock.write(timeout=0):             # re-entry, not a wait for itself
            from django.http import HttpResponse
            return HttpResponse(str(lock.held("write")))
    assert view(rf.post("/"), account_id=41).content == b"True"


def test_contention_answers_423_with_retry_after(client: Client):
    _, done, runner = held_elsewhere("accounts", "1")
    try:
        response = client.post("/transfer/1/")
        assert response.status_code == 423
        assert response["Retry-After"] == "1"
        assert response["Content-Type"] == "application/json"
        assert response.json() == {"error": "locked", "lock": "accounts/1", "retry_after": 1,   # as Flask's
                                   "detail": "the write lock accounts/1 is busy; retry later"}
        assert client.post("/transfer/2/").status_code == 200        # other accounts are free
    finally:
        done.set()
        runner.outcome()
    assert client.post("/transfer/1/").status_code == 200


def test_two_concurrent_requests_one_gets_423():
    entered, leave = threading.Event(), threading.Event()

    @django_ylock.locked("accounts", key="account_id", timeout=0.2)
    def slow(request, account_id):
        entered.set()
        leave.wait(10)
        from django.http import HttpResponse
        return HttpResponse("slow")
    from django.test import RequestFactory
    first = Runner(lambda: slow(RequestFactory().post("/x/"), account_id=5).status_code)
    first.start()
    assert entered.wait(10)
    second = slow(RequestFactory().post("/x/"), account_id=5)
    leave.set()
    assert first.outcome() == 200 and second.status_code == 423


def test_readers_share_writers_wait(client: Client):
    _, done, runner = held_elsewhere("accounts", "3", mode="read")
    try:
        assert client.get("/balance/3/").status_code == 200
        assert client.post("/transfer/3/").status_code == 423
    finally:
        done.set()
        runner.outcome()


def test_async_view(async_client: AsyncClient):
    async def run() -> tuple[int, int]:
        free = await async_client.post("/async-transfer/4/")
        _, done, runner = await asyncio.to_thread(held_elsewhere, "accounts", "4")
        try:
            busy = await async_client.post("/async-transfer/4/")
        finally:
            done.set()
            await asyncio.to_thread(runner.outcome)
        return free.status_code, busy.status_code
    assert asyncio.run(run()) == (200, 423)


def test_class_based_view(client: Client):
    assert client.post("/cbv/6/").status_code == 200
    _, done, runner = held_elsewhere("accounts", "6")
    try:
        assert client.post("/cbv/6/").status_code == 423
    finally:
        done.set()
        runner.outcome()


def test_named_lock_without_key_and_callable_key(client: Client):
    _, done, runner = held_elsewhere("reports", "global")
    try:
        busy = Client().get("/report/")
        assert busy.status_code == 423 and busy["Retry-After"] == "7"
    finally:
        done.set()
        runner.outcome()
    assert client.get("/by-query/?acct=9").status_code == 200
    _, done, runner = held_elsewhere("accounts", "9")
    try:
        assert client.get("/by-query/?acct=9").status_code == 423
    finally:
        done.set()
        runner.outcome()


def test_engine_down_answers_503(settings, client: Client, caplog):
    settings.YLOCK = {"ENGINES": {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0",
                                              "OPTIONS": {"connect_timeout": 0.2}}}}
    response = client.post("/transfer/1/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    body = response.json()
    assert body["error"] == "lock engine unavailable" and body["lock"] == "accounts/1"
    assert "engine unavailable" in caplog.text


def test_custom_status_and_callback(settings, client: Client):
    settings.YLOCK = {**settings.YLOCK, "LOCKED_STATUS": 429,
                      "ON_LOCKED": None}
    _, done, runner = held_elsewhere("accounts", "11")
    try:
        assert client.post("/transfer/11/").status_code == 429
    finally:
        done.set()
        runner.outcome()

    from django.http import HttpResponse

    @django_ylock.locked("accounts", key="account_id", timeout=0, on_locked=lambda req, exc: HttpResponse(
        f"later: {exc.name}", status=409))
    def view(request, account_id):
        return HttpResponse("ok")
    from django.test import RequestFactory
    _, done, runner = held_elsewhere("accounts", "12")
    try:
        response = view(RequestFactory().post("/"), account_id=12)
        assert response.status_code == 409 and response.content == b"later: 12"
    finally:
        done.set()
        runner.outcome()


@pytest.mark.django_db(transaction=True)
def test_on_commit_keeps_the_lock_until_the_transaction_commits(client: Client):
    views.seen.clear()
    assert client.post("/committed/21/").status_code == 200
    assert views.seen["held_at_commit"] is True            # still held when the data became visible
    assert not django_ylock.locks("accounts")["21"].held()
    with pytest.raises(RuntimeError):
        client.post("/committed/21/?fail=1")
    assert Client().post("/transfer/21/").status_code == 200   # released after the rollback too


def test_bad_decorator_arguments_are_value_errors():
    with pytest.raises(ValueError, match="mode"):
        django_ylock.locked("x", mode="exclusive")
    with pytest.raises(ValueError, match="key"):
        django_ylock.locked("x", key=3.5)  # type: ignore[arg-type]


def test_missing_url_kwarg_is_named(rf):
    @django_ylock.locked("accounts", key="account_id")
    def view(request, pk):
        return None
    with pytest.raises(ValueError, match="no URL argument 'account_id'"):
        view(rf.post("/"), pk=1)


# -- the per-user middleware ------------------------------------------------------------------


@pytest.fixture
def user_lock(settings):
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"], "TIMEOUT": 0.2}}


@pytest.mark.django_db
def test_middleware_serialises_one_user_and_shares_reads(user_lock, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    client_a, client_b = Client(), Client()
    client_a.force_login(alice)
    client_b.force_login(bob)
    assert client_a.post("/api/plain/").status_code == 200
    _, done, runner = held_elsewhere("users", f"user-{alice.pk}")
    try:
        assert client_a.post("/api/plain/").status_code == 423        # alice's requests wait for alice
        assert client_a.get("/api/plain/").status_code == 423
        assert client_b.post("/api/plain/").status_code == 200        # bob is not held up
        assert client_a.get("/health/").status_code == 200            # outside PATHS
    finally:
        done.set()
        runner.outcome()
    _, done, runner = held_elsewhere("users", f"user-{alice.pk}", mode="read")
    try:
        assert client_a.get("/api/plain/").status_code == 200         # reads share
        assert client_a.post("/api/plain/").status_code == 423
    finally:
        done.set()
        runner.outcome()


def test_middleware_keys_api_clients_by_their_credential_and_makes_no_session(settings, user_lock):
    """A cookie-less client is its Authorization credential (hashed): a request with a token
    whose lock is held waits (423 here), one with another token runs; an anonymous request
    with nothing that identifies it takes no lock; no answer sets a session cookie.
    CLIENT_KEY changes what identifies a client, False turns it off."""
    from ylock.clients import client_name, header

    alice = client_name("Token alice-3c9", settings.SECRET_KEY)
    _, done, runner = held_elsewhere("users", alice)
    try:
        for token, status in (("alice-3c9", 423), ("bob-77a", 200), (None, 200)):
            client = Client(**({"HTTP_AUTHORIZATION": f"Token {token}"} if token else {}))
            response = client.post("/api/plain/")
            assert response.status_code == status, (token, response.content)
            assert "sessionid" not in response.cookies and not client.cookies, response.cookies
        settings.YLOCK = {**settings.YLOCK, "CLIENT_KEY": False}
        assert Client(HTTP_AUTHORIZATION="Token alice-3c9").post("/api/plain/").status_code == 200   # not keyed
        settings.YLOCK = {**settings.YLOCK, "CLIENT_KEY": header("X-Api-Key")}
        assert Client(HTTP_X_API_KEY="k-1").post("/api/plain/").status_code == 200
        assert Client(HTTP_X_API_KEY="Token alice-3c9").post("/api/plain/").status_code == 423   # same value
    finally:
        done.set()
        runner.outcome()
    settings.YLOCK = {**settings.YLOCK, "CLIENT_KEY": "no.such.key_function"}
    from django_ylock import conf

    assert [p.problem for p in conf.current().problems if "CLIENT_KEY" in p.problem]


@pytest.mark.django_db
def test_middleware_releases_when_the_view_raises(settings, user_lock, django_user_model):
    settings.YLOCK = {**settings.YLOCK, "USER_LOCK": {**settings.YLOCK["USER_LOCK"], "PATHS": ["/"]}}
    carol = django_user_model.objects.create_user("carol")
    client = Client(raise_request_exception=True)
    client.force_login(carol)
    with pytest.raises(KeyError):
        client.get("/by-query/")          # the view's key callable raises inside the user lock
    _, done, runner = held_elsewhere("users", f"user-{carol.pk}")
    done.set()                             # the user lock was free again: another owner got it at once
    runner.outcome()
    assert client.post("/api/plain/").status_code == 200


def test_async_middleware_stack(user_lock, async_client: AsyncClient):
    async def run() -> int:
        return (await async_client.post("/api/plain/")).status_code
    assert asyncio.run(run()) == 200


def test_signals_relay_core_events(client: Client):
    from django_ylock import signals
    seen: list[ylock.events.Event] = []

    def receiver(sender, event, **kwargs):
        seen.append(event)
    signals.lock_acquired.connect(receiver)
    signals.lock_released.connect(receiver)
    try:
        assert client.post("/transfer/31/").status_code == 200
    finally:
        signals.lock_acquired.disconnect(receiver)
        signals.lock_released.disconnect(receiver)
    kinds = [(e.kind, e.group, e.name) for e in seen if e.group == "accounts" and e.name == "31"]
    assert kinds == [("acquired", "accounts", "31"), ("released", "accounts", "31")]
    released = [e for e in seen if e.kind == "released"][0]
    assert released.hold is not None and released.engine == "redis"


def test_locked_view_on_zookeeper(settings, zookeeper_server, client: Client):
    settings.YLOCK = {"ENGINES": {"default": {"URL": zookeeper_server.url("/django")}}}
    assert django_ylock.engine().scheme == "zookeeper"
    assert client.post("/transfer/51/").status_code == 200
    _, done, runner = held_elsewhere("accounts", "51")
    try:
        response = client.post("/transfer/51/")
        assert response.status_code == 423 and response["Retry-After"] == "1"
    finally:
        done.set()
        runner.outcome()
    assert client.get("/balance/51/").status_code == 200


def test_prometheus_metrics_view(settings, redis_server, client: Client):
    assert client.get("/metrics").status_code == 404          # not configured: no endpoint
    settings.YLOCK = {"ENGINES": {"default": {"URL": redis_server.url, "OPTIONS": {"prefix": "dj"}}},
                      "METRICS": {"PROMETHEUS": {"NAMESPACE": "djylock"}}}
    try:
        assert client.post("/transfer/5/").status_code == 200
        response = client.get("/metrics")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
        text = response.content.decode()
        # keyed by account: labelled name="*" (lock names are labels only in groups opted in)
        assert ('djylock_events_total{engine="redis",group="accounts",mode="write",name="*",outcome="acquired"} 1.0'
                in text)
        assert 'djylock_hold_seconds_count{engine="redis",group="accounts",mode="write",name="*"} 1.0' in text
        assert 'name="5"' not in text
    finally:
        import ylock.metrics
        ylock.metrics.shutdown()


def key_off_the_loop(request) -> str | None:  # noqa: ANN001
    """A CLIENT_KEY that may block (a database lookup): it must not run in the event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return request.headers.get("X-Api-Key")
    raise AssertionError("a CLIENT_KEY that may block ran in the event loop")


def test_async_middleware_keys_api_clients_by_their_credential(settings, user_lock, async_client: AsyncClient):
    """The async stack keys a cookie-less client as the sync one does, reading the user and
    the session through Django's async API; a CLIENT_KEY that may block runs in a thread."""
    from ylock.clients import client_name

    async def post(**headers: str) -> int:
        return (await async_client.post("/api/plain/", headers=headers)).status_code
    _, done, runner = held_elsewhere("users", client_name("Token alice-3c9", settings.SECRET_KEY))
    try:
        assert asyncio.run(post(Authorization="Token alice-3c9")) == 423
        assert asyncio.run(post(Authorization="Token bob-77a")) == 200
        assert asyncio.run(post()) == 200                          # nothing identifies it: no lock
        settings.YLOCK = {**settings.YLOCK, "CLIENT_KEY": key_off_the_loop}
        assert asyncio.run(post(**{"X-Api-Key": "Token alice-3c9"})) == 423
        assert asyncio.run(post(**{"X-Api-Key": "k-2"})) == 200
    finally:
        done.set()
        runner.outcome()
