"""django_ylock: ylock's distributed read-write locks in Django, in one line.

    INSTALLED_APPS += ["django_ylock"]

    import django_ylock
    with django_ylock.lock("orders").write(timeout=5): ...
    django_ylock.locks("users")["user-42"]

    @django_ylock.locked("accounts", key="account_id", mode="write", timeout=1)
    def transfer(request, account_id): ...

    @django_ylock.limited("exports", permits=3)        # 3 per user at once, 429 beyond
    def export(request): ...

    with django_ylock.semaphores("tenants")["tenant-7"].hold(timeout=5): ...

    class Account(models.Model):                       # fenced writes (docs/fencing.md)
        fence = django_ylock.FenceField()
    django_ylock.fenced_update(Account.objects.filter(pk=pk), lock, balance=F("balance") + 10)
    django_ylock.fenced_update(qs, django_ylock.current_lock(request), ...)   # in a @locked view

    django_ylock.cache.get_or_set("report", build_report, timeout=300)   # single-flight (docs/caching.md)

    @django_ylock.idempotent()                         # a retried POST runs once (docs/idempotency.md)
    def create_payment(request): ...

See docs/django.md for the YLOCK setting, the middleware and ``manage.py ylock``.
"""
from django_ylock import cache
from django_ylock.decorators import limited, locked
from django_ylock.fencing import FenceField, fenced_save, fenced_update
from django_ylock.idempotency import idempotent
from django_ylock.registry import InjectLock, InjectLocks, engine, inject, lock, locks, semaphore, semaphores
from django_ylock.request_lock import current_lock

__all__ = ["lock", "locks", "semaphore", "semaphores", "engine", "locked", "limited", "InjectLock", "InjectLocks",
           "inject", "current_lock", "FenceField", "fenced_update", "fenced_save", "cache", "idempotent"]
