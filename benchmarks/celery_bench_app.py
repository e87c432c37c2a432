"""The Celery app that bench_celery.py and soak_celery.py run in their workers (configured by environment).

- ``BENCH_BROKER``: the broker URL (``rocketmq://host:port//``, ``redis://...``, ``pyamqp://...``);
- ``BENCH_QUEUE``: the queue the task goes to and the worker consumes;
- ``BENCH_SINK``: a directory; every process that runs the task appends one fixed-size record
  (sequence number, wall time) per run to ``<sink>/<pid>.bin`` (``O_APPEND``: one ``write`` per task, no
  lock), so the benchmark counts runs, duplicates and the time between the first and the last run;
- ``BENCH_ACKS_LATE=1``: ``task_acks_late``;
- ``BENCH_HANDLER_TOPIC`` + ``BENCH_STORE_URL``: an ``@event_handler`` on that topic, run by the worker's
  bootstep, that records each event the same way (the sequence number is the event's body).
"""

from __future__ import annotations

import os
import struct
import time

from celery import Celery

import rmq_eventstore.kombu  # noqa: F401  (registers rocketmq://)
from rmq_eventstore.celery import event_handler, install

RECORD = struct.Struct("<qd")  # sequence number, time.time() when it ran
TASK = "bench.it"

_fd: tuple[int, int] | None = None  # (pid, fd): reopened after a fork


def record(seq: int) -> None:
    """Append (seq, now) to this process's sink file."""
    global _fd
    pid = os.getpid()
    if _fd is None or _fd[0] != pid:
        path = os.path.join(os.environ["BENCH_SINK"], f"{pid}.bin")
        _fd = (pid, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    os.write(_fd[1], RECORD.pack(seq, time.time()))


def make_app(broker: str, queue: str, acks_late: bool = False) -> Celery:
    """A Celery app on `broker` whose task ``bench.it(seq)`` goes to `queue` and records that it ran."""
    app = install(Celery("bench", broker=broker, set_as_current=False))
    app.conf.update(task_ignore_result=True, task_default_queue=queue, task_acks_late=acks_late,
                    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)

    @app.task(name=TASK, shared=False)
    def it(seq: int) -> None:
        record(seq)

    return app


def read_sink(sink: str) -> list[tuple[int, float]]:
    """Every record of every process in `sink`."""
    out: list[tuple[int, float]] = []
    for name in os.listdir(sink):
        if name.endswith(".bin"):
            with open(os.path.join(sink, name), "rb") as f:
                data = f.read()
            out.extend(RECORD.iter_unpack(data[:len(data) - len(data) % RECORD.size]))
    return out


def sink_count(sink: str) -> int:
    """How many records `sink` holds (file sizes only: cheap enough to poll)."""
    n = 0
    for name in os.listdir(sink):
        if name.endswith(".bin"):
            try:
                n += os.stat(os.path.join(sink, name)).st_size // RECORD.size
            except FileNotFoundError:
                pass
    return n


if "BENCH_BROKER" in os.environ:  # a worker: `celery -A benchmarks.celery_bench_app worker`
    app = make_app(os.environ["BENCH_BROKER"], os.environ.get("BENCH_QUEUE", "bench.celery"),
                   os.environ.get("BENCH_ACKS_LATE") == "1")
    if os.environ.get("BENCH_STORE_URL"):
        app.conf.rmq_eventstore_url = os.environ["BENCH_STORE_URL"]
    if os.environ.get("BENCH_HANDLER_TOPIC"):
        @event_handler(os.environ["BENCH_HANDLER_TOPIC"], group="bench-handler")
        def handle(event) -> None:  # noqa: ANN001
            record(int(event.body))
