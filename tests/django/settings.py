"""Minimal Django settings for the tests of the Django face (`rmq_eventstore.django`).

Tests point ``RMQ_EVENTSTORE`` at their own ``tmp_path`` with pytest-django's ``settings`` fixture; the
default below is a fresh temporary directory, so nothing touches a real store.
"""

import os
import tempfile

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rmq_eventstore.django",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
RMQ_EVENTSTORE = {
    "default": {
        "URL": "file://" + os.environ.get("RMQ_EVENTSTORE_TEST_STORE",
                                          os.path.join(tempfile.gettempdir(), f"rmq-eventstore-test-{os.getpid()}")),
    },
}
