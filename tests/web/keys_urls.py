"""Django views of tests/web/test_keys.py and test_current_lock.py (their ROOT_URLCONF): a
view answers with the key it got, the name and token of the lock the request holds
(``django_ylock.current_lock``) and, for locks, the token ``describe()`` shows for it."""
from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path
from django.utils.decorators import method_decorator
from django.views import View

import django_ylock


def holding(request: HttpRequest, key: Any = None, name: str | None = None) -> dict[str, Any]:
    """What the request holds, as the view sees it (sync: describe() may do network I/O)."""
    lock = django_ylock.current_lock(request, name)
    shown = [i.token for i in django_ylock.engine().describe(lock.group) if i.name == lock.name and i.owners]
    return {"key": key, "kind": type(lock).__name__, "group": lock.group, "name": lock.name,
            "token": lock.token, "described": shown, "held": lock.held()}


@django_ylock.locked("accounts", key="key")
def sync_view(request: HttpRequest, key: str) -> JsonResponse:
    return JsonResponse(holding(request, key))


@django_ylock.locked("accounts", key="key")
async def async_view(request: HttpRequest, key: str) -> JsonResponse:
    return JsonResponse(await sync_to_async(holding)(request, key))


@django_ylock.limited("exports", permits=2, key="key")
def limited_view(request: HttpRequest, key: str) -> JsonResponse:
    return JsonResponse(holding(request, key))


@django_ylock.locked("accounts", key=lambda request, **kwargs: request.GET["k"])
def callable_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(holding(request, request.GET["k"]))


@django_ylock.locked("profiles")                 # the user's (here: the session's) lock
def user_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(holding(request))


@django_ylock.locked("accounts", key="key")
@django_ylock.locked("profiles")
def nested_view(request: HttpRequest, key: str) -> JsonResponse:
    return JsonResponse({"inner": holding(request), "accounts": holding(request, name="accounts"),
                         "profiles": holding(request, name="profiles"), "users": holding(request, name="users")})


@method_decorator(django_ylock.locked("accounts", key="key"), name="dispatch")
class AccountView(View):
    def get(self, request: HttpRequest, key: str) -> JsonResponse:
        return JsonResponse(holding(self.request, key))


@method_decorator(django_ylock.locked("accounts", key="key"), name="dispatch")
class AsyncAccountView(View):
    async def get(self, request: HttpRequest, key: str) -> JsonResponse:
        return JsonResponse(await sync_to_async(holding)(self.request, key))


def plain_view(request: HttpRequest) -> JsonResponse:
    try:
        django_ylock.current_lock(request)
    except LookupError as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"error": None})


def user_lock_view(request: HttpRequest) -> JsonResponse:
    """Under PerUserLockMiddleware only (when USER_LOCK covers it)."""
    return JsonResponse(holding(request))



urlpatterns = [
    path("s/<str:key>", sync_view),
    path("p/<path:key>", sync_view),
    re_path(r"^e/(?P<key>.*)$", sync_view),       # any value, the empty one too
    path("a/<path:key>", async_view),
    path("l/<path:key>", limited_view),
    path("c", callable_view),
    path("u", user_view),
    path("n/<str:key>", nested_view),
    path("cbv/<str:key>", AccountView.as_view()),
    path("acbv/<str:key>", AsyncAccountView.as_view()),
    path("plain", plain_view),
    path("api/me", user_lock_view),
]
