"""MessageStore end to end on real files, mirroring RocketMQ's `DefaultMessageStoreTest` (spec §15):
the store lock, write/read with IPv4 and IPv6 hosts, lookups by offset, time and id, property and size
limits, recovery from a damaged tail (normal and abnormal), the `getMessage` status table (§12.2),
key queries through the index (§7.6) and a stateful model test of put / get / restart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rmq_eventstore.common import codec
from rmq_eventstore.store import (
    GetMessageStatus,
    Message,
    MessageFilter,
    MessageStore,
    PutMessageStatus,
    StoreConfig,
    StoreLockedError,
)
from rmq_eventstore.store.mapped_file import StoreLoadError

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPIC = "FooBar"
BODY_HEADER_V4 = 88  # TOTALSIZE .. BODYLEN of an IPv4/IPv4 record (spec §1.2): the body starts here


def ok(r) -> None:
    assert r.status == PutMessageStatus.PUT_OK, r



def put_n(store: MessageStore, n: int, topic: str = TOPIC, queue_id: int = 0, **kw) -> list:
    results = []
    for i in range(n):
        r = store.put_message(Message(topic=topic, body=f"body-{i}".encode(), queue_id=queue_id,
                                      keys=[f"key-{i}"], tags=kw.get("tags")))
        ok(r)
        results.append(r)
    return results


def run_child(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=60)


# -- test_repeat_restart (the lock) ---------------------------------------------------------------
def test_repeat_restart_same_process(store, store_path, small_geometry, open_store):
    ok(store.put_message(Message(topic=TOPIC, body=b"first")))
    with pytest.raises(StoreLockedError, match="already open"):
        MessageStore.open(store_path, **small_geometry)
    second = MessageStore(StoreConfig(store_path_root_dir=str(store_path), **small_geometry))
    with pytest.raises(StoreLockedError, match=str(store_path)):
        second.load()
    # The refused openers changed nothing: the owner keeps working.
    ok(store.put_message(Message(topic=TOPIC, body=b"second")))
    store.shutdown()
    again = open_store()
    assert again.wait_for_dispatch()
    assert [m.body for m in again.get_message("g", TOPIC, 0, 0, 10).messages] == [b"first", b"second"]


def test_repeat_restart_from_child_process(store, store_path, open_store):
    ok(store.put_message(Message(topic=TOPIC, body=b"parent")))
    code = f"""
        from rmq_eventstore.store import MessageStore, StoreLockedError
        try:
            MessageStore.open({str(store_path)!r}, mapped_file_size_commit_log=64 * 1024)
        except StoreLockedError as e:
            print("LOCKED", e)
        else:
            print("OPENED")
        """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("LOCKED") and "already open" in r.stdout, r.stdout
    store.shutdown()
    # Once the owner is gone the child can open, write and close the directory.
    r = run_child(f"""
        from rmq_eventstore.store import Message, MessageStore, PutMessageStatus
        s = MessageStore.open({str(store_path)!r}, mapped_file_size_commit_log=64 * 1024,
                              mapped_file_size_consume_queue=20 * 1000, max_hash_slot_num=1024,
                              max_index_num=4096)
        assert s.put_message(Message(topic={TOPIC!r}, body=b"child")).status == PutMessageStatus.PUT_OK
        s.shutdown()
        print("DONE")
        """)
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
    again = open_store()
    assert again.wait_for_dispatch()
    assert [m.body for m in again.get_message("g", TOPIC, 0, 0, 10).messages] == [b"parent", b"child"]


def test_refused_second_open_keeps_the_posix_lock(store, store_path, small_geometry):
    """The owner holds the POSIX record lock on byte 0 of `lock` (what a Java broker's
    `FileChannel.tryLock` takes) for as long as it runs, even after a refused second opener in the same
    process: a Java RocketMQ broker must never be able to open a store we own."""
    probe = f"""
        import fcntl, os
        fd = os.open({str(store_path / "lock")!r}, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            print("HELD")
        else:
            print("FREE")
        """
    assert run_child(probe).stdout.strip() == "HELD"
    with pytest.raises(StoreLockedError):
        MessageStore.open(store_path, **small_geometry)
    assert run_child(probe).stdout.strip() == "HELD", (
        "a refused second MessageStore in the owner's process dropped the owner's POSIX lock on byte 0 "
        "(closing any descriptor of a file releases the process's fcntl locks on it)")


def test_same_directory_through_a_symlink_is_refused(store, store_path, tmp_path, small_geometry, open_store):
    alias = tmp_path / "alias"
    alias.symlink_to(store_path, target_is_directory=True)
    with pytest.raises(StoreLockedError):
        MessageStore.open(alias, **small_geometry)
    ok(store.put_message(Message(topic=TOPIC, body=b"still mine")))
    # Another directory opens beside it in the same process; the two do not see each other.
    other = open_store(tmp_path / "other")
    ok(other.put_message(Message(topic=TOPIC, body=b"other")))
    assert store.wait_for_dispatch() and other.wait_for_dispatch()
    assert [m.body for m in store.get_message("g", TOPIC, 0, 0, 10).messages] == [b"still mine"]
    assert [m.body for m in other.get_message("g", TOPIC, 0, 0, 10).messages] == [b"other"]


# -- testWriteAndRead ---------------------------------------------------------------------------------
@pytest.mark.parametrize("store_host, id_len, store_v6", [
    ("127.0.0.1:10911", 32, False), ("[::1]:10911", 56, True)], ids=["store-ipv4", "store-ipv6"])
def test_write_and_read(open_store, store_host, id_len, store_v6):
    store = open_store(store_host=store_host)
    sent = []
    for i in range(20):
        v6 = i >= 10
        born = "[::1]:1234" if v6 else "10.0.0.7:4321"
        body = f"{'v6' if v6 else 'v4'}-message-{i}".encode()
        r = store.put_message(Message(topic=TOPIC, body=body, born_host=born, queue_id=0, tags="TagA",
                                      keys=[f"k{i}"]))
        ok(r)
        a = r.append_result
        assert a.logics_offset == i
        assert len(a.msg_id) == id_len and a.msg_id == a.msg_id.upper()
        assert codec.decode_message_id(a.msg_id)[2] == a.wrote_offset
        sent.append((a, body, v6))
    for a, body, v6 in sent:
        m = store.look_message_by_offset(a.wrote_offset)
        assert m is not None and m.body == body and m.topic == TOPIC
        assert m.commit_log_offset == a.wrote_offset and m.store_size == a.wrote_bytes
        assert bool(m.sys_flag & codec.BORNHOST_V6_FLAG) == v6
        assert bool(m.sys_flag & codec.STOREHOSTADDRESS_V6_FLAG) == store_v6
        assert m.born_host == ("[0:0:0:0:0:0:0:1]:1234" if v6 else "10.0.0.7:4321")
        assert m.store_host == ("[0:0:0:0:0:0:0:1]:10911" if store_v6 else "127.0.0.1:10911")
        assert m.msg_id == a.msg_id
        assert m.store_timestamp == a.store_timestamp
        by_id = store.view_message_by_id(a.msg_id)
        assert by_id is not None and by_id.body == body
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 0, 32)
    assert r.status == GetMessageStatus.FOUND and r.message_count == 20
    assert [m.body for m in r.messages] == [b for _, b, _ in sent]
    assert r.commit_log_offsets == [a.wrote_offset for a, _, _ in sent]
    assert [m.queue_offset for m in r.messages] == list(range(20))
    assert all(m.tags == "TagA" for m in r.messages)


# -- testLookMessageByOffset_* -------------------------------------------------------------------------
def test_look_message_by_offset(store):
    results = put_n(store, 10)
    first, last = results[0].append_result, results[-1].append_result
    assert store.look_message_by_offset(first.wrote_offset).body == b"body-0"
    assert store.look_message_by_offset(last.wrote_offset).body == b"body-9"
    end = store.get_max_phy_offset()
    assert end == last.wrote_offset + last.wrote_bytes
    assert store.look_message_by_offset(end) is None  # just past the end
    assert store.look_message_by_offset(end + 12345) is None
    assert store.look_message_by_offset(first.wrote_offset + 1) is None  # not a record start
    assert store.look_message_by_offset(last.wrote_offset + 4) is None
    assert store.look_message_by_offset(-1) is None
    assert store.view_message_by_id(codec.create_message_id(bytes([127, 0, 0, 1]), 10911, end)) is None
    with pytest.raises(ValueError, match="32"):
        store.view_message_by_id("not-a-message-id")
    raw = store.select_one_message_by_offset(last.wrote_offset)
    assert raw is not None and len(raw) == last.wrote_bytes
    assert codec.decode_message(raw, check_crc=True).body == b"body-9"


# -- testGetOffsetInQueueByTime* ------------------------------------------------------------------------
def test_get_offset_in_queue_by_time(open_store, fake_clock):
    # 10 units per consume-queue file: the lookup must pick the right file first.
    store = open_store(mapped_file_size_consume_queue=200)
    stamps, results = [], []
    for i in range(35):
        fake_clock.advance(10)
        r = store.put_message(Message(topic=TOPIC, body=f"m{i}".encode(), queue_id=1))
        ok(r)
        assert r.append_result.store_timestamp == fake_clock.now
        stamps.append(fake_clock.now)
        results.append(r.append_result)
    assert store.wait_for_dispatch()
    for i, ts in enumerate(stamps):
        for probe in (ts, ts - 2, ts - 9):  # testGetOffsetInQueueByTime_TimestampIsSkewing
            off = store.get_offset_in_queue_by_time(TOPIC, 1, probe)
            assert off == i, (i, probe)
            assert store.get_commit_log_offset_in_queue(TOPIC, 1, off) == results[i].wrote_offset
        assert store.get_offset_in_queue_by_time(TOPIC, 1, ts + 2) == i + 1
    assert store.get_offset_in_queue_by_time(TOPIC, 1, 0) == 0
    assert store.get_offset_in_queue_by_time(TOPIC, 1, stamps[-1] + 1) == 35
    # Unknown topic or queue: offset 0.
    assert store.get_offset_in_queue_by_time("NoSuchTopic", 1, stamps[5]) == 0
    assert store.get_offset_in_queue_by_time(TOPIC, 7, stamps[5]) == 0


def test_get_offset_in_queue_by_time_with_skewed_store_clock(store, fake_clock):
    """A store clock that steps backwards: the answer is still a lower boundary, i.e. the unit at the
    returned offset was stored at or after the timestamp and the one before it earlier."""
    deltas = [10, 10, -15, 20, 10, -30, 50, 10, 10, -5, 30]
    stamps = []
    for i, d in enumerate(deltas):
        fake_clock.advance(d)
        ok(store.put_message(Message(topic=TOPIC, body=f"m{i}".encode())))
        stamps.append(fake_clock.now)
    assert store.wait_for_dispatch()
    for ts in range(min(stamps) - 3, max(stamps) + 4):
        k = store.get_offset_in_queue_by_time(TOPIC, 0, ts)
        assert 0 <= k <= len(stamps)
        if k < len(stamps):
            assert stamps[k] >= ts, (ts, k)
        if k > 0:
            assert stamps[k - 1] < ts, (ts, k)


# -- testGetMessageStoreTimeStamp / testGetStoreTime_* ------------------------------------------------------
def test_get_message_store_timestamp(open_store, fake_clock, store_path):
    store = open_store(mapped_file_size_commit_log=4096)
    appended = []
    for i in range(60):
        fake_clock.advance(7)
        r = store.put_message(Message(topic=TOPIC, body=b"x" * 100, queue_id=0, keys=[f"k{i}"]))
        ok(r)
        appended.append(r.append_result)
    assert store.wait_for_dispatch()
    for i, a in enumerate(appended):
        assert store.get_message_store_timestamp(TOPIC, 0, i) == a.store_timestamp
    assert store.get_earliest_message_time(TOPIC, 0) == appended[0].store_timestamp
    assert store.get_message_store_timestamp(TOPIC, 0, 60) == -1  # no unit there
    assert store.get_message_store_timestamp(TOPIC, 0, -1) == -1
    assert store.get_message_store_timestamp(TOPIC, 3, 0) == -1  # unknown queue
    assert store.get_message_store_timestamp("NoSuchTopic", 0, 0) == -1
    assert store.get_earliest_message_time("NoSuchTopic", 0) == -1
    # Units whose records lie below the commitlog min offset: -1 (the first segment is deleted, as the
    # expired-file cleaner would).
    store.shutdown()
    first = store_path / "commitlog" / f"{0:020d}"
    assert first.exists()
    first.unlink()
    store = open_store(mapped_file_size_commit_log=4096)
    min_phy = store.get_min_phy_offset()
    assert min_phy == 4096
    gone = [i for i, a in enumerate(appended) if a.wrote_offset < min_phy]
    assert gone
    for i in gone:
        assert store.get_message_store_timestamp(TOPIC, 0, i) == -1
    live = len(gone)
    assert store.get_message_store_timestamp(TOPIC, 0, live) == appended[live].store_timestamp
    assert store.get_earliest_message_time(TOPIC, 0) == appended[live].store_timestamp
    # Lookups by time skip the units whose records are gone.
    assert store.get_offset_in_queue_by_time(TOPIC, 0, 0) == live
    assert store.get_offset_in_queue_by_time(TOPIC, 0, appended[live + 3].store_timestamp) == live + 3


# -- testPutMessage_whenMessagePropertyIsTooLong --------------------------------------------------------
def test_put_message_when_message_property_is_too_long(store):
    ok(store.put_message(Message(topic=TOPIC, body=b"before", queue_id=0)))
    max_before = store.get_max_phy_offset()
    too_long = "a\x01" + "v" * (32768 - 3) + "\x02"
    assert len(too_long.encode()) == 32768
    r = store.put_message(Message(topic=TOPIC, body=b"x", queue_id=0, properties_string=too_long))
    assert r.status == PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert not r.is_ok() and r.append_result is None and r.reason
    assert store.get_max_phy_offset() == max_before
    # The same through `properties`: still too long once encoded.
    r = store.put_message(Message(topic=TOPIC, body=b"x", properties={"big": "v" * 32768}))
    assert r.status == PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    # No queue offset was taken by the refused puts.
    r = store.put_message(Message(topic=TOPIC, body=b"after", queue_id=0,
                                  properties={"p": "v" * 100}))
    ok(r)
    assert r.append_result.logics_offset == 1
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue(TOPIC, 0) == 2
    assert store.look_message_by_offset(r.append_result.wrote_offset).properties["p"] == "v" * 100


# -- testMaxOffset ---------------------------------------------------------------------------------------
def test_max_offset(store):
    assert store.get_max_phy_offset() == 0
    assert store.get_max_offset_in_queue(TOPIC, 0) == 0
    total = 0
    for i in range(30):
        r = store.put_message(Message(topic=TOPIC, body=b"m" * i, queue_id=i % 3))
        ok(r)
        assert r.append_result.logics_offset == i // 3
        assert r.append_result.wrote_offset == total
        total += r.append_result.wrote_bytes
    assert store.get_max_phy_offset() == total
    assert store.get_min_phy_offset() == 0
    assert store.wait_for_dispatch()
    for q in range(3):
        assert store.get_max_offset_in_queue(TOPIC, q) == 10
        assert store.get_min_offset_in_queue(TOPIC, q) == 0
    assert store.get_max_offset_in_queue(TOPIC, 3) == 0
    assert store.dispatch_behind_bytes() == 0


# -- testPullSize --------------------------------------------------------------------------------------
def test_pull_size(store):
    put_n(store, 32)
    assert store.wait_for_dispatch()
    for max_nums in (32, 20, 10):
        r = store.get_message("g", TOPIC, 0, 0, max_nums)
        assert r.status == GetMessageStatus.FOUND
        assert r.message_count == max_nums
        assert r.next_begin_offset == max_nums
        assert [m.body for m in r.messages] == [f"body-{i}".encode() for i in range(max_nums)]


# -- testRecover --------------------------------------------------------------------------------------
def _damage_topic_len(store_path: Path, file_size: int, offset: int, body_len: int) -> None:
    """Zero 16 bytes of the record at `offset`, starting at its TOPICLEN field (IPv4/IPv4 layout)."""
    seg = store_path / "commitlog" / f"{offset - offset % file_size:020d}"
    pos = offset % file_size + BODY_HEADER_V4 + body_len
    fd = os.open(seg, os.O_RDWR)
    try:
        os.pwrite(fd, bytes(16), pos)
    finally:
        os.close(fd)


def test_recover_normal_restart(store, open_store, read_queue):
    results = put_n(store, 20)
    end = store.get_max_phy_offset()
    store.shutdown()
    store = open_store()
    assert store.last_exit_ok
    assert store.get_max_phy_offset() == end
    assert store.get_max_offset_in_queue(TOPIC, 0) == 20
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [f"body-{i}".encode() for i in range(20)]
    r = store.put_message(Message(topic=TOPIC, body=b"next"))
    ok(r)
    assert r.append_result.wrote_offset == end and r.append_result.logics_offset == 20
    assert results[0].append_result.wrote_offset == 0


@pytest.mark.parametrize("abort", [False, True], ids=["normal", "abort-file"])
def test_recover_damaged_tail(open_store, store_path, small_geometry, abort):
    store = open_store()
    results = put_n(store, 10)
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue(TOPIC, 0) == 10
    last = results[-1].append_result
    assert store.get_max_phy_offset() == last.wrote_offset + last.wrote_bytes
    store.shutdown()
    _damage_topic_len(store_path, small_geometry["mapped_file_size_commit_log"], last.wrote_offset,
                      len(b"body-9"))
    if abort:
        (store_path / "abort").write_text("12345")
    store = open_store()
    assert store.last_exit_ok is not abort
    # Everything falls back to the previous message.
    assert store.get_max_phy_offset() == last.wrote_offset
    assert store.get_max_offset_in_queue(TOPIC, 0) == 9
    assert store.look_message_by_offset(last.wrote_offset) is None
    g = store.get_message("g", TOPIC, 0, 9, 32)
    assert g.status == GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert [m.body for m in store.get_message("g", TOPIC, 0, 0, 32).messages] == \
        [f"body-{i}".encode() for i in range(9)]
    # The damaged message's key no longer finds anything, even once its offset holds another message.
    assert store.query_message(TOPIC, "key-9").messages == []
    r = store.put_message(Message(topic=TOPIC, body=b"replacement", keys=["other"]))
    ok(r)
    assert r.append_result.wrote_offset == last.wrote_offset and r.append_result.logics_offset == 9
    assert store.wait_for_dispatch()
    assert store.query_message(TOPIC, "key-9").messages == []
    assert [m.body for m in store.query_message(TOPIC, "other").messages] == [b"replacement"]


@pytest.mark.parametrize("index_geometry", [{}, {"max_hash_slot_num": 4, "max_index_num": 8}],
                         ids=["one-index-file", "rolled-index-files"])
def test_recover_after_abort_keeps_keys_queryable(open_store, store_path, index_geometry):
    """After an unclean stop (the `abort` file is left behind) the index must still answer for every
    message in the recovered commitlog: RocketMQ's abnormal recovery re-dispatches the records it walks
    into the consume queues *and* the index (spec §9.4)."""
    store = open_store(**index_geometry)
    put_n(store, 30)
    assert store.wait_for_dispatch()
    assert len(store.query_message(TOPIC, "key-3").messages) == 1
    store.shutdown()
    (store_path / "abort").write_text("12345")
    store = open_store(**index_geometry)
    assert not store.last_exit_ok
    assert store.get_max_offset_in_queue(TOPIC, 0) == 30
    found = {i: [m.body for m in store.query_message(TOPIC, f"key-{i}").messages] for i in range(30)}
    assert found == {i: [f"body-{i}".encode()] for i in range(30)}


@pytest.mark.parametrize("config", [
    {"message_index_enable": False},
    {"max_hash_slot_num": 4, "max_index_num": 8},
], ids=["index-disabled", "rolled-index-files"])
def test_abnormal_recovery_repairs_a_consume_queue_that_lost_its_tail(open_store, store_path, read_queue,
                                                                      config):
    """A power loss can drop the last unflushed page of one consume queue while the commitlog and other
    queues made it to disk. RocketMQ's abnormal recovery (spec §9.4) re-dispatches every record from the
    file chosen by the checkpoint's timestamps, so the queue gets its units back; it must not be left
    short (its messages unreachable, their queue offsets handed out again)."""
    store = open_store(**config)
    results = [store.put_message(Message(topic=TOPIC, body=b"m%d" % i, queue_id=i % 2, keys=[f"k{i}"]))
               for i in range(20)]
    for r in results:
        ok(r)
    assert store.wait_for_dispatch()
    store.shutdown()
    # Queue 0 loses its units 7, 8 and 9 (messages 14, 16 and 18); queue 1 is intact.
    cq0 = store_path / "consumequeue" / TOPIC / "0" / f"{0:020d}"
    fd = os.open(cq0, os.O_RDWR)
    try:
        os.pwrite(fd, bytes(3 * 20), 7 * 20)
    finally:
        os.close(fd)
    (store_path / "abort").write_text("12345")
    store = open_store(**config)
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue(TOPIC, 1) == 10
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [b"m%d" % i for i in range(0, 20, 2)]
    r = store.put_message(Message(topic=TOPIC, body=b"next", queue_id=0))
    ok(r)
    assert r.append_result.logics_offset == 10


@pytest.mark.parametrize("check_crc", [True, False], ids=["crc-checked", "crc-not-checked"])
def test_recover_body_crc_mismatch(open_store, store_path, small_geometry, check_crc):
    """A flipped body byte in the middle of the log, then an abnormal restart: with `check_crc_on_recover`
    (the default) recovery ends the log at that record (spec §9.4: everything after the first corrupt
    record is truncated); without it only the structural checks run and the record stays. (After a
    clean stop the log is not rescanned; `verify` reports such damage: tests/test_recovery.py.)"""
    store = open_store(check_crc_on_recover=check_crc)
    results = put_n(store, 10)
    store.shutdown()
    bad = results[5].append_result
    seg = store_path / "commitlog" / f"{0:020d}"
    fd = os.open(seg, os.O_RDWR)
    try:
        pos = bad.wrote_offset + BODY_HEADER_V4
        os.pwrite(fd, bytes([os.pread(fd, 1, pos)[0] ^ 0xFF]), pos)
    finally:
        os.close(fd)
    (store_path / "abort").write_text("12345")
    store = open_store(check_crc_on_recover=check_crc)
    assert store.wait_for_dispatch()
    if check_crc:
        assert store.get_max_phy_offset() == bad.wrote_offset
        assert store.get_max_offset_in_queue(TOPIC, 0) == 5
        assert store.look_message_by_offset(bad.wrote_offset) is None
        r = store.put_message(Message(topic=TOPIC, body=b"after"))
        ok(r)
        assert (r.append_result.wrote_offset, r.append_result.logics_offset) == (bad.wrote_offset, 5)
    else:
        assert store.get_max_phy_offset() == results[-1].append_result.wrote_offset + \
            results[-1].append_result.wrote_bytes
        assert store.get_max_offset_in_queue(TOPIC, 0) == 10
        m = store.look_message_by_offset(bad.wrote_offset)
        assert m.body != b"body-5" and len(m.body) == len(b"body-5")
        with pytest.raises(codec.CorruptRecordError, match="CRC"):
            codec.decode_message(store.select_one_message_by_offset(bad.wrote_offset), check_crc=True)


# -- getMessage status table (§12.2) -------------------------------------------------------------------------
def test_get_message_no_message_in_queue(store):
    r = store.get_message("g", "NoSuchTopic", 0, 0, 32)
    assert r.status == GetMessageStatus.NO_MESSAGE_IN_QUEUE
    assert (r.next_begin_offset, r.min_offset, r.max_offset, r.message_count) == (0, 0, 0, 0)
    put_n(store, 3, queue_id=0)
    assert store.wait_for_dispatch()
    assert store.get_message("g", TOPIC, 5, 0, 32).status == GetMessageStatus.NO_MESSAGE_IN_QUEUE
    # An existing but empty queue (RocketMQ creates the queue on lookup).
    store.find_consume_queue(TOPIC, 6)
    r = store.get_message("g", TOPIC, 6, 3, 32)
    assert r.status == GetMessageStatus.NO_MESSAGE_IN_QUEUE and r.next_begin_offset == 0


def test_get_message_offset_overflow(store):
    put_n(store, 5)
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 5, 32)
    assert r.status == GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (5, 0, 5)
    r = store.get_message("g", TOPIC, 0, 9, 32)
    assert r.status == GetMessageStatus.OFFSET_OVERFLOW_BADLY
    assert r.next_begin_offset == 5 and r.message_count == 0
    r = store.get_message("g", TOPIC, 0, -1, 32)
    assert r.status == GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == 0


def test_get_message_offset_too_small_after_min_moves(open_store, store_path):
    store = open_store(mapped_file_size_commit_log=4096)
    results = put_n(store, 100)
    store.shutdown()
    (store_path / "commitlog" / f"{0:020d}").unlink()  # what the expired-file cleaner does
    store = open_store(mapped_file_size_commit_log=4096)
    min_q = store.get_min_offset_in_queue(TOPIC, 0)
    expected_min = next(i for i, r in enumerate(results) if r.append_result.wrote_offset >= 4096)
    assert min_q == expected_min > 0
    r = store.get_message("g", TOPIC, 0, 0, 32)
    assert r.status == GetMessageStatus.OFFSET_TOO_SMALL
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (min_q, min_q, 100)
    r = store.get_message("g", TOPIC, 0, min_q, 1)
    assert r.status == GetMessageStatus.FOUND and r.messages[0].body == f"body-{min_q}".encode()


def test_get_message_offset_found_null_when_a_queue_file_is_missing(open_store, store_path):
    store = open_store(mapped_file_size_consume_queue=10 * 20)
    put_n(store, 40)
    assert store.wait_for_dispatch()
    store.shutdown()
    (store_path / "consumequeue" / TOPIC / "0" / f"{200:020d}").unlink()  # units 10..19
    store = open_store(mapped_file_size_consume_queue=10 * 20)
    assert store.get_max_offset_in_queue(TOPIC, 0) == 40
    r = store.get_message("g", TOPIC, 0, 12, 32)
    assert r.status == GetMessageStatus.OFFSET_FOUND_NULL
    assert r.next_begin_offset == 20  # rollNextFile: the first offset of the next file
    r = store.get_message("g", TOPIC, 0, 20, 32)
    assert r.status == GetMessageStatus.FOUND and r.messages[0].body == b"body-20"
    assert r.message_count == 10  # one consume-queue file per pull


def test_get_message_no_matched_message_within_filter_window(open_store):
    store = open_store(mapped_file_size_consume_queue=20 * 2000)
    for i in range(1000):
        ok(store.put_message(Message(topic=TOPIC, body=b"%d" % i, tags="TagA")))
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 0, 32, MessageFilter("TagZ"))
    assert r.status == GetMessageStatus.NO_MATCHED_MESSAGE
    assert r.message_count == 0
    assert r.next_begin_offset == 800  # 16000 bytes of consume queue = 800 units scanned
    r = store.get_message("g", TOPIC, 0, 800, 32, "TagZ")
    assert r.status == GetMessageStatus.NO_MATCHED_MESSAGE and r.next_begin_offset == 1000
    # A pull of more messages widens the window to max_msg_nums units.
    r = store.get_message("g", TOPIC, 0, 0, 900, "TagZ")
    assert r.status == GetMessageStatus.NO_MATCHED_MESSAGE and r.next_begin_offset == 900


def test_get_message_tag_filters(store):
    tags = ["TagA", "TagB", "TagC"]
    for i in range(30):
        ok(store.put_message(Message(topic=TOPIC, body=b"%d" % i, tags=tags[i % 3])))
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 0, 32, MessageFilter("TagA || TagB"))
    assert r.status == GetMessageStatus.FOUND
    assert [m.tags for m in r.messages] == ["TagA", "TagB"] * 10
    assert r.message_queue_offsets == [i for i in range(30) if i % 3 != 2]
    assert r.next_begin_offset == 30
    for expr in ("*", "", None):
        assert store.get_message("g", TOPIC, 0, 0, 32, expr).message_count == 30
    r = store.get_message("g", TOPIC, 0, 0, 5, " TagC ")
    assert [m.body for m in r.messages] == [b"2", b"5", b"8", b"11", b"14"]
    assert r.next_begin_offset == 15


def test_get_message_tag_hash_collision_is_rechecked(store):
    assert codec.java_string_hash("Aa") == codec.java_string_hash("BB")
    for i, tag in enumerate(["Aa", "BB", "Aa", "BB"]):
        ok(store.put_message(Message(topic=TOPIC, body=b"%d" % i, tags=tag)))
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 0, 32, "BB")
    assert [m.body for m in r.messages] == [b"1", b"3"]


def test_get_message_transfer_limits_in_memory(open_store):
    store = open_store(mapped_file_size_commit_log=1024 * 1024)
    put_n(store, 40)
    assert store.wait_for_dispatch()
    r = store.get_message("g", TOPIC, 0, 0, 64)
    assert r.message_count == 32  # maxTransferCountOnMessageInMemory
    assert r.next_begin_offset == 32
    # maxTransferBytesOnMessageInMemory = 256 KiB
    big = [store.put_message(Message(topic="Big", body=bytes([i]) * 10_000)) for i in range(40)]
    for r in big:
        ok(r)
    assert store.wait_for_dispatch()
    size = big[0].append_result.wrote_bytes
    expect = 1 + (256 * 1024 - size) // size
    r = store.get_message("g", "Big", 0, 0, 64)
    assert r.message_count == expect
    assert r.buffer_total_size == expect * size <= 256 * 1024
    assert r.next_begin_offset == expect
    # max_total_msg_size caps a pull too (at least one message is always returned).
    r = store.get_message("g", "Big", 0, 0, 64, max_total_msg_size=3 * size)
    assert r.message_count == 3
    r = store.get_message("g", "Big", 0, 0, 64, max_total_msg_size=1)
    assert r.message_count == 1


def test_reads_after_shutdown_return_nothing_and_move_no_consumer(store):
    """RocketMQ's `getMessage` returns null once the store is shut down (spec §12.2): a pull racing a
    shutdown must not hand the consumer a new offset (a broker would commit it and skip messages), and
    lookups must not fail with errors about released buffers."""
    put_n(store, 5)
    assert store.wait_for_dispatch()
    offset = store.look_message_by_offset(0).commit_log_offset
    store.shutdown()
    r = store.get_message("g", TOPIC, 0, 2, 32)
    assert r is None or (r.message_count == 0 and r.next_begin_offset == 2), r
    for call in (lambda: store.look_message_by_offset(offset), lambda: store.select_one_message_by_offset(0)):
        try:
            assert call() is None
        except Exception as e:  # noqa: BLE001 - a clear error is acceptable, a leaked internal one is not
            assert "shut" in str(e).lower() or "not running" in str(e).lower(), repr(e)


# -- query_message (index, spec §7.6) ------------------------------------------------------------------------
def test_query_message_by_keys_and_uniq_key(store):
    r1 = store.put_message(Message(topic=TOPIC, body=b"one", keys=["order-1", "cust-7"]))
    r2 = store.put_message(Message(topic=TOPIC, body=b"two", keys="order-2  cust-7 "))
    r3 = store.put_message(Message(topic=TOPIC, body=b"three", uniq_key="0A0B0C0D0E0F00000000000000000001"))
    for r in (r1, r2, r3):
        ok(r)
    uniq1 = r1.append_result.uniq_keys[0]
    assert uniq1 and len(uniq1) == 32 and uniq1 == uniq1.upper()  # created by the store
    assert r3.append_result.uniq_keys == ["0A0B0C0D0E0F00000000000000000001"]
    assert store.wait_for_dispatch()
    assert store.look_message_by_offset(r1.append_result.wrote_offset).uniq_key == uniq1

    def bodies(key, topic=TOPIC, **kw):
        return [m.body for m in store.query_message(topic, key, **kw).messages]

    assert bodies("order-1") == [b"one"]
    assert bodies("order-2") == [b"two"]
    assert bodies("cust-7") == [b"one", b"two"]
    assert bodies(uniq1) == [b"one"]
    assert bodies("0A0B0C0D0E0F00000000000000000001") == [b"three"]
    assert bodies("order-3") == []
    assert bodies("order-1", topic="OtherTopic") == []
    q = store.query_message(TOPIC, "order-1")
    assert q.index_last_update_phyoffset == r3.append_result.wrote_offset
    assert q.index_last_update_timestamp == r3.append_result.store_timestamp


def test_query_message_java_hash_collision_issue_3613(store):
    assert codec.java_string_hash("AaTopic#BB") == codec.java_string_hash("BBTopic#Aa")
    ok(store.put_message(Message(topic="AaTopic", body=b"from-AaTopic", keys=["BB"])))
    ok(store.put_message(Message(topic="BBTopic", body=b"from-BBTopic", keys=["Aa"])))
    assert store.wait_for_dispatch()
    assert [m.body for m in store.query_message("AaTopic", "BB").messages] == [b"from-AaTopic"]
    assert [m.body for m in store.query_message("BBTopic", "Aa").messages] == [b"from-BBTopic"]
    assert store.query_message("AaTopic", "Aa").messages == []
    assert store.query_message("BBTopic", "BB").messages == []


def test_query_message_max_num(store):
    results = [store.put_message(Message(topic=TOPIC, body=b"%d" % i, keys=["same"])) for i in range(100)]
    assert store.wait_for_dispatch()
    q = store.query_message(TOPIC, "same", max_num=3)
    # The index chain is walked newest first.
    assert [m.commit_log_offset for m in q.messages] == [r.append_result.wrote_offset for r in results[-3:]]
    assert len(store.query_message(TOPIC, "same", max_num=100).messages) == 64  # maxMsgsNumBatch
    assert len(store.query_message(TOPIC, "same", max_num=64).messages) == 64


def test_query_message_time_range(store, fake_clock):
    stamps = []
    for i in range(10):
        fake_clock.advance(10_000)  # the index keeps store times in whole seconds
        ok(store.put_message(Message(topic=TOPIC, body=b"%d" % i, keys=["k"])))
        stamps.append(fake_clock.now)
    assert store.wait_for_dispatch()
    def bodies(begin, end):
        return [m.body for m in store.query_message(TOPIC, "k", 32, begin, end).messages]

    assert bodies(0, None) == [b"%d" % i for i in range(10)]
    assert bodies(stamps[3], stamps[6]) == [b"3", b"4", b"5", b"6"]
    assert bodies(stamps[3] + 1, stamps[6] - 1) == [b"4", b"5"]
    assert bodies(stamps[9] + 1, stamps[9] + 5000) == []
    assert bodies(0, stamps[0] - 1) == []


def test_query_message_across_index_files(open_store, store_path):
    # 7 entries per index file; each message adds two (its key and its UNIQ_KEY).
    store = open_store(max_hash_slot_num=4, max_index_num=8)
    uniq = []
    for i in range(60):
        r = store.put_message(Message(topic=TOPIC, body=b"%d" % i, keys=[f"k{i}", "shared"]))
        ok(r)
        uniq.append(r.append_result.uniq_keys[0])
    assert store.wait_for_dispatch()
    assert len(os.listdir(store_path / "index")) >= 10
    for i in range(60):
        assert [m.body for m in store.query_message(TOPIC, f"k{i}").messages] == [b"%d" % i], i
        assert [m.body for m in store.query_message(TOPIC, uniq[i]).messages] == [b"%d" % i], i
    assert [m.body for m in store.query_message(TOPIC, "shared", max_num=64).messages] == \
        [b"%d" % i for i in range(60)]
    # The index survives a restart.
    store.shutdown()
    store = open_store(max_hash_slot_num=4, max_index_num=8)
    assert [m.body for m in store.query_message(TOPIC, "k42").messages] == [b"42"]


# -- stateful model test -------------------------------------------------------------------------------------
HYP_GEOMETRY = {
    "mapped_file_size_commit_log": 4096,
    "mapped_file_size_consume_queue": 5 * 20,  # 5 units per file: pulls stop at file ends
    "max_hash_slot_num": 4,
    "max_index_num": 8,
}
HYP_UNITS_PER_CQ_FILE = 5
TOPICS = ["TopicA", "%RETRY%grp"]


class StoreMachine(RuleBasedStateMachine):
    """Random put / batch put / get / key query / restart sequences against a list-per-queue model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="rmq-store-model-")
        self.store = MessageStore.open(self.dir, **HYP_GEOMETRY)
        self.model: dict[tuple[str, int], list[bytes]] = {}
        self.keys: dict[str, tuple[str, bytes]] = {}

    def _key(self) -> str:
        k = f"key{len(self.keys)}"
        return k

    @rule(topic=st.sampled_from(TOPICS), qid=st.integers(0, 2), body=st.binary(max_size=300))
    def put(self, topic, qid, body):
        key = self._key()
        r = self.store.put_message(Message(topic=topic, body=body, queue_id=qid, keys=[key]))
        assert r.status == PutMessageStatus.PUT_OK, r
        q = self.model.setdefault((topic, qid), [])
        assert r.append_result.logics_offset == len(q)
        q.append(body)
        self.keys[key] = (topic, body)

    @rule(topic=st.sampled_from(TOPICS), qid=st.integers(0, 2),
          bodies=st.lists(st.binary(max_size=80), min_size=1, max_size=6))
    def put_batch(self, topic, qid, bodies):
        msgs = []
        for b in bodies:
            key = self._key()
            self.keys[key] = (topic, b)
            msgs.append(Message(topic=topic, body=b, queue_id=qid, keys=[key]))
        r = self.store.put_messages(msgs)
        assert r.status == PutMessageStatus.PUT_OK, r
        q = self.model.setdefault((topic, qid), [])
        assert r.append_result.logics_offset == len(q)
        assert r.append_result.msg_num == len(bodies) and len(r.append_result.msg_ids) == len(bodies)
        q.extend(bodies)

    @rule(topic=st.sampled_from(TOPICS), qid=st.integers(0, 3), max_n=st.integers(1, 40), data=st.data())
    def get(self, topic, qid, max_n, data):
        assert self.store.wait_for_dispatch()
        q = self.model.get((topic, qid))
        n = len(q) if q else 0
        offset = data.draw(st.integers(0, n + 2), label="offset")
        r = self.store.get_message("g", topic, qid, offset, max_n)
        if not q:
            assert r.status == GetMessageStatus.NO_MESSAGE_IN_QUEUE and r.next_begin_offset == 0
        elif offset == n:
            assert r.status == GetMessageStatus.OFFSET_OVERFLOW_ONE and r.next_begin_offset == n
        elif offset > n:
            assert r.status == GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == n
        else:
            limit = min(max_n, 32, n - offset, HYP_UNITS_PER_CQ_FILE - offset % HYP_UNITS_PER_CQ_FILE)
            assert r.status == GetMessageStatus.FOUND
            assert [m.body for m in r.messages] == q[offset:offset + limit]
            assert r.message_queue_offsets == list(range(offset, offset + limit))
            assert [m.queue_offset for m in r.messages] == r.message_queue_offsets
            assert r.next_begin_offset == offset + limit
            assert (r.min_offset, r.max_offset) == (0, n)

    @rule(data=st.data())
    def query(self, data):
        if not self.keys:
            return
        assert self.store.wait_for_dispatch()
        key = data.draw(st.sampled_from(sorted(self.keys)), label="key")
        topic, body = self.keys[key]
        found = self.store.query_message(topic, key).messages
        assert [m.body for m in found] == [body]

    @rule(abort=st.booleans())
    def restart(self, abort):
        self.store.shutdown()
        if abort:  # reopen as after a crash: the abort file is still there
            with open(os.path.join(self.dir, "abort"), "w") as f:
                f.write("4242")
        self.store = MessageStore.open(self.dir, **HYP_GEOMETRY)
        assert self.store.last_exit_ok is not abort

    @invariant()
    def queue_sizes(self):
        assert self.store.wait_for_dispatch()
        for (topic, qid), q in self.model.items():
            assert self.store.get_max_offset_in_queue(topic, qid) == len(q)

    def teardown(self):
        self.store.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# -- a store reopened with another geometry is refused and left untouched ------------------------------------
