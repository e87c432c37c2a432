"""@event_handler groups run by real Celery workers: queues shared among the live workers, taken over when a
worker is SIGKILLed, tags filtered, order kept per queue, offsets committed to the broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.celery.handlers import Event, HandlerSpec, _subscriptions
from rmq_eventstore.client import Admin, Message, Producer

ROOT = Path(__file__).resolve().parent.parent


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_subscriptions_merge_tag_expressions():
    def f(e):
        return None

    specs = [HandlerSpec(f, "a", "X", "g"), HandlerSpec(f, "a", "Y || Z", "g"), HandlerSpec(f, "b", "*", "g")]
    assert _subscriptions(specs) == {"a": "X || Y || Z", "b": "*"}


def test_event_from_message_decodes_json_and_stream(broker):
    from rmq_eventstore.client import PullConsumer

    with Producer(broker.namesrv_address, "web") as p, PullConsumer(broker.namesrv_address, "reader") as c:
        p.send(Message("order-events", b'{"n": 7}', tags="Placed", keys=["o-7"]), stream="order-7")
        p.send(Message("order-events", b"not json", tags="Paid"), queue_id=1)
        events: list[Event] = []
        deadline = time.monotonic() + 10
        while len(events) < 2 and time.monotonic() < deadline:  # dispatch runs behind the send's answer
            events = [Event.from_message(m) for q in range(4) for m in c.pull("order-events", q, 0, 10, 0).messages]
    by_tag = {e.tags: e for e in events}
    assert by_tag["Placed"].data == {"n": 7} and by_tag["Placed"].stream == "order-7"
    assert by_tag["Placed"].version == 1 and by_tag["Placed"].keys == ("o-7",)
    assert by_tag["Paid"].data is None and by_tag["Paid"].body == b"not json"
    assert by_tag["Paid"].stored_at.tzinfo is not None
    with pytest.raises(ValueError):
        HandlerSpec(lambda e: None, "bad topic!", "*", "g")


def read_handled(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def broker(tmp_path):
    with serve_in_thread(tmp_path / "store", mapped_file_size_commit_log=4 << 20,
                         mapped_file_size_consume_queue=20 * 10_000) as rb:
        with Admin(rb.namesrv_address) as admin:
            admin.create_topic("order-events", 4)
        yield rb


def start_worker(namesrv: str, handled: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEST_STORE_URL=f"rmq://{namesrv}", TEST_HANDLED_FILE=str(handled))
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.celery_handlers_app", "worker", "-P", "solo",
                             "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "WARNING"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_workers_share_take_over_and_commit(broker, tmp_path):
    handled = tmp_path / "handled.jsonl"
    workers = [start_worker(broker.namesrv_address, handled, f"w{i}") for i in range(2)]
    members = broker.broker.client_manager.consumers.consumer_ids
    try:
        assert wait_for(lambda: len(members("order-read-model")) == 2, 60), [w.poll() for w in workers]
        time.sleep(0.5)  # the notified members rebalance
        with Producer(broker.namesrv_address, "web") as p:
            def send(n):
                tag = ("Placed", "Paid", "Shipped")[n % 3]
                p.send(Message("order-events", json.dumps({"n": n}).encode(), tags=tag), queue_id=n % 4)

            for n in range(120):
                send(n)
            wanted = {n for n in range(120) if n % 3 != 2}  # Shipped is not subscribed
            assert wait_for(lambda: {h["n"] for h in read_handled(handled)} >= wanted, 60)
            assert wait_for(lambda: len({h["pid"] for h in read_handled(handled)}) == 2, 10)  # both took queues
            victim = workers[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            assert wait_for(lambda: len(members("order-read-model")) == 1, 20)  # its connection closed
            for n in range(120, 240):
                send(n)
            wanted |= {n for n in range(120, 240) if n % 3 != 2}
            assert wait_for(lambda: {h["n"] for h in read_handled(handled)} >= wanted, 60)
        rows = read_handled(handled)
        assert all(h["tags"] in ("Placed", "Paid") for h in rows)
        by_queue = defaultdict(list)
        for h in rows:
            by_queue[(h["pid"], h["queue"])].append(h["offset"])
        assert all(offs == sorted(offs) for offs in by_queue.values())  # in order within each holder
        with Admin(broker.namesrv_address) as admin:
            assert wait_for(lambda: all(admin.consumer_offset("order-read-model", "order-events", q) == 60
                                        for q in range(4)), 30)
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
