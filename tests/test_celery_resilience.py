"""At-least-once with real processes: Celery workers on `rmq_eventstore.kombu`, a broker process, SIGKILLs.

- A worker killed mid-task (`acks_late`): its pool child (the task is given back at once with
  `task_reject_on_worker_lost`), or the whole worker (the task comes back after `visibility_timeout`, the
  broker's revive): the task runs again on the other worker.
- The broker SIGKILLed while a producer publishes and workers consume, then restarted on the same store
  and ports: every publish `apply_async` returned for runs, duplicates are bounded, and the workers resume
  by themselves (Celery's "Connection to broker lost ... re-establish" path).
- A silent network stall, as Celery's `t/integration/test_connection_recovery.py` makes with its
  BlackholeProxy: a TCP proxy between the workers and the broker stops forwarding without FIN or RST; the
  worker notices within a bounded time, reconnects when the proxy forwards again, loses no task, and a
  worker stopped while the network is stalled exits in bounded time.

Timings measured here are printed (`-s`) and summarised in the README ("What survives what").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GEOMETRY = {"mappedFileSizeCommitLog": 4 << 20, "mappedFileSizeConsumeQueue": 200_000, "maxHashSlotNum": 4096,
            "maxIndexNum": 16384}
VT = 3.0  # visibility_timeout of these tests (s)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(cond: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def runs(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class BrokerProcess:
    """`python -m rmq_eventstore serve` on a store with fixed ports, so a restart comes back where it was."""

    def __init__(self, store: Path, extra_conf: dict[str, object] | None = None) -> None:
        self.store = store
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        self.namesrv = f"127.0.0.1:{self.namesrv_port}"
        store.mkdir(parents=True, exist_ok=True)
        self.conf = store.parent / f"{store.name}.conf"
        self.conf.write_text("".join(f"{k}={v}\n" for k, v in {**GEOMETRY, **(extra_conf or {})}.items()))
        self.log = store.parent / f"{store.name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rmq_eventstore", "serve", "--store", str(self.store), "-c", str(self.conf),
                 "--namesrv-port", str(self.namesrv_port), "--broker-port", str(self.broker_port)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        ok = wait_for(lambda: (self.store / "broker.json").exists() or self.proc.poll() is not None, 30)
        assert ok and self.proc.poll() is None, "broker did not start:\n" + tail(self.log)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Worker:
    """A real `celery worker` on tests/celery_resilience_app.py, in its own session (killpg kills it all)."""

    def __init__(self, tmp: Path, name: str, broker_url: str, run_log: Path, pool: str = "prefork",
                 concurrency: int = 1, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = tmp / f"worker-{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RESIL_BROKER": broker_url, "RESIL_LOG": str(run_log),
               "RESIL_VT": str(VT), **(env or {})}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.celery_resilience_app", "worker", "-P", pool,
                 "-c", str(concurrency), "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "INFO"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        ok = wait_for(lambda: " ready." in self.text() or self.proc.poll() is not None, timeout, 0.1)
        assert ok and self.proc.poll() is None, f"worker {self.name} did not start:\n" + tail(self.log)

    def children(self) -> list[int]:
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def killpg(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> float:
        """SIGTERM (warm shutdown); the seconds it took to exit. Kills the session if it does not exit."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        took = time.monotonic() - t0
        self.killpg()
        return took


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], object]]]:
    """Functions to call at teardown, last registered first (workers before the broker)."""
    todo: list[Callable[[], object]] = []
    yield todo
    for f in reversed(todo):
        try:
            f()
        except Exception:
            pass


@pytest.fixture
def broker(tmp_path: Path, cleanup: list) -> BrokerProcess:
    b = BrokerProcess(tmp_path / "store")
    b.start()
    cleanup.append(b.stop)
    return b


def producer_app(broker_url: str):  # type: ignore[no-untyped-def]
    """The test process's own Celery app (a producer), as the web app would have."""
    from celery import Celery

    import rmq_eventstore.kombu  # noqa: F401

    app = Celery("resil", broker=broker_url, set_as_current=False)
    app.conf.update(broker_transport_options={"visibility_timeout": VT}, task_default_queue="resil",
                    task_ignore_result=True, broker_connection_timeout=2)
    return app


