"""Flush services on real store files (spec §5.4, §8, §11): SYNC_FLUSH group commit with its deadline,
ASYNC_FLUSH's least-pages / thorough-interval rules, the consume-queue flush and the checkpoint they keep.

Background loops are parked with hour-long intervals and each service's round (`do_commit`, `do_flush`)
is driven directly, so nothing here depends on sleeping.
"""

from __future__ import annotations

import os
import struct
import threading

from rmq_eventstore.store import Message, MessageStore, PutMessageStatus
from rmq_eventstore.store.flush import FlushDiskWatcher, GroupCommitRequest, GroupCommitService

TOPIC = "FlushTopic"
HOUR = 3_600_000
PARKED = {  # loops that never tick during a test: their rounds are driven by hand
    "flush_interval_commit_log": HOUR,
    "flush_interval_consume_queue": HOUR,
    "flush_commit_log_thorough_interval": HOUR,
    "flush_consume_queue_thorough_interval": HOUR,
}
_CHECKPOINT = struct.Struct(">qqqqq")


def msg(i: int, size: int = 16, queue_id: int = 0) -> Message:
    return Message(topic=TOPIC, body=(b"%08d" % i) + b"x" * max(0, size - 8), queue_id=queue_id)


def read_checkpoint(store: MessageStore) -> tuple[int, ...]:
    with open(store.config.checkpoint_path, "rb") as f:
        return _CHECKPOINT.unpack(f.read(_CHECKPOINT.size))


def on_disk(store: MessageStore, offset: int, size: int) -> bytes:
    """The commitlog bytes at `offset`, read through the file (not the store's mapping)."""
    fsize = store.config.mapped_file_size_commit_log
    path = os.path.join(store.config.commit_log_path, f"{offset - offset % fsize:020d}")
    with open(path, "rb") as f:
        f.seek(offset % fsize)
        return f.read(size)


