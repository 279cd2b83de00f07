from django.urls import path

from bank import views

urlpatterns = [
    path("accounts/<int:account_id>/deposit-unlocked", views.deposit_unlocked),
    path("accounts/<int:account_id>/deposit", views.deposit),
    path("accounts/<int:account_id>/deposit-on-commit", views.deposit_on_commit),
    path("accounts/<int:account_id>/balance", views.balance),
    path("accounts/<int:account_id>/async-balance", views.async_balance),
    path("transfer", views.transfer),
    path("audit", views.audit),
    path("report", views.report),
    path("api/profile", views.api_profile),
]
