"""Run a real third-party RocketMQ client as a subprocess that prints JSON lines, with bounded waits.

Shared by `test_client_alions.py` (ali-ons, Node) and `test_client_cpp.py` (the Apache C++ client in
the `rocketmq` PyPI wheel). The client scripts print one JSON object per line (`{"event": ...}`); this
module collects them on a reader thread so a test can wait for one event with a deadline and, on any
failure, show everything the client printed (stdout and stderr) in the assertion message.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ClientProcess:
    """A client subprocess whose stdout is a stream of JSON events; always killed by `close()`."""

    def __init__(self, argv: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None, name: str = "client") -> None:
        self.name = name
        self.argv = list(argv)
        self.events: list[dict] = []
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._queue: queue.Queue[dict | None] = queue.Queue()
        self.proc = subprocess.Popen(
            self.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a library printing to stdout; kept in stdout_lines for diagnostics
            if isinstance(event, dict):
                self.events.append(event)
                self._queue.put(event)
        self._queue.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def describe(self) -> str:
        """Everything the client said, for assertion messages."""
        return (f"{self.name} argv={self.argv!r} returncode={self.proc.poll()}\n"
                f"--- stdout ---\n" + "\n".join(self.stdout_lines[-200:]) +
                "\n--- stderr ---\n" + "\n".join(self.stderr_lines[-200:]))

    def wait_event(self, kind: str, timeout: float) -> dict:
        """The next event of type `kind`; fails (with the client's output) on timeout or early exit."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind!r} event within {timeout}s\n{self.describe()}")
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if event is None:
                raise AssertionError(f"{self.name} exited before a {kind!r} event\n{self.describe()}")
            if event.get("event") == kind:
                return event

    def finish(self, timeout: float) -> list[dict]:
        """Wait for a clean exit (code 0) and return all events; kill and fail on timeout."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"{self.name} still running after {timeout}s\n{self.describe()}") from None
        for t in self._threads:
            t.join(5)
        if rc != 0:
            raise AssertionError(f"{self.name} exited with {rc}\n{self.describe()}")
        return self.events

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    def close(self) -> None:
        """Kill the client (its whole process group) if it is still running; idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def client_env(home: Path) -> dict[str, str]:
    """Environment for a client process: HOME in a temp dir (the C++ client writes ~/logs/rocketmq-cpp)."""
    env = dict(os.environ)
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    return env


# -- the checks both real-client round trips share -----------------------------------------------------
def keys_of(stored: Any) -> list[str]:
    """The KEYS property of a stored message as a list."""
    return [k for k in (stored.properties.get("KEYS") or "").split(" ") if k]


def send_ours_and_store(broker: Any, topic: str) -> tuple[Any, Any, Any]:
    """One message through our `Producer` (TagB, keys py-1 py-2) and one put straight into the store
    (TagA, key store-1): what a real client's consumer must receive besides its own producer's messages.
    Returns `(producer, send_result, put_result)`; the caller shuts the started producer down."""
    from rmq_eventstore.client import Producer
    from rmq_eventstore.store import Message

    ours = Producer(broker.namesrv_address, "py-producer")
    ours.start()
    r = ours.send(Message(topic=topic, body=b"from our producer", tags="TagB", keys=["py-1", "py-2"],
                          properties={"origin": "python"}))
    assert r.status == "SEND_OK", r
    put = broker.store.put_message(Message(topic=topic, body=b"put into the store", tags="TagA",
                                           keys=["store-1"], queue_id=1))
    assert put.status.name == "PUT_OK", put
    return ours, r, put


def assert_offsets_committed(broker: Any, group: str, topic: str) -> None:
    """The client committed its progress (UPDATE_CONSUMER_OFFSET) up to each queue's max offset, also
    past the messages its subscription filtered out."""
    from rmq_eventstore.client import PullConsumer

    with PullConsumer(broker.namesrv_address, group) as view:
        for qid in view.queues(topic):
            assert view.fetch_offset(topic, qid) == broker.store.get_max_offset_in_queue(topic, qid), qid


def assert_received(consumer: ClientProcess, topic: str, specs: list[dict], sent: list[dict],
                    expected_keys: list[str], check_queue_id: bool) -> None:
    """The consumer received exactly the TagA/TagB messages (its producer's, ours and the store's),
    each decoded by the client itself from our stored records, with tags, keys, body and queue offset."""
    assert not consumer.of("error"), consumer.describe()
    got = consumer.of("received")
    assert len(got) == len(expected_keys), consumer.describe()
    by_key = {m["keys"][0]: m for m in got}
    assert sorted(by_key) == sorted(expected_keys), consumer.describe()
    for m in got:
        assert m["topic"] == topic
        assert m["tags"] in ("TagA", "TagB")
        assert m["reconsumeTimes"] == 0
    for spec, s in zip(specs, sent, strict=True):
        if spec["tags"] == "TagC":
            continue
        m = by_key[spec["keys"][0]]
        assert m["tags"] == spec["tags"] and m["keys"] == spec["keys"]
        assert m["body"] == spec["body"] * spec.get("bodyRepeat", 1)
        assert m["queueOffset"] == s["queueOffset"]
        if check_queue_id:
            assert m["queueId"] == s["queueId"]
