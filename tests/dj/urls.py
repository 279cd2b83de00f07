from django.urls import path

import django_ylock.views
from tests.dj import views

urlpatterns = [
    path("transfer/<int:account_id>/", views.transfer),
    path("balance/<int:account_id>/", views.balance),
    path("async-transfer/<int:account_id>/", views.async_transfer),
    path("cbv/<int:account_id>/", views.TransferView.as_view()),
    path("report/", views.report),
    path("by-query/", views.by_query),
    path("committed/<int:account_id>/", views.committed),
    path("api/plain/", views.plain),
    path("api/park/", views.park),
    path("api/own/", views.own_lock),
    path("health/", views.plain),
    path("metrics", django_ylock.views.metrics),
]
