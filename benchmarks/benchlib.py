"""What several benchmarks share: a free loopback port, and our broker (`rmq-eventstore serve`) in a child
process so that the client being measured does not share its GIL."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def broker_process(store: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A broker serving `store` on free loopback ports: (the process, its name-server address)."""
    ports = (free_port(), free_port())
    proc = subprocess.Popen([sys.executable, "-m", "rmq_eventstore", "serve", "--store", str(store),
                             "--namesrv-port", str(ports[0]), "--broker-port", str(ports[1]), "--log-level",
                             "ERROR", *extra], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""
        if "serving" not in line:
            raise RuntimeError(f"the broker did not start: {line!r}")
        yield proc, f"127.0.0.1:{ports[0]}"
    finally:
        proc.terminate()
        proc.wait(30)
