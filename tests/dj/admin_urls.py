"""URLs for the admin page's tests (tests/dj/test_admin.py installs the admin for them)."""
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
