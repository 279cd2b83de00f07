"""``/report``: the cached report. Its computation counts itself in $COUNT_FILE (one line per
call, O_APPEND), waits (bounded) until $WAITERS other requests queue for the key's lock, so a
stampede is proven rather than assumed, and with $FAIL_FIRST the first call raises."""
import os
import time

from django.http import JsonResponse
from django.urls import path

import django_ylock


def calls():
    try:
        with open(os.environ["COUNT_FILE"], encoding="utf-8") as file:
            return file.read().split()
    except FileNotFoundError:
        return []


def build_report():
    engine = django_ylock.engine()
    deadline = time.monotonic() + 20
    queued = 0
    while time.monotonic() < deadline:
        queued = sum(len(i.waiters) for i in engine.describe("cache"))
        if queued >= int(os.environ["WAITERS"]):
            break
        time.sleep(0.02)
    first = not calls()
    with open(os.environ["COUNT_FILE"], "a", encoding="utf-8") as file:
        file.write(f"{os.getpid()}\n")
    if first and os.environ.get("FAIL_FIRST"):
        raise RuntimeError("the first report failed")
    return {"computed_by": os.getpid(), "queued": queued}


def report(request):
    value = django_ylock.cache.get_or_set("report", build_report, timeout=300, lock_timeout=60)
    return JsonResponse({"value": value, "pid": os.getpid()})


urlpatterns = [path("report", report)]
