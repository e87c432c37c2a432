"""Real processes for the Celery tests: a broker (`rmq-eventstore serve`) on fixed ports, and `celery worker`s
in their own sessions (so a SIGKILL of the process group kills the pool too). Shared by
tests/test_celery_resilience.py and tests/test_celery_eta.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEOMETRY = {"mappedFileSizeCommitLog": 4 << 20, "mappedFileSizeConsumeQueue": 200_000, "maxHashSlotNum": 4096,
            "maxIndexNum": 16384}


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
        def announced() -> bool:  # broker.json names this process (a SIGKILLed one leaves its file behind)
            try:
                return json.loads((self.store / "broker.json").read_text())["pid"] == self.proc.pid
            except (OSError, ValueError, KeyError):
                return False

        ok = wait_for(lambda: announced() or self.proc.poll() is not None, 30)
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


class CeleryWorker:
    """A real `celery worker -A <app_module>`, in its own session (killpg kills it all); its output goes to
    `<tmp>/worker-<name>.log`."""

    def __init__(self, tmp: Path, name: str, app_module: str, env: dict[str, str], pool: str = "prefork",
                 concurrency: int = 1) -> None:
        self.name = name
        self.log = tmp / f"worker-{name}.log"
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app_module, "worker", "-P", pool,
                 "-c", str(concurrency), "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat", "-l", "INFO"],
                cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

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
