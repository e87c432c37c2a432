"""Settings of the Django face's tests: SQLite by default, PostgreSQL with RMQ_TEST_DB=postgres."""

import os
import tempfile

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.django_face.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rmq_eventstore.django",
    "tests.django_face.testapp",
]
MIDDLEWARE = [
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
STATIC_URL = "/static/"

if os.environ.get("RMQ_TEST_DB") == "postgres":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": os.environ.get("RMQ_TEST_DB_NAME", "rmq_eventstore"),
        "USER": "postgres",
        "HOST": os.environ.get("PGHOST", "127.0.0.1"), "PORT": os.environ.get("PGPORT", "5432"),
    }}
else:
    _db_dir = os.path.join(tempfile.gettempdir(), f"rmq-django-db-{os.getpid()}")
    os.makedirs(_db_dir, exist_ok=True)
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("RMQ_TEST_DB_NAME") or os.path.join(_db_dir, "db.sqlite3"),
        "TEST": {"NAME": os.path.join(_db_dir, "test.sqlite3")},
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},  # rmq_eventstore.W002
    }}

RMQ_EVENTSTORE = {
    "default": {
        # tests point the alias at their own tmp_path (conftest.store_at); this default only names a path
        "URL": os.environ.get("RMQ_TEST_STORE_URL") or "file://" + os.path.join(tempfile.gettempdir(),
                                                                              f"rmq-django-store-{os.getpid()}"),
        "OPTIONS": {"MODE": "embedded", "PRODUCER_GROUP": "django_tests",
                    "BROKER": {"transaction_timeout": 1000, "transaction_check_interval": 500,
                               "mapped_file_size_commit_log": 4 * 1024 * 1024,
                               "mapped_file_size_consume_queue": 20 * 10_000, "max_hash_slot_num": 4096,
                               "max_index_num": 16_384}},
    },
}
