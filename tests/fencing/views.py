"""Views of the fencing tests: a fenced write inside a ``@locked`` view, with the request's lock."""
from __future__ import annotations

from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.urls import path

import django_ylock
from tests.fencing.bankapp.models import Account


@django_ylock.locked("accounts", key="account_id", timeout=5)
def deposit(request: HttpRequest, account_id: int) -> JsonResponse:
    # The view runs as the request's owner: the family's lock for the same key is the one the
    # decorator holds, so its token is the request's fencing token.
    lock = django_ylock.locks("accounts")[str(account_id)]
    changed = django_ylock.fenced_update(Account.objects.filter(pk=account_id), lock, balance=F("balance") + 1)
    return JsonResponse({"changed": changed, "token": lock.token})


urlpatterns = [path("deposit/<int:account_id>/", deposit)]