def starts(log: Path, n: int) -> list[dict]:
    return [r for r in runs(log) if r["n"] == n and r["phase"] == "start"]


# -- 1. a worker killed mid-task ---------------------------------------------------------------------------------
LOST_WAIT = 1.0  # worker_lost_wait: how long Celery waits for a killed pool child's result (default 10 s)


@pytest.mark.parametrize("what", ["pool-child", "whole-worker"])
def test_task_of_a_killed_worker_runs_again_on_another(what: str, broker: BrokerProcess, tmp_path: Path,
                                                       cleanup: list) -> None:
    """acks_late + task_reject_on_worker_lost. A killed pool child: Celery rejects the task with requeue once
    `worker_lost_wait` is over; it is visible again at once, long before its lease (30 s here) ends. The whole
    worker killed: nobody rejects; the broker's revive brings the task back when its lease (VT) ends."""
    url = f"rocketmq://{broker.namesrv}//"
    run_log = tmp_path / "runs.jsonl"
    vt = 30.0 if what == "pool-child" else VT
    env = {"RESIL_VT": str(vt), "RESIL_LOST_WAIT": str(LOST_WAIT)}
    a = Worker(tmp_path, "a", url, run_log, env=env)
    cleanup.append(a.killpg)
    a.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 30.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(a.log)
    first = starts(run_log, 1)[0]
    b = Worker(tmp_path, "b", url, run_log, env=env)  # started now, so that worker a took the task
    cleanup.append(b.killpg)
    b.wait_ready()
    if what == "pool-child":
        assert first["pid"] in a.children()
        os.kill(first["pid"], signal.SIGKILL)
    else:
        a.killpg()
    killed = time.monotonic()
    assert wait_for(lambda: len(starts(run_log, 1)) >= 2, 30), tail(a.log) + "\n---\n" + tail(b.log)
    again = time.monotonic() - killed
    second = starts(run_log, 1)[1]
    leased = second["t"] - first["t"]  # the lease starts when worker a popped the task
    print(f"\n{what} SIGKILLed: the task ran again {again:.2f} s after the kill, {leased:.2f} s after its first "
          f"start (visibility_timeout {vt} s, worker_lost_wait {LOST_WAIT} s), on {second['host']}")
    assert second["pid"] != first["pid"]
    assert second["redelivered"] is True
    if what == "whole-worker":
        assert second["host"].startswith("b@")
        assert VT - 0.5 <= leased < VT + 5  # the dead worker's lease had to run out first, not much more
    else:
        assert "WorkerLostError" in a.text()
        assert again < LOST_WAIT + 5 < vt  # given back by the reject, not by the lease's end
    assert wait_for(lambda: any(r["n"] == 1 and r["phase"] == "end" for r in runs(run_log)), 40)


def test_without_reject_on_worker_lost_a_killed_pool_child_loses_its_task(broker: BrokerProcess, tmp_path: Path,
                                                                          cleanup: list) -> None:
    """Celery's documented default, shown on this transport: acks_late alone does not bring back the task of a
    killed pool child; Celery acks it as failed (WorkerLostError). Hence the README's advice to set
    task_reject_on_worker_lost."""
    url = f"rocketmq://{broker.namesrv}//"
    run_log = tmp_path / "runs.jsonl"
    a = Worker(tmp_path, "a", url, run_log, env={"RESIL_REJECT_ON_LOST": "0", "RESIL_LOST_WAIT": str(LOST_WAIT)})
    cleanup.append(a.killpg)
    a.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 30.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(a.log)
    os.kill(starts(run_log, 1)[0]["pid"], signal.SIGKILL)
    assert wait_for(lambda: "WorkerLostError" in a.text(), 20), tail(a.log)
    time.sleep(VT + 2)  # past the lease: an unacked task would be back by now
    assert len(starts(run_log, 1)) == 1
