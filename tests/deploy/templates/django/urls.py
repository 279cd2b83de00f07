"""The project's urls: the README's views (views.py and health.py, as pasted) and the
deployment tests' counter."""
from django.urls import path
from mysite import counter, health, views

urlpatterns = [
    path("accounts/<int:account_id>/withdraw", views.withdraw),
    path("accounts/<int:account_id>/balance", views.balance),
    path("ledger", views.post_entry),
    path("health", health.health),
    path("counter", counter.locked),
    path("counter/unlocked", counter.unlocked),
    path("counter/async", counter.locked_async),
    path("api/whoami", counter.whoami),
    path("api/gate", counter.gate),
]
