"""The shared table's views, as a Django project writes them (ROOT_URLCONF of tests/web)."""
from __future__ import annotations

from django.http import JsonResponse
from django.urls import path

import django_ylock


@django_ylock.locked("accounts", key="account_id")
def withdraw(request, account_id):
    return JsonResponse({"ok": True})


@django_ylock.locked("accounts", key="account_id", mode="read")
def balance(request, account_id):
    return JsonResponse({"ok": True})


@django_ylock.locked("accounts", key="account_id")
async def async_withdraw(request, account_id):
    return JsonResponse({"ok": True})


@django_ylock.locked("profiles")
def profile(request):
    return JsonResponse({"ok": True})


@django_ylock.limited("exports", permits=2, key="account_id")
def export(request, account_id):
    return JsonResponse({"ok": True})


@django_ylock.limited("exports", permits=2, key="account_id")
async def async_export(request, account_id):
    return JsonResponse({"ok": True})


@django_ylock.limited("reports", key=False)          # PERMITS from the LOCKS setting
def report(request):
    return JsonResponse({"ok": True})


urlpatterns = [
    path("accounts/<str:account_id>/withdraw", withdraw),
    path("accounts/<str:account_id>", balance),
    path("async/<str:account_id>", async_withdraw),
    path("files/<path:account_id>", withdraw),
    path("profile", profile),
    path("exports/<str:account_id>", export),
    path("async-exports/<str:account_id>", async_export),
    path("reports", report),
]
