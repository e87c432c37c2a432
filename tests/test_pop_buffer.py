"""POP's checkpoint buffer (`PopBufferMergeService`, RocketMQ's enablePopBufferMerge) over a real broker: a pop
acked while its checkpoint is in memory writes nothing to the revive topic; an unacked one is written after
its bound (only its unacked messages), later acks of it as ack records; the consume offset never passes a
pop whose checkpoint is neither stored nor settled; and a SIGKILL with checkpoints in memory or just stored
loses no unacked message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client import Message, PopConsumer, Producer
from rmq_eventstore.common.pop import ACK_TAG, BATCH_ACK_TAG, CK_TAG, REVIVE_QUEUE_NUM, PopCheckPoint
from tests.test_transaction_crash import Broker

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    # a long stay: only what a test flushes (or its revive time) moves a checkpoint out of the buffer
    with serve_in_thread(tmp_path / "store", pop_ck_stay_buffer_time=600_000, **SMALL) as rb:
        yield rb


def send(ns: str, topic: str, n: int) -> None:
    with Producer(ns, "buffer-producer") as p:
        for i in range(n):
            p.send(Message(topic, f"m{i}".encode(), keys=f"m{i}"), queue_id=0)


def revive_records(rb: RunningBroker) -> list[tuple[str, bytes]]:
    """(tag, body) of every record in the revive topic."""
    ps = rb.broker.pop_service
    rb.store.wait_for_dispatch()
    out = []
    for q in range(REVIVE_QUEUE_NUM):
        r = rb.store.get_message("test-reader", ps.revive_topic, q, 0, 1000, None)
        out += [(m.tags or "", bytes(m.body)) for m in (r.messages if r is not None else [])]
    return out


def committed(rb: RunningBroker, group: str, topic: str) -> int:
    return rb.broker.offset_manager.file.query_offset(group, topic, 0)


def test_a_checkpoint_matched_by_its_acks_writes_nothing(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "jobs", 10)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "g") as c:
        got = c.pop("jobs", max_nums=4, invisible_time=60_000, queue_id=0)
        c.ack_batch(got)
        for m in c.pop("jobs", max_nums=6, invisible_time=60_000, queue_id=0):
            c.ack(m)  # single acks too
    ps = broker.broker.pop_service
    ps.revive_once(int(time.time() * 1000) + 3_600_000)  # far past every bound and revive time
    assert revive_records(broker) == []
    assert committed(broker, "g", "jobs") == 10
    assert ps.buffer.settled == 2 and ps.buffer.size() == 0


def test_an_unmatched_checkpoint_is_written_after_its_bound_with_its_unacked_messages(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "store", pop_ck_stay_buffer_time=1000, **SMALL) as rb:
        ns = rb.namesrv_address
        send(ns, "jobs", 3)
        rb.store.wait_for_dispatch()
        with PopConsumer(ns, "g") as c:
            got = sorted(c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=0), key=lambda m: m.queue_offset)
            c.ack(got[0])
            assert revive_records(rb) == [] and committed(rb, "g", "jobs") <= 0  # in memory, offset held
            deadline = time.monotonic() + 10
            while not revive_records(rb) and time.monotonic() < deadline:
                time.sleep(0.05)
            (tag, body), = revive_records(rb)
            ck = PopCheckPoint.from_json(body)
            assert tag == CK_TAG and ck.start_offset == 0 and ck.queue_offset_diff == [1, 2] and ck.num == 2
            assert committed(rb, "g", "jobs") == 3  # stored: the offset may move past it
            c.ack_batch(got[1:2])
            c.ack(got[2])
            tags = sorted(t for t, _ in revive_records(rb))
            assert tags == sorted([CK_TAG, BATCH_ACK_TAG, ACK_TAG])
            rb.broker.pop_service.revive_once(int(time.time() * 1000) + 3_600_000)
            assert c.pop("jobs", invisible_time=60_000, poll_time=300) == []  # all acked: nothing comes back


def test_the_offset_waits_for_the_oldest_unsettled_pop(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "jobs", 6)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "g") as c:
        a = c.pop("jobs", max_nums=2, invisible_time=60_000, queue_id=0)
        b = c.pop("jobs", max_nums=2, invisible_time=60_000, queue_id=0)
        assert [m.queue_offset for m in a + b] == [0, 1, 2, 3]  # the second pop starts past the first
        c.ack_batch(b)
        assert committed(broker, "g", "jobs") <= 0  # b is settled, but a is in flight and not stored
        rest = c.pop("jobs", max_nums=8, invisible_time=60_000, queue_id=0)
        assert [m.queue_offset for m in rest] == [4, 5]
        c.ack_batch(a)
        assert committed(broker, "g", "jobs") == 4  # a and b settled; the last pop still holds its range
        broker.broker.pop_service.buffer.flush_queue("g", "jobs", 0)
        assert committed(broker, "g", "jobs") == 6
        assert [t for t, _ in revive_records(broker)] == [CK_TAG]  # only the unacked pop was written


def test_change_of_invisible_time_stores_the_buffered_checkpoint_first(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "jobs", 3)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "g") as c:
        got = sorted(c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=0), key=lambda m: m.queue_offset)
        c.change_invisible_time(got[1], 0)
        recs = revive_records(broker)
        # the pop's checkpoint (stored first, so that the new one's end never carries the offset past it at a
        # recovery), the new checkpoint of the message, and the ack of the old one
        assert sorted(t for t, _ in recs) == sorted([CK_TAG, CK_TAG, ACK_TAG])
        cks = [PopCheckPoint.from_json(b) for t, b in recs if t == CK_TAG]
        assert sorted(ck.num for ck in cks) == [1, 3]
        deadline = time.monotonic() + 10
        back: list = []
        while not back and time.monotonic() < deadline:
            back = c.pop("jobs", invisible_time=60_000, poll_time=300)
        assert [m.body for m in back] == [b"m1"]


def _conf(tmp: Path, extra: str) -> Broker:
    b = Broker(tmp)
    b.conf.write_text(b.conf.read_text() + "flushConsumerOffsetInterval=200\n" + extra)
    return b


def test_a_kill_with_checkpoints_in_memory_keeps_their_invisibility_and_their_acks(tmp_path: Path) -> None:
    """The journal: after a SIGKILL with checkpoints only in memory, the unacked messages come back at
    their revive time (not at once: a worker may still be on them), the acked ones not at all."""
    broker = _conf(tmp_path, "popCkStayBufferTime=600000\n")
    broker.start()
    try:
        send(broker.namesrv, "jobs", 20)
        with PopConsumer(broker.namesrv, "g") as c:
            got: list = []
            popped_at = time.monotonic()
            while len(got) < 20:
                got += c.pop("jobs", max_nums=4, invisible_time=5000, queue_id=0, poll_time=500)
            acked = {m.keys for m in got[::2]}
            c.ack_batch(got[::2])
        journal = tmp_path / "store" / "pop" / "ckbuffer.journal"
        assert journal.stat().st_size > 0 and time.monotonic() - popped_at < 4  # still only in memory
        broker.kill()
        broker.start()
        with PopConsumer(broker.namesrv, "g") as c:
            assert c.pop("jobs", max_nums=32, invisible_time=60_000) == []  # invisible still
            again: list = []
            deadline = time.monotonic() + 20
            while len(again) < 10 and time.monotonic() < deadline:
                for m in c.pop("jobs", max_nums=32, invisible_time=60_000, poll_time=300):
                    again.append((m, time.monotonic()))
                    c.ack(m)
            time.sleep(0.5)
            again += [(m, time.monotonic()) for m in c.pop("jobs", max_nums=32, invisible_time=60_000)]
        assert sorted(m.keys for m, _ in again) == sorted({m.keys for m in got} - acked)
        assert all(m.reconsume_times == 1 and t >= popped_at + 4.5 for m, t in again)  # through revive
    finally:
        broker.stop()


def test_a_kill_after_the_checkpoint_is_stored_brings_back_exactly_the_unacked(tmp_path: Path) -> None:
    broker = _conf(tmp_path, "popCkStayBufferTime=200\n")
    broker.start()
    try:
        send(broker.namesrv, "jobs", 12)
        with PopConsumer(broker.namesrv, "g") as c:
            got = []
            while len(got) < 12:
                got += c.pop("jobs", max_nums=4, invisible_time=2500, queue_id=0, poll_time=500)
            acked = {m.keys for m in got[:6]}
            c.ack_batch(got[:6])  # the first pops settle in memory, the later ones are stored unacked
            time.sleep(1.0)  # stored, offsets committed and flushed
        broker.kill()
        broker.start()
        with PopConsumer(broker.namesrv, "g") as c:
            again: list = []
            deadline = time.monotonic() + 20
            while len(again) < 6 and time.monotonic() < deadline:
                for m in c.pop("jobs", max_nums=32, invisible_time=60_000, poll_time=300):
                    again.append(m)
                    c.ack(m)
            time.sleep(0.5)
            again += c.pop("jobs", max_nums=32, invisible_time=60_000, poll_time=300)
        assert sorted(m.keys for m in again) == sorted({m.keys for m in got} - acked)
        assert all(m.reconsume_times == 1 for m in again)  # through revive, not a re-read of the queue
    finally:
        broker.stop()


def test_a_kill_after_the_buffer_emptied_brings_back_no_acked_message(tmp_path: Path) -> None:
    """Settled pops leave the journal when the buffer empties, but their offsets stay in it (`O` lines):
    consumerOffset.json is written only every few seconds (here: not before the kill)."""
    broker = Broker(tmp_path)
    broker.conf.write_text(broker.conf.read_text() + "flushConsumerOffsetInterval=600000\n")
    broker.start()
    try:
        send(broker.namesrv, "jobs", 12)
        with PopConsumer(broker.namesrv, "g") as c:
            n = 0
            while n < 12:
                got = c.pop("jobs", max_nums=4, invisible_time=60_000, queue_id=0, poll_time=500)
                c.ack_batch(got)
                n += len(got)
        journal = tmp_path / "store" / "pop" / "ckbuffer.journal"
        deadline = time.monotonic() + 10
        # the buffer may empty after an earlier batch too (an `O g jobs 0 4` or `... 8` line first): wait for
        # the last one, then the journal must hold exactly it
        while journal.read_text() != "O g jobs 0 12\n" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert journal.read_text() == "O g jobs 0 12\n"
        broker.kill()
        broker.start()
        with PopConsumer(broker.namesrv, "g") as c:
            assert c.pop("jobs", max_nums=32, invisible_time=60_000, poll_time=1000) == []
    finally:
        broker.stop()


def test_pop_with_the_previous_batchs_ack_in_the_same_write(broker: RunningBroker) -> None:
    """`PopConsumer.pop(ack=...)`: the batch ack and the next pop go out in one write, the ack served first."""
    ns = broker.namesrv_address
    send(ns, "jobs", 10)
    broker.store.wait_for_dispatch()
    seen: list[str] = []
    with PopConsumer(ns, "g") as c:
        prev: list = []
        for _ in range(20):
            prev = c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=0, ack=prev)
            seen += [m.keys or "" for m in prev]
            if not prev:
                break
        assert sorted(seen) == sorted(f"m{i}" for i in range(10))
        assert committed(broker, "g", "jobs") == 10  # every batch was acked by the following pop
        assert broker.broker.pop_service.buffer.in_flight() == 0
    broker.broker.pop_service.revive_once(int(time.time() * 1000) + 3_600_000)
    assert revive_records(broker) == []


def test_journal_recovery_skips_a_torn_line_and_applies_acks(tmp_path: Path) -> None:
    from rmq_eventstore.broker.pop_buffer import PopJournal

    path = tmp_path / "j"
    j = PopJournal(str(path))
    ck = PopCheckPoint(5, 1000, 30_000, 3, 0, "t", "g", "b", [0, 1, 3])
    j.ck(ck, 2, 9)
    j.ack(("g", "t", 0, 5, 1000), [6])
    j.ck(PopCheckPoint(9, 1001, 30_000, 1, 0, "t", "g", "b", [0]), 3, 10)
    j.stored(("g", "t", 0, 9, 1001))
    j.close()
    with open(path, "a") as f:
        f.write("C g t 0 10 1002 300")  # a write cut short by the kill
    entries, offsets = PopJournal.recover(str(path), "b")
    (ck1, qid1, next1, acked1, stored1), (ck2, _, next2, _, stored2) = entries
    assert (ck1.start_offset, ck1.queue_offset_diff, qid1, next1, acked1, stored1) == (5, [0, 1, 3], 2, 9, 0b10, False)
    assert (ck2.start_offset, next2, stored2) == (9, 10, True) and offsets == {}
    # emptied: the offsets the buffer committed stay (consumerOffset.json may be seconds behind)
    j = PopJournal(str(path))
    j.reset([], {("g", "t", 0): 10})
    j.close()
    assert PopJournal.recover(str(path), "b") == ([], {("g", "t", 0): 10})
