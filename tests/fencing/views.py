"""Views of the fencing tests: a fenced write inside a ``@locked`` view, with the request's lock."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.urls import path

import django_ylock
import ylock
from tests.fencing.bankapp.models import Account


@django_ylock.locked("accounts", key="account_id", timeout=5)
def deposit(request: HttpRequest, account_id: int) -> JsonResponse:
    # The view runs as the request's owner: the family's lock for the same key is the one the
    # decorator holds, so its token is the request's fencing token.
    lock = django_ylock.locks("accounts")[str(account_id)]
    changed = django_ylock.fenced_update(Account.objects.filter(pk=account_id), lock, balance=F("balance") + 1)
    return JsonResponse({"changed": changed, "token": lock.token})


@django_ylock.locked("accounts", key="account_id", timeout=5)
def deposit_current(request: HttpRequest, account_id: int) -> JsonResponse:
    # The documented way: the lock the request holds, whatever the decorator's key.
    lock = django_ylock.current_lock(request)
    changed = django_ylock.fenced_update(Account.objects.filter(pk=account_id), lock, balance=F("balance") + 1)
    return JsonResponse({"changed": changed, "token": lock.token})


@django_ylock.locked("accounts", key="account_id", timeout=5)
async def adeposit_current(request: HttpRequest, account_id: int) -> JsonResponse:
    # The ORM call runs in a thread (sync_to_async copies the context: the request's owner
    # scope goes with it, so the lock is held there too).
    lock = django_ylock.current_lock(request)
    changed = await sync_to_async(django_ylock.fenced_update)(Account.objects.filter(pk=account_id), lock,
                                                               balance=F("balance") + 1)
    return JsonResponse({"changed": changed, "token": lock.token})


@django_ylock.locked("accounts", key="account_id", timeout=5)
def deposit_stale(request: HttpRequest, account_id: int) -> JsonResponse:
    """Writes with the request's token after another holder wrote with a newer one."""
    lock = django_ylock.current_lock(request)
    try:
        django_ylock.fenced_update(Account.objects.filter(pk=account_id), lock, balance=F("balance") + 1000)
    except ylock.FencedOut as exc:
        return JsonResponse({"fenced_out": str(exc), "token": lock.token}, status=409)
    return JsonResponse({"fenced_out": None, "token": lock.token})


urlpatterns = [path("deposit/<int:account_id>/", deposit),
               path("current/<int:account_id>/", deposit_current),
               path("acurrent/<int:account_id>/", adeposit_current),
               path("stale/<int:account_id>/", deposit_stale)]
