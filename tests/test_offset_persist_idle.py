"""consumerOffset.json is written when an offset changed since the last write, not on every tick of the broker's
flush (every `flush_consumer_offset_interval`): its size grows with topics x queues x groups (a Celery app with
25,000 queues: 1.8 MB, 250 ms to encode and write), and an idle broker rewrote it, with three fsyncs, forever.
The table is copied under the manager's lock and encoded outside it, so commits (one per POP) do not wait for
the encoding. Seen through the file itself (its inode changes with every write) on a real broker."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.store.config_files import ConsumerOffsetManager

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


def stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def wait_for(predicate, timeout: float = 10.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def offsets_on_disk(path: str) -> dict:
    """The offset table the file holds (read as the broker reads it at start)."""
    m = ConsumerOffsetManager(os.path.dirname(path))
    assert m.load()
    return m.offset_table()


def test_an_idle_broker_does_not_rewrite_consumer_offsets(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "store", flush_consumer_offset_interval=100, **SMALL) as rb:
        om = rb.broker.offset_manager
        path = om.file.config_file_path()
        for t in range(200):
            for q in range(4):
                om.commit("celery", f"queue{t}", q, 10 + q)
        assert wait_for(lambda: os.path.exists(path) and len(offsets_on_disk(path)) >= 200)
        time.sleep(0.6)  # a write that had begun before the last commit landed is over
        before = stamp(path)
        time.sleep(1.6)  # three ticks of the broker's housekeeping (every 0.5 s), nothing committed
        assert stamp(path) == before
        om.commit("celery", "queue7", 2, 99)
        assert wait_for(lambda: offsets_on_disk(path)["queue7@celery"][2] == 99)
        assert stamp(path) != before
    assert offsets_on_disk(path)["queue199@celery"] == {0: 10, 1: 11, 2: 12, 3: 13}


def test_persist_writes_once_per_change_and_never_loses_a_commit(tmp_path: Path) -> None:
    m = ConsumerOffsetManager(tmp_path)
    m.persist()  # the first persist writes, even an empty table
    first = stamp(m.config_file_path())
    m.persist()
    assert stamp(m.config_file_path()) == first
    m.commit_offset("g", "t", 0, 5)
    m.persist()
    assert stamp(m.config_file_path()) != first and offsets_on_disk(m.config_file_path()) == {"t@g": {0: 5}}
    # commits racing with persists: the last persist after the last commit holds every offset
    stop = threading.Event()

    def persister() -> None:
        while not stop.is_set():
            m.persist()

    th = threading.Thread(target=persister)
    th.start()
    try:
        for i in range(3000):
            m.commit_offset("g", f"t{i % 50}", i % 4, i)
    finally:
        stop.set()
        th.join()
    m.persist()
    again = ConsumerOffsetManager(tmp_path)
    assert again.load()
    assert again.offset_table() == m.offset_table()
    m.remove_offset("g")
    m.persist()
    assert offsets_on_disk(m.config_file_path()) == {}


def test_an_offset_the_native_ack_lane_commits_is_written(tmp_path: Path) -> None:
    # THE ACK ONE (`_native.ack_one`) settles a buffered pop and commits its queue's offset in C, straight into the
    # manager's table (its `_commits` counted, not through `commit_offset`): persist must still see the change
    from rmq_eventstore.client import Message, PopConsumer, Producer

    with serve_in_thread(tmp_path / "store", flush_consumer_offset_interval=3_600_000, **SMALL) as rb:
        ns = rb.namesrv_address
        with Producer(ns, "p") as p:
            for i in range(6):
                p.send(Message("jobs", f"m{i}".encode()), queue_id=0)
        rb.store.wait_for_dispatch()
        om = rb.broker.offset_manager
        with PopConsumer(ns, "g") as c:
            for m in c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=0):
                c.ack(m)
            om.persist()
            path = om.file.config_file_path()
            assert offsets_on_disk(path)["jobs@g"][0] == 3
            for m in c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=0):
                c.ack(m)
            assert om.file.query_offset("g", "jobs", 0) == 6
            om.persist()
            assert offsets_on_disk(path)["jobs@g"][0] == 6
