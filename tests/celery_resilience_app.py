"""A Celery app for tests/test_celery_resilience.py: one task that logs each run (start and end) to a file.

Configured by environment: RESIL_BROKER (broker URL), RESIL_LOG (the run log, JSON lines), RESIL_VT
(visibility_timeout, s), RESIL_REJECT_ON_LOST ("1": task_reject_on_worker_lost), RESIL_LOST_WAIT
(worker_lost_wait, s), RESIL_BROKER_OPTIONS (JSON: settings of a local broker a worker starts), RESIL_CANCEL_ON_LOSS ("1":
worker_cancel_long_running_tasks_on_connection_loss, Celery 6's default).
"""

import json
import os
import time

from celery import Celery

import rmq_eventstore.kombu  # noqa: F401  (registers the rocketmq:// scheme)

app = Celery("resil", broker=os.environ.get("RESIL_BROKER", "rocketmq://127.0.0.1:9876//"))
app.conf.update(
    broker_transport_options={"visibility_timeout": float(os.environ.get("RESIL_VT", "4")),
                              "broker_options": json.loads(os.environ.get("RESIL_BROKER_OPTIONS", "{}"))},
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    task_acks_late=True,
    task_reject_on_worker_lost=os.environ.get("RESIL_REJECT_ON_LOST", "1") == "1",
    worker_lost_wait=float(os.environ.get("RESIL_LOST_WAIT", "10")),
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_cancel_long_running_tasks_on_connection_loss=os.environ.get("RESIL_CANCEL_ON_LOSS") == "1",
    task_default_queue="resil",
    task_ignore_result=True,
)


def _log(**row: object) -> None:
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **row}) + "\n"
    fd = os.open(os.environ["RESIL_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines of concurrent workers never mix
    finally:
        os.close(fd)


@app.task(bind=True)
def record(self, n: int, sleep: float = 0.0, sleep_once: bool = False) -> int:
    """Log the run's start and end, `sleep` seconds apart (with `sleep_once`, only on a first delivery)."""
    info = self.request.delivery_info or {}
    redelivered = bool(info.get("redelivered"))
    _log(n=n, phase="start", host=self.request.hostname, redelivered=redelivered)
    if sleep and not (sleep_once and redelivered):
        time.sleep(sleep)
    _log(n=n, phase="end", host=self.request.hostname)
    return n
