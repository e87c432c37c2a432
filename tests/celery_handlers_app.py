"""A Celery app for tests/test_celery_handlers.py: one event handler that appends what it handles to a file."""

import json
import os

from celery import Celery

from rmq_eventstore.celery import event_handler, install

app = install(Celery("handlers_test", broker=os.environ.get("TEST_CELERY_BROKER", "redis://127.0.0.1:6379/14")))
app.conf.rmq_eventstore_url = os.environ["TEST_STORE_URL"]
app.conf.worker_hijack_root_logger = False


@event_handler("order-events", tags="Placed || Paid", group="order-read-model")
def project(event):
    with open(os.environ["TEST_HANDLED_FILE"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "msg_id": event.msg_id, "queue": event.queue_id,
                            "offset": event.queue_offset, "n": event.data["n"], "tags": event.tags}) + "\n")
