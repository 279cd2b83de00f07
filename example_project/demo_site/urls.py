from django.urls import include, path

import django_ylock.views

urlpatterns = [path("", include("bank.urls")), path("metrics", django_ylock.views.metrics)]
