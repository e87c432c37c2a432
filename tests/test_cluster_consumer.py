"""ClusterConsumer: RocketMQ's clustering consumption (queues divided among a group's live members,
rebalanced when one joins or dies), per-queue order, offsets committed to the broker, retries then DLQ."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.client import Admin, ClusterConsumer, Message, Producer, PullConsumer, allocate_averagely

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"mapped_file_size_commit_log": 1024 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


def wait_for(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_allocation_examples_from_rocketmq():
    qs = [("b", i) for i in range(8)]
    got = [allocate_averagely(qs, ["c1", "c2", "c3"], c) for c in ("c1", "c2", "c3")]
    assert [len(g) for g in got] == [3, 3, 2]
    assert got[0] == qs[:3] and got[1] == qs[3:6] and got[2] == qs[6:]
    assert allocate_averagely(qs[:2], ["a", "b", "c"], "c") == []
    assert allocate_averagely(qs, ["a"], "z") == []


@given(st.integers(1, 40), st.lists(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=12, unique=True))
def test_allocation_covers_every_queue_once(n, cids):
    qs = [("b", i) for i in range(n)]
    parts = [allocate_averagely(qs, cids, c) for c in cids]
    flat = [q for p in parts for q in p]
    assert sorted(flat) == qs
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.fixture
def broker(tmp_path):
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        with Admin(rb.namesrv_address) as admin:
            admin.create_topic("events", 8)
        yield rb


def produce(namesrv: str, n: int, start: int = 0) -> None:
    with Producer(namesrv, "p") as p:
        for i in range(start, start + n):
            p.send(Message("events", str(i).encode(), keys=f"k{i}"), queue_id=i % 8)


def test_two_members_split_the_queues_keep_order_and_commit(broker):
    seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handler_for(name):
        def handle(m):
            with lock:
                seen[name].append((m.queue_id, m.queue_offset, int(m.body)))
        return handle

    produce(broker.namesrv_address, 160)
    with ClusterConsumer(broker.namesrv_address, "read-model", handler_for("a"), {"events": "*"},
                         poll_timeout_ms=500, rebalance_interval=2) as a, \
            ClusterConsumer(broker.namesrv_address, "read-model", handler_for("b"), {"events": "*"},
                            poll_timeout_ms=500, rebalance_interval=2) as b:
        assert wait_for(lambda: len(a.assigned()) == 4 and len(b.assigned()) == 4)
        assert not a.assigned() & b.assigned()
        produce(broker.namesrv_address, 80, 160)
        assert wait_for(lambda: sum(len(v) for v in seen.values()) >= 240)
        bodies = sorted(x[2] for v in seen.values() for x in v)
        assert bodies[:240] == list(range(240)) or len(set(bodies)) == 240
        for v in seen.values():  # per queue, in queue order
            by_q = defaultdict(list)
            for q, off, _ in v:
                by_q[q].append(off)
            assert all(offs == sorted(offs) for offs in by_q.values())
    with Admin(broker.namesrv_address) as admin:
        assert wait_for(lambda: all(admin.consumer_offset("read-model", "events", q) == 30 for q in range(8)), 10)


def test_a_member_joining_later_gets_its_share(broker):
    handled = []
    a = ClusterConsumer(broker.namesrv_address, "g", handled.append, {"events": "*"}, poll_timeout_ms=300,
                        rebalance_interval=30).start()
    try:
        assert wait_for(lambda: len(a.assigned()) == 8)
        with ClusterConsumer(broker.namesrv_address, "g", handled.append, {"events": "*"}, poll_timeout_ms=300,
                             rebalance_interval=30) as b:
            # NOTIFY_CONSUMER_IDS_CHANGED makes both rebalance at once, long before the 30 s interval
            assert wait_for(lambda: len(a.assigned()) == 4 and len(b.assigned()) == 4, 10)
        assert wait_for(lambda: len(a.assigned()) == 8, 10)  # b left: a takes everything back
    finally:
        a.shutdown()


def test_failing_handler_is_retried_in_place_then_dead_lettered(broker):
    produce(broker.namesrv_address, 8)
    calls = defaultdict(int)
    order = []

    def handle(m):
        calls[int(m.body)] += 1
        if int(m.body) == 3:
            raise RuntimeError("poison")
        if int(m.body) == 5 and calls[5] < 3:
            raise RuntimeError("transient")
        order.append(int(m.body))

    with ClusterConsumer(broker.namesrv_address, "g2", handle, {"events": "*"}, poll_timeout_ms=300,
                         max_retries=2, retry_backoff=(0.01, 0.05)):
        assert wait_for(lambda: len(order) == 7)
    assert calls[3] == 3 and calls[5] == 3 and sorted(order) == [0, 1, 2, 4, 5, 6, 7]
    with PullConsumer(broker.namesrv_address, "dlq-reader") as c:
        r = c.pull("%DLQ%g2", 0, 0, 10, 2000)
        assert [m.body for m in r.messages] == [b"3"]


CHILD = textwrap.dedent("""
    import sys, time
    from rmq_eventstore.client import ClusterConsumer
    def handle(m):
        sys.stdout.write("handled %d\\n" % int(m.body)); sys.stdout.flush()
        time.sleep(0.02)
    c = ClusterConsumer(sys.argv[1], "g3", handle, {"events": "*"}, poll_timeout_ms=300).start()
    print("started", flush=True)
    time.sleep(600)