@pytest.mark.parametrize("change", [
    {"mapped_file_size_commit_log": 128 * 1024},
    {"mapped_file_size_consume_queue": 40_000},
    {"max_hash_slot_num": 2048, "max_index_num": 8192},
    {"max_hash_slot_num": 512, "max_index_num": 2048},
], ids=["commitlog-size", "consume-queue-size", "bigger-index", "smaller-index"])
def test_reopen_with_other_geometry_is_refused_and_changes_nothing(store_path, small_geometry, change):
    """Segment and index file sizes are not recorded anywhere but in the files: opening with other sizes
    must fail with a clear error before anything is written (extending an index file of another
    geometry would silently corrupt every key lookup)."""
    store = MessageStore.open(store_path, **small_geometry)
    for i in range(20):
        ok(store.put_message(Message(topic=TOPIC, body=b"g%d" % i, keys=[f"g{i}"], queue_id=i % 2)))
    assert store.wait_for_dispatch()
    store.shutdown()

    def snapshot() -> dict[str, bytes]:
        return {str(p.relative_to(store_path)): p.read_bytes() for p in sorted(store_path.rglob("*"))
                if p.is_file() and p.name not in ("lock", "checkpoint")}

    before = snapshot()
    with pytest.raises(StoreLoadError, match="written with"):
        MessageStore.open(store_path, **{**small_geometry, **change})
    assert snapshot() == before
    store = MessageStore.open(store_path, **small_geometry)
    try:
        assert [len(store.query_message(TOPIC, f"g{i}").messages) for i in range(20)] == [1] * 20
    finally:
        store.shutdown()