# -- SYNC_FLUSH ----------------------------------------------------------------------------------
def test_sync_flush_put_ok_means_flushed(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH")
    assert isinstance(store.flush_commit_log_service, GroupCommitService)
    mfq = store.commit_log.mapped_file_queue
    for i in range(50):
        r = store.put_message(msg(i, 300))
        assert r.status == PutMessageStatus.PUT_OK, r
        end = r.append_result.wrote_offset + r.append_result.wrote_bytes
        assert mfq.flushed_where >= end
        raw = store.select_one_message_by_offset(r.append_result.wrote_offset)
        assert on_disk(store, r.append_result.wrote_offset, len(raw)) == raw
    r = store.put_messages([msg(1000 + i, 500) for i in range(40)])  # a batch
    assert r.status == PutMessageStatus.PUT_OK
    assert mfq.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes


def test_sync_flush_across_file_roll(open_store) -> None:
    """A put whose bytes start a new file (after a BLANK) is answered only when both files are flushed."""
    store = open_store(flush_disk_type="SYNC_FLUSH")
    mfq = store.commit_log.mapped_file_queue
    fsize = store.config.mapped_file_size_commit_log
    ends = []
    for i in range(3 * fsize // 1100):
        r = store.put_message(msg(i, 1000))
        assert r.status == PutMessageStatus.PUT_OK
        ends.append(r.append_result.wrote_offset + r.append_result.wrote_bytes)
        assert mfq.flushed_where >= ends[-1]
    assert len(mfq.mapped_files) >= 3
    assert all(f.flushed_position == f.file_size for f in mfq.mapped_files[:-1])


def test_group_commit_shares_flushes_between_threads(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH")
    gcs = store.flush_commit_log_service
    assert isinstance(gcs, GroupCommitService)
    threads, per_thread = 16, 40
    statuses: list[PutMessageStatus] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def producer(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            r = store.put_message(msg(t * 1000 + i, 100, queue_id=t % 4))
            with lock:
                statuses.append(r.status)

    workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert statuses == [PutMessageStatus.PUT_OK] * (threads * per_thread)
    assert gcs.request_count <= threads * per_thread
    # many waiting puts were answered by one fdatasync
    assert gcs.flush_count < gcs.request_count / 2, (gcs.flush_count, gcs.request_count)
    assert store.commit_log.mapped_file_queue.flushed_where == store.get_max_phy_offset()
    assert store.wait_for_dispatch()
    assert sum(store.get_max_offset_in_queue(TOPIC, q) for q in range(4)) == threads * per_thread


def test_flush_that_misses_its_deadline_answers_flush_disk_timeout(open_store) -> None:
    """While the disk does not answer (the flush lock is held), the watcher answers FLUSH_DISK_TIMEOUT; the
    record is written anyway (`is_ok`), and puts succeed again once flushing works."""
    store = open_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=300)
    watcher = store.flush_disk_watcher
    assert isinstance(watcher, FlushDiskWatcher)
    results = []
    with store.commit_log.flush_lock:
        t = threading.Thread(target=lambda: results.append(store.put_message(msg(1))))
        t.start()
        t.join(10)
        assert not t.is_alive()
    (r,) = results
    assert r.status == PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert r.is_ok()
    assert watcher.timed_out == 1
    r2 = store.put_message(msg(2))
    assert r2.status == PutMessageStatus.PUT_OK
    assert store.commit_log.mapped_file_queue.flushed_where >= r2.append_result.wrote_offset
    assert store.look_message_by_offset(r.append_result.wrote_offset).body.startswith(b"00000001")


def test_watcher_times_out_only_due_requests() -> None:
    watcher = FlushDiskWatcher()
    early = GroupCommitRequest(10, 100)
    late = GroupCommitRequest(20, 10_000)
    watcher.add(early)
    watcher.add(late)
    watcher.check(now=early.deadline - 0.001)
    assert early.status is None
    watcher.check(now=early.deadline)
    assert early.status == PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert late.status is None
    late.wakeup_customer(PutMessageStatus.PUT_OK)
    late.wakeup_customer(PutMessageStatus.FLUSH_DISK_TIMEOUT)  # the first answer wins
    assert late.wait(0) == PutMessageStatus.PUT_OK
    assert watcher.pending_count() == 1
    watcher.check(now=late.deadline + 1)
    assert late.status == PutMessageStatus.PUT_OK and watcher.timed_out == 1
    assert watcher.pending_count() == 0  # the queue drains (FlushDiskWatcherTest)


def test_group_commit_updates_physic_timestamp(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH", **PARKED)
    r = store.put_message(msg(1))
    assert r.status == PutMessageStatus.PUT_OK
    assert store.checkpoint.physic_msg_timestamp == r.append_result.store_timestamp


# -- ASYNC_FLUSH ---------------------------------------------------------------------------------
def test_async_flush_least_pages_and_thorough_interval(open_store) -> None:
    store = open_store(flush_disk_type="ASYNC_FLUSH", flush_commit_log_least_pages=4,
                       flush_commit_log_thorough_interval=10_000, flush_interval_commit_log=HOUR,
                       flush_interval_consume_queue=HOUR)
    svc = store.flush_commit_log_service
    mfq = store.commit_log.mapped_file_queue
    t0 = 1_900_000_000_000
    svc.do_flush(now_ms=t0)  # first round is thorough
    base = mfq.flushed_where
    r = store.put_message(msg(1, 100))
    assert r.status == PutMessageStatus.PUT_OK and mfq.flushed_where == base  # not flushed by the put
    svc.do_flush(now_ms=t0 + 500)
    assert mfq.flushed_where == base  # less than 4 dirty pages
    assert store.checkpoint.physic_msg_timestamp != r.append_result.store_timestamp
    for i in range(5):
        store.put_message(msg(10 + i, 4000))  # > 4 pages in all
    svc.do_flush(now_ms=t0 + 1000)
    assert mfq.flushed_where > base
    flushed = mfq.flushed_where
    last = store.put_message(msg(99, 10))
    svc.do_flush(now_ms=t0 + 1500)
    assert mfq.flushed_where == flushed
    svc.do_flush(now_ms=t0 + 10_000)  # the thorough interval passed: flush whatever is dirty
    assert mfq.flushed_where == store.get_max_phy_offset()
    assert store.checkpoint.physic_msg_timestamp == last.append_result.store_timestamp


def test_async_shutdown_flushes_everything(open_store, store_path) -> None:
    store = open_store(flush_disk_type="ASYNC_FLUSH", **PARKED)
    svc = store.flush_commit_log_service
    for i in range(20):
        store.put_message(msg(i, 100))
    mfq = store.commit_log.mapped_file_queue
    end = store.get_max_phy_offset()
    assert mfq.flushed_where < end
    svc.shutdown()
    assert mfq.flushed_where == end
    store.shutdown()
    again = open_store(store_path, **PARKED)
    assert again.get_max_phy_offset() == end


# -- consume queues and the checkpoint -----------------------------------------------------------
def test_flush_consume_queue_service_and_checkpoint(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH", flush_consume_queue_least_pages=2, **PARKED)
    svc = store.flush_consume_queue_service
    t0 = 1_900_000_000_000
    svc.do_flush(now_ms=t0)  # thorough first round
    r = None
    for i in range(10):
        r = store.put_message(msg(i))
    assert store.wait_for_dispatch()
    cq = store.find_consume_queue(TOPIC, 0, create=False)
    cq_mfq = cq.mapped_file_queue
    assert cq_mfq.flushed_where == 0
    assert store.checkpoint.logics_msg_timestamp == r.append_result.store_timestamp  # set by dispatch
    svc.do_flush(now_ms=t0 + 1000)  # 200 bytes of units: fewer than 2 pages
    assert cq_mfq.flushed_where == 0
    # the checkpoint is forced every round: physic came from the group commit, but logics does not
    # vouch for the unflushed units yet
    physic, logics, *_ = read_checkpoint(store)
    assert physic == r.append_result.store_timestamp
    assert logics < r.append_result.store_timestamp
    svc.do_flush(now_ms=t0 + HOUR)  # thorough: all units, then logicsMsgTimestamp
    assert cq_mfq.flushed_where == 10 * 20
    physic, logics, _index, _mf, _confirm = read_checkpoint(store)
    assert physic == logics == r.append_result.store_timestamp
    assert store.checkpoint.get_min_timestamp() == r.append_result.store_timestamp - 3000
    for i in range(500):  # 10 000 bytes of units: more than 2 pages
        store.put_message(msg(100 + i))
    assert store.wait_for_dispatch()
    svc.do_flush(now_ms=t0 + HOUR + 1000)
    assert cq_mfq.flushed_where >= 2 * 4096


def test_checkpoint_file_is_one_page(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH")
    store.put_message(msg(1))
    store.flush_consume_queue_service.do_flush(3)
    assert os.path.getsize(store.config.checkpoint_path) == 4096


def test_full_index_file_flush_writes_index_msg_timestamp(open_store) -> None:
    """indexMsgTimestamp: the end timestamp of an index file, written when the full file is flushed."""
    store = open_store(flush_disk_type="SYNC_FLUSH", max_hash_slot_num=64, max_index_num=50, **PARKED)
    for i in range(60):  # one UNIQ_KEY per message: the first index file fills up
        assert store.put_message(msg(i)).status == PutMessageStatus.PUT_OK
    assert store.wait_for_dispatch()
    store.index_service.wait_for_flushes()
    first = store.index_service.files[0]
    assert first.is_write_full() and first.end_timestamp > 0
    assert store.checkpoint.index_msg_timestamp == first.end_timestamp
    assert read_checkpoint(store)[2] == first.end_timestamp


def test_wait_false_does_not_wait_for_the_flush(open_store) -> None:
    """A message with WAIT=false (`isWaitStoreMsgOK`) only wakes the group commit: PUT_OK at once even
    while the disk does not answer; a batch follows its first message."""
    store = open_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=60_000)
    mfq = store.commit_log.mapped_file_queue
    with store.commit_log.flush_lock:
        r = store.put_message(Message(topic=TOPIC, body=b"nowait", properties={"WAIT": "false"}))
        assert r.status == PutMessageStatus.PUT_OK
        assert mfq.flushed_where < r.append_result.wrote_offset + r.append_result.wrote_bytes
        r = store.put_message(Message(topic=TOPIC, body=b"raw", properties_string="WAIT\x01false\x02"))
        assert r.status == PutMessageStatus.PUT_OK
        r = store.put_messages([Message(topic=TOPIC, body=b"b1", properties={"WAIT": "false"}),
                                Message(topic=TOPIC, body=b"b2")])
        assert r.status == PutMessageStatus.PUT_OK
        assert mfq.flushed_where < r.append_result.wrote_offset
    r = store.put_message(Message(topic=TOPIC, body=b"wait", properties={"WAIT": "true"}))
    assert r.status == PutMessageStatus.PUT_OK
    assert mfq.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes
