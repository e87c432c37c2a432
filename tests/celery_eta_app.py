"""A Celery app for tests/test_celery_eta.py: one task that logs its run, and a `task_received` hook that logs
when a worker got each task (JSON lines, one `os.write` each, so concurrent workers never mix lines).

Configured by environment: ETA_BROKER (broker URL), ETA_LOG (the log), ETA_TIMERS ("0": transport option
eta_timers False), ETA_VT (visibility_timeout, s; default 3600 as Redis: a task that waits for it is missing).
"""

import json
import os
import time

from celery import Celery
from celery.signals import task_received

import rmq_eventstore.kombu  # noqa: F401  (registers the rocketmq:// scheme)

app = Celery("eta", broker=os.environ.get("ETA_BROKER", "rocketmq://127.0.0.1:9876//"))
app.conf.update(
    broker_transport_options={"visibility_timeout": float(os.environ.get("ETA_VT", "3600")),
                              "eta_timers": os.environ.get("ETA_TIMERS", "1") != "0"},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="eta",
    task_ignore_result=True,
)


def _log(**row: object) -> None:
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **row}) + "\n"
    fd = os.open(os.environ["ETA_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task_received.connect
def _received(request: object = None, **kwargs: object) -> None:
    try:
        n = request.args[0]  # type: ignore[union-attr]
    except (AttributeError, IndexError, TypeError):
        return
    info = getattr(request, "delivery_info", None) or {}
    _log(n=n, phase="received", host=getattr(request, "hostname", ""), redelivered=bool(info.get("redelivered")))


@app.task(bind=True)
def record(self, n: int, eta: float) -> int:
    """Log the run: `n`, its eta (epoch s) and the worker."""
    info = self.request.delivery_info or {}
    _log(n=n, phase="start", eta=eta, host=self.request.hostname, redelivered=bool(info.get("redelivered")))
    return n