""")


def test_a_killed_member_s_queues_are_taken_over(broker):
    child = subprocess.Popen([sys.executable, "-c", CHILD, broker.namesrv_address], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        handled = []
        with ClusterConsumer(broker.namesrv_address, "g3", lambda m: handled.append(int(m.body)), {"events": "*"},
                             poll_timeout_ms=300, rebalance_interval=30) as me:
            assert wait_for(lambda: len(me.assigned()) == 4, 15)
            produce(broker.namesrv_address, 200)
            time.sleep(0.5)
            os.kill(child.pid, signal.SIGKILL)  # in the middle of its share
            child.wait()
            assert wait_for(lambda: len(me.assigned()) == 8, 15)  # the broker saw the connection close
            child_done = {int(line.split()[1]) for line in child.stdout.read().splitlines() if line.startswith("handled")}
            assert wait_for(lambda: set(handled) | child_done == set(range(200)), 20)
    finally:
        if child.poll() is None:
            child.kill()


def test_a_pull_held_when_the_queue_is_released_is_dropped(broker):
    """a long-polls all 8 empty queues (3 s polls); b joins and takes 4 of them while a's polls are held.
    Messages sent then wake a's held polls too: a must drop them (its queue is gone), or they run twice."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler_for(name):
        def handle(m):
            with lock:
                seen.append((name, int(m.body)))
        return handle

    with ClusterConsumer(broker.namesrv_address, "held", handler_for("a"), {"events": "*"},
                         poll_timeout_ms=3000, rebalance_interval=30, consume_from="last") as a:
        assert wait_for(lambda: len(a.assigned()) == 8)
        time.sleep(0.5)  # every queue's poll is held now
        with ClusterConsumer(broker.namesrv_address, "held", handler_for("b"), {"events": "*"},
                             poll_timeout_ms=3000, rebalance_interval=30, consume_from="last") as b:
            assert wait_for(lambda: len(a.assigned()) == 4 and len(b.assigned()) == 4, 10)
            time.sleep(0.3)  # b's polls are held too; a's released ones may still be
            produce(broker.namesrv_address, 80)
            assert wait_for(lambda: len({n for _, n in seen}) == 80, 15)
            time.sleep(1.0)
    bodies = [n for _, n in seen]
    assert sorted(bodies) == list(range(80)), [n for n in set(bodies) if bodies.count(n) > 1]
