"""Settings of the reference shop: the local store under the repository's var/ and SQLite by default.

Environment: ``SHOP_DATABASE=postgres`` (with ``PGHOST``/``PGPORT``/``PGUSER``/``SHOP_DB_NAME``) for PostgreSQL,
``SHOP_STORE_URL`` for another store (``file:///path`` or ``rmq://host:9876``), ``SHOP_VAR`` for the folder of
the SQLite file and the store, ``SHOP_DEBUG=0`` to turn debug off.
"""

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("SHOP_VAR", BASE_DIR.parent / "var"))
VAR.mkdir(parents=True, exist_ok=True)  # the SQLite file lives here; the store creates its own folder
sys.path.insert(0, str(BASE_DIR.parent / "celery_app"))  # the shop's Celery app (tasks the views call)

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "reference-project-not-for-production")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
LOGIN_URL = "/admin/login/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rmq_eventstore.django",
    "orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "rmq_eventstore.django.exceptions.ConcurrencyErrorMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

if os.environ.get("SHOP_DATABASE") == "postgres":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": os.environ.get("SHOP_DB_NAME", "shop"),
        "USER": os.environ.get("PGUSER", "postgres"), "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"), "PORT": os.environ.get("PGPORT", "5432"),
    }}
else:
    # IMMEDIATE: an atomic block takes SQLite's write lock when it begins, waiting up to `timeout` for it. A deferred
    # one that read first (the order) and then writes (the event's marker) fails at once with "database is locked"
    # when another connection (the worker's handlers, the transaction watcher) is committing meanwhile.
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR / "shop.sqlite3",
                             "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"}}}

RMQ_EVENTSTORE = {
    "default": {
        "URL": os.environ.get("SHOP_STORE_URL", f"file://{VAR / 'store'}"),
        "OPTIONS": {"PRODUCER_GROUP": "shop",
                    # commitlog segment size: RocketMQ's 1 GiB by default; SHOP_COMMITLOG_MB for small disks
                    "BROKER": {"mapped_file_size_commit_log": int(os.environ.get("SHOP_COMMITLOG_MB", "1024")) << 20}},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"rmq_eventstore": {"handlers": ["console"], "level": "WARNING"}},
}

# Celery (celery_app/shopcelery): the store is the broker; results in SQLite under var/ unless overridden
STORE_URL = RMQ_EVENTSTORE["default"]["URL"]
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", STORE_URL.replace("file://", "rocketmq://", 1)
                                   if STORE_URL.startswith("file://") else STORE_URL.replace("rmq://", "rocketmq://", 1))
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", f"db+sqlite:///{VAR / 'celery-results.sqlite3'}")
CELERY_RMQ_EVENTSTORE_URL = STORE_URL
CELERY_TASK_DEFAULT_QUEUE = "shop"
CELERY_BEAT_SCHEDULE = {"summarize-sales": {"task": "shopcelery.tasks.summarize_sales", "schedule": 60.0}}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR / "celerybeat-schedule")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
