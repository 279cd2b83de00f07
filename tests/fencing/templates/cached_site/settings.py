"""A minimal Django site with one cached report (``django_ylock.cache.get_or_set``), served by
gunicorn in tests/fencing/test_gunicorn_cache.py. Everything comes from the environment."""
import os

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["django_ylock"]
ROOT_URLCONF = "urls"
DATABASES: dict = {}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                      "LOCATION": os.environ["CACHE_URL"], "KEY_PREFIX": os.environ["CACHE_PREFIX"]}}
YLOCK = {"ENGINES": {"default": {"URL": os.environ["YLOCK_URL"]}},
         "LOCKS": {"cache": {"GROUP": "cache", "LEASE": 10}}}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "WARNING"}}
