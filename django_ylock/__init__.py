"""django_ylock: ylock's distributed read-write locks in Django, in one line.

    INSTALLED_APPS += ["django_ylock"]

    import django_ylock
    with django_ylock.lock("orders").write(timeout=5): ...
    django_ylock.locks("users")["user-42"]

    @django_ylock.locked("accounts", key="account_id", mode="write", timeout=1)
    def transfer(request, account_id): ...

See README.md for the YLOCK setting, the middleware and ``manage.py ylock``.
"""
from django_ylock.decorators import locked
from django_ylock.registry import InjectLock, InjectLocks, engine, inject, lock, locks

__all__ = ["lock", "locks", "engine", "locked", "InjectLock", "InjectLocks", "inject"]
