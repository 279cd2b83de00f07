"""Settings of the Django project that tests/web/test_limited.py serves with gunicorn
(its views: tests/web/served_urls.py)."""
import os

SECRET_KEY = "served"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django_ylock"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.web.served_urls"
DATABASES: dict[str, object] = {}
USE_TZ = True
YLOCK = {"ENGINES": {"default": {"URL": os.environ["YLOCK_TEST_URL"]}}, "LOCKS": {"exports": {"PERMITS": 2}}}
