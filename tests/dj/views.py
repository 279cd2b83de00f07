import threading

from django.db import transaction
from django.http import HttpResponse
from django.utils.decorators import method_decorator
from django.views import View

import django_ylock

seen: dict[str, object] = {}


@django_ylock.locked("accounts", key="account_id", mode="write", timeout=0.2)
def transfer(request, account_id):
    return HttpResponse(f"moved from {account_id}")


@django_ylock.locked("accounts", key="account_id", mode="read", timeout=0.2)
def balance(request, account_id):
    return HttpResponse(f"balance of {account_id}")


@django_ylock.locked("accounts", key="account_id", mode="write", timeout=0.2)
async def async_transfer(request, account_id):
    return HttpResponse(f"async moved from {account_id}")


@method_decorator(django_ylock.locked("accounts", key="account_id", timeout=0.2), name="dispatch")
class TransferView(View):
    def post(self, request, account_id):
        return HttpResponse(f"cbv moved from {account_id}")


@django_ylock.locked("reports", key=False, timeout=0.2, retry_after=7)
def report(request):
    return HttpResponse("report")


@django_ylock.locked("accounts", key=lambda request, **kw: request.GET["acct"], timeout=0.2)
def by_query(request):
    return HttpResponse("by query")


@django_ylock.locked("accounts", key="account_id", timeout=0.2, on_commit=True)
def committed(request, account_id):
    lock = django_ylock.locks("accounts")[str(account_id)]
    transaction.on_commit(lambda: seen.__setitem__("held_at_commit", lock.held("write")))
    if request.GET.get("fail"):
        raise RuntimeError("rolled back")
    return HttpResponse("committed")


def plain(request):
    return HttpResponse("plain")


class Park:
    """Holds requests of the ``park`` view until the test lets them go; counts them in."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.inside = 0
        self.leave = threading.Event()

    def wait_inside(self, count: int, timeout: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.inside >= count, timeout)


park_gate = Park()


def park(request):
    with park_gate.changed:
        park_gate.inside += 1
        park_gate.changed.notify_all()
    try:
        assert park_gate.leave.wait(10), "the test never let the request go"
    finally:
        with park_gate.changed:
            park_gate.inside -= 1
    return HttpResponse("parked")


def own_lock(request):
    """Takes a lock of its own: it says what the request is doing too."""
    lock = django_ylock.locks("accounts")["own"]
    with lock.write(timeout=1):
        info = [i for i in lock.engine.describe("accounts") if i.name == "own"]
        return HttpResponse(next(iter(info[0].context.values()))["what"])
