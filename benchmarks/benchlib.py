"""What several benchmarks share: a free loopback port, our broker (`rmq-eventstore serve`) in a child
process so that the client being measured does not share its GIL, and the Python loopback round trip to an
echo server (the floor under any synchronous request a Python client makes)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
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


ECHO_SERVER = textwrap.dedent("""
    import asyncio, socket, sys
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    class Echo(asyncio.Protocol):
        def connection_made(self, t):
            self.t = t
            t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        def data_received(self, d):
            self.t.write(d)
    srv = loop.run_until_complete(loop.create_server(Echo, "127.0.0.1", 0))
    print(srv.sockets[0].getsockname()[1], flush=True)
    loop.run_forever()
""")


def echo_round_trips(n: int = 20_000, size: int = 400) -> int:
    """Round trips a second of a Python client (sendall + recv of `size` bytes) to an echo server on uvloop in a
    child process, over loopback with TCP_NODELAY: what one waited request costs when neither side does any work."""
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline()) if proc.stdout else 0
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            msg = b"x" * size
            for _ in range(500):  # warm-up
                s.sendall(msg)
                s.recv(4096)
            t0 = time.perf_counter()
            for _ in range(n):
                s.sendall(msg)
                got = s.recv(4096)
                while len(got) < len(msg):
                    got += s.recv(4096)
            return round(n / (time.perf_counter() - t0))
    finally:
        proc.kill()
        proc.wait()
