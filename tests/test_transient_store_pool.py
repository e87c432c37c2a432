"""The transient store pool (spec §5.2, §5.5): appends go to a write buffer, the commit service copies them
into the file, and only committed bytes are readable or dispatched. SYNC_FLUSH with the pool still puts
the bytes on disk before PUT_OK.
"""

from __future__ import annotations

import os

import pytest

from rmq_eventstore.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from rmq_eventstore.store.transient_store_pool import TransientStorePool

TOPIC = "PoolTopic"
HOUR = 3_600_000
POOL = {
    "transient_store_pool_enable": True,
    "transient_store_pool_size": 3,
    "commit_interval_commit_log": HOUR,
    "commit_commit_log_thorough_interval": HOUR,
    "flush_interval_commit_log": HOUR,
    "flush_interval_consume_queue": HOUR,
}


def msg(i: int, size: int = 16) -> Message:
    return Message(topic=TOPIC, body=(b"%08d" % i) + b"p" * max(0, size - 8))


def file_bytes(store: MessageStore, offset: int, size: int) -> bytes:
    fsize = store.config.mapped_file_size_commit_log
    with open(os.path.join(store.config.commit_log_path, f"{offset - offset % fsize:020d}"), "rb") as f:
        f.seek(offset % fsize)
        return f.read(size)


def test_pool_lends_and_takes_back_buffers() -> None:
    pool = TransientStorePool(2, 4096)
    with pytest.raises(RuntimeError):
        pool.borrow_buffer()
    pool.init()
    a, b = pool.borrow_buffer(), pool.borrow_buffer()
    assert a is not None and b is not None and len(a) == 4096
    assert pool.borrow_buffer() is None and pool.available_buffer_nums() == 0
    pool.return_buffer(a)
    assert pool.available_buffer_nums() == 1
    pool.destroy()
    pool.return_buffer(b)  # returned after destroy: unmapped, not kept
    assert b.closed and pool.available_buffer_nums() == 0
    with pytest.raises(ValueError):
        TransientStorePool(0, 4096)


def test_only_committed_bytes_are_readable_and_dispatched(open_store) -> None:
    store = open_store(flush_disk_type="ASYNC_FLUSH", **POOL)
    assert store.transient_store_pool is not None
    r = store.put_message(msg(1, 100))
    assert r.status == PutMessageStatus.PUT_OK
    off, size = r.append_result.wrote_offset, r.append_result.wrote_bytes
    mf = store.commit_log.mapped_file_queue.get_last_mapped_file_or_none()
    assert mf.write_buffer is not None and mf.wrote_position == size and mf.committed_position == 0
    # written to the buffer only: not in the file, not readable, not dispatched
    assert file_bytes(store, off, size) == bytes(size)
    assert store.look_message_by_offset(off) is None
    assert store.get_max_phy_offset() == 0
    assert store.wait_for_dispatch(0.5)
    assert store.get_message("g", TOPIC, 0, 0, 32).status == GetMessageStatus.NO_MESSAGE_IN_QUEUE
    # a round below commitCommitLogLeastPages commits nothing ...
    svc = store.commit_real_time_service
    t0 = svc.last_commit_timestamp  # the service's first round, at start
    assert t0 > 0
    assert svc.do_commit(now_ms=t0 + 1) is True
    # ... the thorough round commits everything and wakes the dispatcher
    assert svc.do_commit(now_ms=t0 + HOUR) is False
    assert mf.committed_position == size
    raw = file_bytes(store, off, size)
    assert store.select_one_message_by_offset(off) == raw
    assert store.wait_for_dispatch()
    got = store.get_message("g", TOPIC, 0, 0, 32)
    assert got.status == GetMessageStatus.FOUND and got.messages[0].body == msg(1, 100).body
    # flush forces committed bytes only
    store.commit_log.mapped_file_queue.flush(0)
    assert mf.flushed_position == size


def test_sync_flush_with_pool_is_durable_before_put_ok(open_store) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH", **POOL)
    mfq = store.commit_log.mapped_file_queue
    for i in range(30):
        r = store.put_message(msg(i, 200))
        assert r.status == PutMessageStatus.PUT_OK
        end = r.append_result.wrote_offset + r.append_result.wrote_bytes
        assert mfq.committed_where >= end and mfq.flushed_where >= end
        raw = store.select_one_message_by_offset(r.append_result.wrote_offset)
        assert raw is not None and file_bytes(store, r.append_result.wrote_offset, len(raw)) == raw
    r = store.put_messages([msg(100 + i, 300) for i in range(20)])
    assert r.status == PutMessageStatus.PUT_OK
    assert mfq.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes


def test_files_roll_and_buffers_return_to_the_pool(open_store, store_path, read_queue) -> None:
    store = open_store(flush_disk_type="SYNC_FLUSH", **POOL)
    pool = store.transient_store_pool
    fsize = store.config.mapped_file_size_commit_log
    n = 5 * fsize // 600
    for i in range(n):
        assert store.put_message(msg(i, 500)).status == PutMessageStatus.PUT_OK
    files = store.commit_log.mapped_file_queue.mapped_files
    assert len(files) >= 5  # more files than buffers: fully committed files gave theirs back
    assert all(f.write_buffer is None and f.committed_position == fsize for f in files[:-1])
    assert files[-1].write_buffer is not None
    assert pool.available_buffer_nums() == pool.pool_size - 1
    assert store.wait_for_dispatch()
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [msg(i, 500).body for i in range(n)]
    end = store.get_max_phy_offset()
    store.shutdown()
    again = open_store(store_path)  # reopened without the pool: the same bytes
    assert again.get_max_phy_offset() == end
    assert [m.body for _, m in read_queue(again, TOPIC, 0)] == [msg(i, 500).body for i in range(n)]


def test_async_pool_shutdown_commits_and_dispatches_everything(open_store, store_path, read_queue) -> None:
    store = open_store(flush_disk_type="ASYNC_FLUSH", **POOL)
    for i in range(40):
        store.put_message(msg(i, 50))
    assert store.get_max_phy_offset() == 0  # nothing committed yet
    store.shutdown()
    assert not os.path.exists(store.config.abort_path)  # a clean shutdown: everything was dispatched
    again = open_store(store_path)
    assert [m.body for _, m in read_queue(again, TOPIC, 0)] == [msg(i, 50).body for i in range(40)]


def test_pool_exhausted_falls_back_to_the_mapping(open_store, read_queue) -> None:
    """A file created while every buffer is lent out is written through the mapping (readable at once);
    the next file created after a buffer came back uses it again."""
    store = open_store(flush_disk_type="ASYNC_FLUSH", **{**POOL, "transient_store_pool_size": 1})
    pool = store.transient_store_pool
    held = pool.borrow_buffer()  # e.g. a file whose commit lags behind
    assert held is not None and pool.borrow_buffer() is None
    r = store.put_message(msg(0, 500))
    files = store.commit_log.mapped_file_queue.mapped_files
    assert files[0].write_buffer is None and not files[0].transient
    assert store.look_message_by_offset(r.append_result.wrote_offset).body == msg(0, 500).body
    pool.return_buffer(held)
    fsize = store.config.mapped_file_size_commit_log
    n = fsize // 500
    for i in range(1, n):
        assert store.put_message(msg(i, 500)).status == PutMessageStatus.PUT_OK
    files = store.commit_log.mapped_file_queue.mapped_files
    assert len(files) == 2 and files[1].transient
    svc = store.commit_real_time_service
    svc.do_commit(now_ms=svc.last_commit_timestamp + HOUR)
    svc.do_commit(now_ms=svc.last_commit_timestamp + HOUR)
    assert store.wait_for_dispatch()
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [msg(i, 500).body for i in range(n)]
