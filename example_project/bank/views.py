"""Every feature of django_ylock in a few views (see the project's README section)."""
from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

import django_ylock
from bank.models import Account, ReportRun
from bank.services import Bank, InsufficientFunds

# The race the demo makes visible: read, think, write.
THINK = 0.002


def _deposit(account_id: int) -> int:
    account = Account.objects.get(pk=account_id)
    balance = account.balance
    time.sleep(THINK)
    account.balance = balance + 1
    account.save(update_fields=["balance"])
    return account.balance


@csrf_exempt
def deposit_unlocked(request: HttpRequest, account_id: int) -> HttpResponse:
    """The same deposit with no lock: concurrent requests overwrite each other."""
    return JsonResponse({"balance": _deposit(account_id)})


@csrf_exempt
@django_ylock.locked("accounts", key="account_id", mode="write", timeout=10)
def deposit(request: HttpRequest, account_id: int) -> HttpResponse:
    """One deposit at a time per account, across threads, processes and hosts."""
    return JsonResponse({"balance": _deposit(account_id)})


@csrf_exempt
@django_ylock.locked("accounts", key="account_id", mode="write", timeout=10, on_commit=True)
def deposit_on_commit(request: HttpRequest, account_id: int) -> HttpResponse:
    """The lock is held until the transaction commits: nobody reads the old balance after us."""
    return JsonResponse({"balance": _deposit(account_id)})


@django_ylock.locked("accounts", key="account_id", mode="read", timeout=5)
def balance(request: HttpRequest, account_id: int) -> HttpResponse:
    """Readers share the account's lock; a deposit in progress makes them wait."""
    return JsonResponse({"balance": Account.objects.get(pk=account_id).balance})


@django_ylock.locked("accounts", key="account_id", mode="read", timeout=5)
async def async_balance(request: HttpRequest, account_id: int) -> HttpResponse:
    account = await Account.objects.aget(pk=account_id)
    return JsonResponse({"balance": account.balance})


@csrf_exempt
def transfer(request: HttpRequest) -> HttpResponse:
    """POST source, target, amount: the service takes both accounts' locks (injected)."""
    try:
        entry = Bank().transfer(int(request.POST["source"]), int(request.POST["target"]),
                                int(request.POST["amount"]))
    except InsufficientFunds as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"entry": entry.pk, "token": entry.token})


#: Seconds the report takes to compute: long enough that a burst of requests all miss the cache.
REPORT_WORK = 0.3


def build_report() -> dict[str, int]:
    """The expensive report: every balance summed (and each computation recorded)."""
    total = sum(Account.objects.values_list("balance", flat=True))
    time.sleep(REPORT_WORK)                    # stands for the real work of a real report
    run = ReportRun.objects.create(total=total)
    return {"total": total, "run": run.pk}


def report(request: HttpRequest) -> HttpResponse:
    """The bank report, cached for a minute; on a miss one request in the whole deployment
    computes it while the others wait for its value (django_ylock.cache, docs/caching.md)."""
    return JsonResponse(django_ylock.cache.get_or_set("bank-report", build_report, timeout=60, lock_timeout=30))


def audit(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"total": Bank().audit()})


@csrf_exempt
def api_profile(request: HttpRequest) -> HttpResponse:
    """Under /api/: the per-user middleware serialises one user's requests."""
    return JsonResponse({"method": request.method})
