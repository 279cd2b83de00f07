"""Settings of the Django project that tests/idempotency serves with gunicorn: the records
in a Redis cache, the key locks on the same server with a 2 s lease."""
import os

SECRET_KEY = "served"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_ylock"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.idempotency.urls"
DATABASES: dict[str, object] = {}
USE_TZ = True
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                      "LOCATION": os.environ["YLOCK_TEST_COUNTER"], "KEY_PREFIX": os.environ["YLOCK_TEST_PREFIX"]}}
YLOCK = {"ENGINES": {"default": {"URL": os.environ["YLOCK_TEST_URL"]}}, "LOCKS": {"idempotency": {"LEASE": 2}}}
# A failing request's traceback goes to gunicorn's output (the test's report shows it).
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR"}}}
