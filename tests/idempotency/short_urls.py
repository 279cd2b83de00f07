"""A URLconf whose one view keeps its responses 10 s: shorter than its key locks' lease."""
from django.http import HttpResponse
from django.urls import path

import django_ylock


@django_ylock.idempotent(ttl=10)
def short(request: object) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("short", short)]
