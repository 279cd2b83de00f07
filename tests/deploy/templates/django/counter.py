"""A read-modify-write counter in a file (``$COUNTER_FILE``), as in any view that reads a
row, computes and saves it: each request reads the value, thinks a moment (so that
requests of other workers overlap it), and writes value + 1. Under the lock no update is
lost; without it (``unlocked``) concurrent requests overwrite each other's."""
import asyncio
import os
import threading
import time
from pathlib import Path

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

import django_ylock
from django_ylock.request_lock import request_owner, user_key

COUNTER = Path(os.environ["COUNTER_FILE"])
THINK = 0.002
LOADED = time.time()        # when this worker loaded the view (Django: at its first request)


def read() -> int:
    return int(COUNTER.read_text()) if COUNTER.exists() else 0


def write(value: int) -> None:
    # Whole or nothing (a reader never sees a half-written file): a lost update is the only fault.
    tmp = COUNTER.with_name(f"{COUNTER.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(str(value))
    os.replace(tmp, COUNTER)


def answer(request, value: int) -> JsonResponse:
    # The request's lock owner id: unique per request across every worker, or two workers'
    # requests would pass for one owner re-entering the lock.
    return JsonResponse({"value": value, "pid": os.getpid(), "owner": request_owner(request), "loaded": LOADED})


@csrf_exempt
@django_ylock.locked("counter", key=False, timeout=60)
def locked(request):
    value = read()
    time.sleep(THINK)
    write(value + 1)
    return answer(request, value + 1)


@csrf_exempt
def unlocked(request):
    value = read()
    time.sleep(THINK)
    write(value + 1)
    return answer(request, value + 1)


@csrf_exempt
@django_ylock.locked("counter", key=False, timeout=60)
async def locked_async(request):
    value = read()
    await asyncio.sleep(THINK)
    write(value + 1)
    return answer(request, value + 1)


def whoami(request):
    """Under /api/: the README's PerUserLockMiddleware holds the client's lock around it
    (read for GET), as the request's owner; none for a request that nothing identifies."""
    name = user_key(request)
    if name is None:
        return JsonResponse({"lock": None, "held": False, "owner": request_owner(request)})
    user_lock = django_ylock.locks("users")[name]
    return JsonResponse({"lock": f"{user_lock.group}/{user_lock.name}", "held": user_lock.held("read"),
                         "owner": request_owner(request)})


@csrf_exempt
def gate(request):
    """Under /api/ (the README's per-user middleware, POST: the client's write lock): says
    when it runs and waits for the test's word, so a test sees which requests of which
    clients run at once. ``$GATE_DIR/<n>.entered`` is written on entry; the view returns
    once ``$GATE_DIR/<n>.go`` exists. Times are CLOCK_MONOTONIC: one clock for every
    process of the machine."""
    gates = Path(os.environ["GATE_DIR"])
    n = request.GET["n"]
    try:
        lock = django_ylock.current_lock(request)
        held = {"lock": f"{lock.group}/{lock.name}", "token": lock.token}
    except LookupError:
        held = {"lock": None, "token": None}
    entered = time.monotonic()
    (gates / f"{n}.entered").write_text(str(entered))
    while not (gates / f"{n}.go").exists():     # the test's word: a file (its event), polled
        time.sleep(0.002)
    return JsonResponse({"n": n, **held, "entered": entered, "left": time.monotonic(), "pid": os.getpid()})
