"""Two idempotent views under ATOMIC_REQUESTS: one in the request's transaction (W006), one
taken out of it as docs/idempotency.md says."""
from django.db import transaction
from django.http import HttpResponse
from django.urls import path

import django_ylock


@django_ylock.idempotent(cache=None)
def in_transaction(request: object) -> HttpResponse:
    return HttpResponse("ok")


@transaction.non_atomic_requests
@django_ylock.idempotent(cache=None)
def out_of_it(request: object) -> HttpResponse:
    with transaction.atomic():
        return HttpResponse("ok")


urlpatterns = [path("in", in_transaction), path("out", out_of_it)]
