"""What :mod:`bench.scale` runs in spawned processes (a fresh interpreter each): the Cluster's
hammering workers, the threads queued behind a holder, the Django admin page rendered."""
from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from typing import Any

import redis

import ylock

__all__ = ["admin_page", "hammer", "queue_threads"]


def hammer(url: str, group: str, names: list[str], stop_path: str, timeout: float, threads: int) -> dict[str, Any]:
    """Take the write locks of ``names`` at random in ``threads`` threads until ``stop_path``
    exists; return the holds, the calls' outcomes and durations, and the redirections met."""
    import random

    engine = ylock.engine_from_url(url)
    records: list[tuple[str, str, int, float, float]] = []
    calls: list[tuple[str, float, str]] = []
    lost: list[str] = []

    def run(seed: str) -> None:
        rng = random.Random(seed)
        while not os.path.exists(stop_path):
            name = rng.choice(names)
            lock = ylock.Lock(engine, group, name, lease=5.0)
            started = time.monotonic()
            try:
                lock.lock(timeout=timeout)
            except ylock.LockError as exc:
                calls.append(("lock", time.monotonic() - started, type(exc).__name__))
                continue
            granted = time.monotonic()
            calls.append(("lock", granted - started, "ok"))
            token = lock.token
            time.sleep(0.002)
            ended = time.monotonic()
            try:
                lock.unlock()
                calls.append(("unlock", time.monotonic() - ended, "ok"))
            except ylock.LockError as exc:
                calls.append(("unlock", time.monotonic() - ended, type(exc).__name__))
                if isinstance(exc, ylock.LockLost):
                    lost.append(name)
            records.append((name, ylock.current_owner(), int(token or 0), granted, ended))

    workers = [threading.Thread(target=run, args=(f"{os.getpid()}-{i}",)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out = {"records": records, "calls": calls, "lost": lost, "redirections": engine.cluster_redirections()}
    engine.close()
    return out


def queue_threads(url: str, group: str, name: str, count: int, ready: Any) -> dict[str, Any]:
    """Queue ``count`` threads for one fair lock (the parent holds it), each taking it once
    and releasing at once, bumping a non-atomic counter inside; return what each saw."""
    engine = ylock.engine_from_url(url)
    counter = redis.Redis.from_url(url)
    seen: list[tuple[str, int, float, float]] = []
    errors: list[str] = []

    def run() -> None:
        lock = ylock.Lock(engine, group, name, fair=True, lease=30.0)
        try:
            lock.lock(timeout=300)
        except ylock.LockError as exc:
            errors.append(repr(exc))
            return
        got = time.monotonic()
        value = int(counter.get(f"{group}:counter") or 0)
        counter.set(f"{group}:counter", value + 1)
        token = int(lock.token or 0)
        released = time.monotonic()
        lock.unlock()
        seen.append((ylock.current_owner(), token, got, released))

    threads = [threading.Thread(target=run) for _ in range(count)]
    ready.wait(60)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    return {"seen": seen, "errors": errors}


def admin_page(url: str, group: str | None, page: int = 1) -> dict[str, Any]:
    """Render the Django admin's Locks page for an engine at ``url`` (a spawned process:
    Django is configured once per process); return seconds per render and what it showed."""
    import types

    import django
    from django.conf import settings

    urls = types.ModuleType("bench_scale_urls")
    sys.modules["bench_scale_urls"] = urls
    settings.configure(
        SECRET_KEY="bench", DEBUG=False, ALLOWED_HOSTS=["*"], USE_TZ=True, ROOT_URLCONF="bench_scale_urls",
        INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions", "django.contrib.messages", "django_ylock"],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware",
                    "django.contrib.messages.middleware.MessageMiddleware"],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                    "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                       "django.contrib.auth.context_processors.auth",
                                                       "django.contrib.messages.context_processors.messages"]}}],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        YLOCK={"ENGINES": {"default": {"URL": url}}})
    django.setup()
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.urls import path

    urls.urlpatterns = [path("admin/", admin.site.urls)]  # type: ignore[attr-defined]
    call_command("migrate", verbosity=0)
    user = User.objects.create_superuser("bench", "bench@example.com", "pw")
    client = Client()
    client.force_login(user)
    query = f"?p={page}" + (f"&group={group}" if group else "")
    times, size, status = [], 0, 0
    for _ in range(5):
        began = time.perf_counter()
        answer = client.get(f"/admin/django_ylock/lock/{query}")
        times.append(time.perf_counter() - began)
        status, size = answer.status_code, len(answer.content)
    text = answer.content.decode()
    total = text.split('class="ylock-quiet ylock-total">&middot; ', 1)[1].split(" ", 1)[0] if "ylock-total" in text \
        else None
    return {"seconds": statistics.median(times), "first_seconds": times[0], "status": status, "bytes": size,
            "rows": text.count('class="ylock-row'), "total": total}
