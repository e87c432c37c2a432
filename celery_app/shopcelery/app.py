"""The Celery app: configured from the shop's Django settings (``CELERY_*``), the store as its broker.

Defaults (no server to install): broker ``rocketmq:///<repo>/var/store`` (the store's broker process is found,
or started, as the web app does), result backend ``db+sqlite:///<repo>/var/celery-results.sqlite3``;
``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND`` in the environment change them (e.g. ``redis://...``).
"""

import os
import sys
from pathlib import Path

from celery import Celery

import rmq_eventstore.kombu  # noqa: F401  (registers the rocketmq:// transport alias with kombu)
from rmq_eventstore.celery import install

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "django_app"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = install(Celery("shop"))
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["shopcelery"], related_name="tasks")
app.autodiscover_tasks(["shopcelery"], related_name="handlers")
