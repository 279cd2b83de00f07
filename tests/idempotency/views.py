"""The idempotent views of tests/idempotency, as a Django project (FBV, CBV, async, Django
REST framework) and a Flask app write them: served in-process by the test clients and by
gunicorn (``-w 3``) in the process tests.

Each view counts its runs per idempotency key in Redis (``$YLOCK_TEST_COUNTER``, a URL), so
a test in another process knows how often a view ran. The request's JSON body steers it:
``{"fail": "first"}`` answers 500 on the first run of a key, ``{"raise": "first"}`` raises
on it, ``{"park": true}`` parks the request at the test's gate (tests/web/served.py) until
the test lets it go. The answer: 201, a body naming the run and the process, a header of
the view's own and a cookie (never replayed).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

import redis

from tests.web.served import park


@functools.cache
def _counter(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def run_count(view: str, key: str | None) -> int:
    """Count a run of ``view`` for ``key``; return how many there were."""
    return int(_counter(os.environ["YLOCK_TEST_COUNTER"]).incr(f"runs:{view}:{key}"))


def runs(view: str, key: str | None) -> int:
    """How often ``view`` ran for ``key``."""
    return int(_counter(os.environ["YLOCK_TEST_COUNTER"]).get(f"runs:{view}:{key}") or 0)


def pay(view: str, key: str | None, raw: bytes, token: int | None = None) -> tuple[int, dict[str, Any]]:
    """What every view does: (status, body). ``token``: the fencing token of the key's lock
    (``current_lock(..., "idempotency")``), None in the undecorated view."""
    data = json.loads(raw or b"{}")
    n = run_count(view, key)
    if data.get("park"):
        park(f"{view}/{key}")
    if data.get("raise") == "first" and n == 1:
        raise RuntimeError("the first run fails")
    if data.get("fail") == "first" and n == 1:
        return 500, {"error": "the first run fails", "run": n}
    return 201, {"view": view, "amount": data.get("amount"), "run": n, "pid": os.getpid(), "token": token}


# -- Django --------------------------------------------------------------------------------------------

def _django() -> list[Any]:
    from django.http import JsonResponse
    from django.urls import path
    from django.utils.decorators import method_decorator
    from django.views import View
    from rest_framework.decorators import api_view, renderer_classes
    from rest_framework.renderers import JSONRenderer
    from rest_framework.response import Response
    from rest_framework.views import APIView

    import django_ylock

    def token(request: Any) -> int | None:
        try:
            return django_ylock.current_lock(request, "idempotency").token
        except LookupError:
            return None

    def answer(view: str, request: Any) -> JsonResponse:
        status, body = pay(view, request.headers.get("Idempotency-Key"), request.body, token(request))
        response = JsonResponse(body, status=status)
        response["X-Payment-Run"] = str(body["run"])
        response.set_cookie("seen", "1")
        return response

    @django_ylock.idempotent()
    def fbv(request: Any) -> JsonResponse:
        return answer("fbv", request)

    @django_ylock.idempotent(timeout=60)
    def waiting(request: Any) -> JsonResponse:
        return answer("waiting", request)

    def plain(request: Any) -> JsonResponse:
        return answer("plain", request)

    @django_ylock.idempotent(cache=None)
    def engine_store(request: Any) -> JsonResponse:
        return answer("engine", request)

    @django_ylock.idempotent
    async def async_fbv(request: Any) -> JsonResponse:
        return answer("async", request)

    @method_decorator(django_ylock.idempotent(), name="dispatch")
    class Cbv(View):
        def post(self, request: Any) -> JsonResponse:
            return answer("cbv", request)

        def put(self, request: Any) -> JsonResponse:
            return answer("cbv", request)

    class Drf(APIView):
        renderer_classes = [JSONRenderer]
        authentication_classes: list[Any] = []

        @method_decorator(django_ylock.idempotent())
        def post(self, request: Any) -> Response:
            status, body = pay("drf", request.headers.get("Idempotency-Key"), request.body, token(request))
            assert request.data is not None          # DRF still parses the body after us
            return Response(body, status=status, headers={"X-Payment-Run": str(body["run"])})

    @api_view(["POST"])
    @renderer_classes([JSONRenderer])
    @django_ylock.idempotent()
    def drf_function(request: Any) -> Response:
        status, body = pay("drf-fn", request.headers.get("Idempotency-Key"), request.body, token(request))
        return Response(body, status=status, headers={"X-Payment-Run": str(body["run"])})

    return [path("fbv/pay", fbv), path("waiting/pay", waiting), path("plain/pay", plain),
            path("engine/pay", engine_store), path("async/pay", async_fbv), path("cbv/pay", Cbv.as_view()),
            path("drf/pay", Drf.as_view()), path("drf-fn/pay", drf_function)]


# -- Flask -----------------------------------------------------------------------------------------------

def create_flask_app(url: str | None = None, instance: str | None = None, **config: Any) -> Any:
    """The Flask app (gunicorn 'tests.idempotency.views:create_flask_app()'): the same views."""
    from flask import Flask, jsonify, request

    import flask_ylock
    from flask_ylock import YLock

    app = Flask("idempotent", instance_path=instance or os.environ["YLOCK_TEST_INSTANCE"])
    app.config.update(SECRET_KEY="served", YLOCK_URL=url or os.environ["YLOCK_TEST_URL"],
                      YLOCK_LOCKS={"idempotency": {"LEASE": 2}}, **config)
    ext = YLock()

    def token() -> int | None:
        try:
            return flask_ylock.current_lock("idempotency").token
        except LookupError:
            return None

    def answer(view: str) -> Any:
        status, body = pay(view, request.headers.get("Idempotency-Key"), request.get_data(), token())
        response = jsonify(body)
        response.status_code = status
        response.headers["X-Payment-Run"] = str(body["run"])
        response.set_cookie("seen", "1")
        return response

    @app.post("/fbv/pay")
    @ext.idempotent()
    def fbv() -> Any:
        return answer("fbv")

    @app.post("/waiting/pay")
    @ext.idempotent(timeout=60)
    def waiting() -> Any:
        return answer("waiting")

    @app.post("/plain/pay")
    def plain() -> Any:
        return answer("plain")

    @app.post("/async/pay")
    @ext.idempotent
    async def async_fbv() -> Any:
        return answer("async")

    ext.init_app(app)
    return app
