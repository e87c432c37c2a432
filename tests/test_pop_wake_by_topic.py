"""A POP long poll is woken by arrivals on the topics it reads (its topic and its pop retry topic), not by every
dispatched batch: one condition for all waiting pops made each batch, on any topic, wake every waiting pop to
look again (a Celery worker consuming many queues holds one long poll per queue: a busy queue made each idle
queue's poll pop again for each of its batches). Real broker, real PopConsumers over loopback; the pops of the
idle topics are counted at the PopService."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.pop_service import PopService
from rmq_eventstore.client import Message, PopConsumer, Producer

SMALL = {"mapped_file_size_commit_log": 1024 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


def test_waiting_pops_sleep_through_other_topics_arrivals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    idle_pops: list[str] = []
    pop_once = PopService._pop_once

    def counting(self: PopService, group: str, topic: str, *args: object) -> object:
        if topic.startswith("idle"):
            idle_pops.append(topic)
        return pop_once(self, group, topic, *args)

    monkeypatch.setattr(PopService, "_pop_once", counting)
    n_idle, sends = 12, 300
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        ns = rb.namesrv_address
        with Producer(ns, "p") as p:
            for i in range(n_idle):
                p.send(Message(f"idle{i}", b"create"), queue_id=0)
            p.send(Message("busy", b"create"), queue_id=0)
        got: dict[str, list[bytes]] = {}
        consumers = [PopConsumer(ns, "g") for _ in range(n_idle)]
        for i, c in enumerate(consumers):  # the creating sends are taken first: the queues are empty after
            assert [bytes(m.body) for m in c.pop(f"idle{i}", 32, 60_000, poll_time=2000)] == [b"create"]

        def poll(i: int) -> None:
            out = consumers[i].pop(f"idle{i}", 32, 60_000, poll_time=3000)
            got[f"idle{i}"] = [bytes(m.body) for m in out]

        threads = [threading.Thread(target=poll, args=(i,)) for i in range(n_idle)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        idle_pops.clear()
        start = time.monotonic()
        with Producer(ns, "p2") as p:
            for i in range(sends):  # one dispatched batch each, none for an idle topic
                p.send(Message("busy", f"b{i}".encode()), queue_id=0)
            elapsed = time.monotonic() - start
            p.send(Message("idle3", b"wake"), queue_id=0)
        threads[3].join(10)
        assert got.get("idle3") == [b"wake"]  # an arrival on its topic wakes it
        # without the busy topic's batches, each idle poll looks again every 0.5 s (and once when it is woken)
        looked = len(idle_pops)  # was 2,440 (12 polls, 300 batches in 0.08 s)
        assert looked <= n_idle * (elapsed / 0.5 + 2) + 1, (looked, elapsed)
        for t in threads:
            t.join(10)
        for c in consumers:
            c.shutdown()
