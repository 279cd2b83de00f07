"""The views of the Django project that tests/web/test_limited.py serves with gunicorn:
the Flask app's of tests/web/served.py."""
from django.http import JsonResponse
from django.urls import path

import django_ylock
from tests.web.served import park


@django_ylock.limited("exports", key="tenant")         # PERMITS from YLOCK["LOCKS"]
def export(request, tenant):
    park(f"exports/{tenant}")
    return JsonResponse({"exported": tenant})


@django_ylock.locked("accounts", key="tenant")
def account(request, tenant):
    park(f"accounts/{tenant}")
    return JsonResponse({"locked": tenant})


urlpatterns = [path("exports/<str:tenant>", export), path("accounts/<str:tenant>", account)]
