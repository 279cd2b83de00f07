"""Settings for the Django plugin's tests (pytest-django: DJANGO_SETTINGS_MODULE)."""
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django_ylock",
    "tests.fencing.bankapp",      # a model with a FenceField (tests/fencing)
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_ylock.middleware.PerUserLockMiddleware",
]
ROOT_URLCONF = "tests.dj.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
# Each test points YLOCK at the session's real redis-server (tests/dj/conftest.py).
YLOCK = {"ENGINES": {"default": {"URL": "local://"}}}
