"""The commitlog put path through `MessageStore`, on real files: RocketMQ's `AppendCallbackTest` and
`BatchPutMessageTest` (BLANK end-of-file records, batches moving whole to the next file, one msg id per
message, IPv6 hosts), file roll-over, the size limits of `DefaultMessageStoreTest` (spec §1.6, §1.7,
§1.11, §12.1), topic validation before anything touches the disk, SYNC_FLUSH acknowledgements, and
concurrent writers and readers.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.store import (
    FlushDiskType,
    GetMessageStatus,
    Message,
    PutMessageStatus,
    StoreReader,
)

MAX_BODY = 4 * 1024 * 1024  # default max_message_size
BLANK = struct.Struct(">ii")


def ok(r) -> None:
    assert r.status == PutMessageStatus.PUT_OK, r




def segment(store_path: Path, file_size: int, offset: int) -> bytes:
    """The bytes of the commitlog segment holding `offset`, read from the file itself."""
    return (store_path / "commitlog" / f"{offset - offset % file_size:020d}").read_bytes()


def snapshot(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root)
            for d, dirs, files in os.walk(root) for n in dirs + files}


def record_length(msg: Message) -> int:
    props = codec.build_properties_string(msg, msg.uniq_key).encode()
    sys_flag = 0
    if msg.born_host and msg.born_host.startswith("["):
        sys_flag |= codec.BORNHOST_V6_FLAG
    return codec.cal_msg_length(len(msg.body), len(msg.topic.encode()), len(props), sys_flag)


# -- AppendCallbackTest / BatchPutMessageTest ----------------------------------------------------------------
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_batch_end_of_file_writes_blank_and_moves_whole_batch(open_store, store_path, v6):
    size = 4096
    store = open_store(mapped_file_size_commit_log=size,
                       store_host="[::1]:10911" if v6 else "192.168.0.1:10911")
    born = "[fe80::1]:40000" if v6 else "10.1.2.3:40000"
    batch = [Message(topic="BatchTopic", body=f"batch body {i}".encode() * (i + 1), tags="TagA",
                     keys=[f"bk{i}"], born_host=born, born_timestamp=1_700_000_000_000 + i,
                     uniq_key=f"{i:032X}", properties={"user": f"u{i}"}, queue_id=3)
             for i in range(10)]
    lengths = []
    for m in batch:
        n = record_length(m)
        if v6:
            n += 12  # the store host is IPv6 too
        lengths.append(n)
    batch_len = sum(lengths)
    assert batch_len + 8 < size
    # Fill the first file until the batch no longer fits in what is left of it.
    filler = 0
    while True:
        pos = store.get_max_phy_offset()
        if size - pos < batch_len + 8:
            break
        ok(store.put_message(Message(topic="Filler", body=b"f" * 150)))
        filler += 1
    assert pos < size and store.get_max_phy_offset() == pos
    before = segment(store_path, size, 0)

    r = store.put_messages(batch)
    ok(r)
    a = r.append_result
    assert a.wrote_offset == size  # the whole batch starts the next file
    assert a.wrote_bytes == batch_len and a.msg_num == 10
    assert a.logics_offset == 0
    expected_offsets = [size + sum(lengths[:i]) for i in range(10)]
    assert a.offsets == expected_offsets
    assert len(a.msg_ids) == 10 and len(set(a.msg_ids)) == 10
    assert all(len(i) == (56 if v6 else 32) for i in a.msg_ids)
    assert [codec.decode_message_id(i)[2] for i in a.msg_ids] == expected_offsets
    assert a.msg_id == ",".join(a.msg_ids)
    assert a.uniq_keys == [f"{i:032X}" for i in range(10)]
    assert store.get_max_phy_offset() == size + batch_len

    # Exactly 8 bytes were written at the old position: [int remaining][int BLANK_MAGIC_CODE].
    after = segment(store_path, size, 0)
    assert after[:pos] == before[:pos]
    assert BLANK.unpack_from(after, pos) == (size - pos, codec.BLANK_MAGIC_CODE)
    assert after[pos + 8:] == before[pos + 8:] == bytes(size - pos - 8)
    assert store.look_message_by_offset(pos) is None  # a BLANK is not a message

    assert store.wait_for_dispatch()
    for i, (m, off) in enumerate(zip(batch, expected_offsets, strict=True)):
        got = store.look_message_by_offset(off)
        assert got is not None and got.body == m.body
        assert (got.topic, got.queue_id, got.queue_offset, got.commit_log_offset) == ("BatchTopic", 3, i, off)
        assert got.tags == "TagA" and got.keys == f"bk{i}" and got.properties["user"] == f"u{i}"
        assert got.uniq_key == f"{i:032X}"
        assert got.born_timestamp == 1_700_000_000_000 + i
        assert got.store_timestamp == a.store_timestamp
        assert got.born_host == ("[fe80:0:0:0:0:0:0:1]:40000" if v6 else "10.1.2.3:40000")
        assert bool(got.sys_flag & codec.BORNHOST_V6_FLAG) == v6
        assert bool(got.sys_flag & codec.STOREHOSTADDRESS_V6_FLAG) == v6
        assert got.msg_id == a.msg_ids[i]
        g = store.get_message("g", "BatchTopic", 3, i, 1)
        assert g.status == GetMessageStatus.FOUND and g.messages[0].body == m.body
        assert g.commit_log_offsets == [off] and g.next_begin_offset == i + 1
    assert store.get_max_offset_in_queue("BatchTopic", 3) == 10
    assert store.get_max_offset_in_queue("Filler", 0) == filler
    assert store.get_message("g", "Filler", 0, 0, 64).message_count == filler


def test_batch_that_fits_is_appended_in_place(store):
    ok(store.put_message(Message(topic="T", body=b"head")))
    start = store.get_max_phy_offset()
    r = store.put_messages([Message(topic="T", body=b"%d" % i) for i in range(5)])
    ok(r)
    a = r.append_result
    assert a.wrote_offset == start and a.logics_offset == 1 and a.msg_num == 5
    assert len(set(a.uniq_keys)) == 5 and all(k and len(k) == 32 for k in a.uniq_keys)
    assert a.offsets[0] == start and a.offsets[-1] + store.look_message_by_offset(a.offsets[-1]).store_size \
        == start + a.wrote_bytes == store.get_max_phy_offset()
    assert store.wait_for_dispatch()
    assert [m.body for m in store.get_message("g", "T", 0, 0, 32).messages] == \
        [b"head", b"0", b"1", b"2", b"3", b"4"]


def test_batch_spanning_queues_takes_offsets_per_queue(store):
    ok(store.put_message(Message(topic="T", body=b"q1-0", queue_id=1)))
    r = store.put_messages([Message(topic="T", body=b"q%d-x%d" % (i % 2, i), queue_id=i % 2)
                            for i in range(6)])
    ok(r)
    assert store.wait_for_dispatch()
    assert [m.body for m in store.get_message("g", "T", 0, 0, 32).messages] == [b"q0-x0", b"q0-x2", b"q0-x4"]
    assert [m.body for m in store.get_message("g", "T", 1, 0, 32).messages] == \
        [b"q1-0", b"q1-x1", b"q1-x3", b"q1-x5"]
    queue_offsets = [store.look_message_by_offset(o).queue_offset for o in r.append_result.offsets]
    assert queue_offsets == [0, 1, 1, 2, 2, 3]


def test_ipv4_mapped_ipv6_hosts_are_stored_as_ipv4(open_store):
    store = open_store(store_host="[::ffff:192.168.0.1]:10911")
    r = store.put_message(Message(topic="T", body=b"x", born_host="[::ffff:10.0.0.1]:5000"))
    ok(r)
    assert len(r.append_result.msg_id) == 32
    m = store.look_message_by_offset(r.append_result.wrote_offset)
    assert (m.born_host, m.store_host) == ("10.0.0.1:5000", "192.168.0.1:10911")
    assert m.sys_flag & (codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG) == 0
    assert r.append_result.wrote_bytes == record_length(Message(topic="T", body=b"x",
                                                                uniq_key=r.append_result.uniq_keys[0]))


def test_single_puts_roll_many_small_files(open_store, store_path, read_queue):
    size = 1024
    store = open_store(mapped_file_size_commit_log=size, mapped_file_size_consume_queue=20 * 16)
    rnd = random.Random(7)
    sent: dict[int, list[tuple[bytes, int]]] = {0: [], 1: [], 2: []}
    for i in range(400):
        q = rnd.randrange(3)
        body = bytes([i % 251]) * rnd.randrange(0, 700)
        r = store.put_message(Message(topic="Roll", body=body, queue_id=q))
        ok(r)
        a = r.append_result
        assert a.logics_offset == len(sent[q])
        # A record never spans files and never ends within 8 bytes of a file's end.
        assert a.wrote_offset % size + a.wrote_bytes <= size - 8
        sent[q].append((body, a.wrote_offset))
    names = sorted(os.listdir(store_path / "commitlog"))
    assert len(names) > 50
    assert names == [f"{i * size:020d}" for i in range(len(names))]
    # Every full file is a run of records closed by a BLANK holding the rest of the file.
    for name in names[:-1]:
        data = (store_path / "commitlog" / name).read_bytes()
        pos = 0
        for p, res in codec.iter_records(data):
            pos = p
            if res.success and res.size == 0:
                break
            assert res.success, (name, p, res.reason)
        assert BLANK.unpack_from(data, pos) == (size - pos, codec.BLANK_MAGIC_CODE)
        assert size - pos >= 8
    assert store.wait_for_dispatch()
    for q, items in sent.items():
        got = read_queue(store, "Roll", q)
        assert [o for o, _ in got] == list(range(len(items)))
        assert [(m.body, m.commit_log_offset) for _, m in got] == items
        for body, off in items:
            assert store.look_message_by_offset(off).body == body


def test_record_larger_than_a_file_is_refused(open_store, store_path):
    store = open_store(mapped_file_size_commit_log=1024)
    ok(store.put_message(Message(topic="T", body=b"small")))
    files = snapshot(store_path / "commitlog")
    end = store.get_max_phy_offset()
    r = store.put_message(Message(topic="T", body=b"x" * 1000))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and not r.is_ok() and r.reason
    assert store.get_max_phy_offset() == end
    assert snapshot(store_path / "commitlog") == files
    r = store.put_messages([Message(topic="T", body=b"x" * 400) for _ in range(3)])
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL
    assert store.get_max_phy_offset() == end
    # No queue offset was taken and no BLANK was written.
    ok(r := store.put_message(Message(topic="T", body=b"next")))
    assert r.append_result.logics_offset == 1 and r.append_result.wrote_offset == end


# -- size limits (DefaultMessageStoreTest) ----------------------------------------------------------------
def test_put_msg_exceeds_max_length(store, store_path):
    r = store.put_message(Message(topic="T", body=bytes(MAX_BODY + 1)))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and r.append_result is None
    assert str(MAX_BODY + 1) in r.reason
    assert store.get_max_phy_offset() == 0
    assert not os.listdir(store_path / "commitlog") if (store_path / "commitlog").exists() else True
    ok(r := store.put_message(Message(topic="T", body=b"fine")))
    assert r.append_result.wrote_offset == 0 and r.append_result.logics_offset == 0


def test_put_msg_batch_exceeds_max_length(store):
    ok(store.put_message(Message(topic="T", body=b"first")))
    end = store.get_max_phy_offset()
    bad_batches = [
        [Message(topic="T", body=b"a"), Message(topic="T", body=bytes(MAX_BODY + 1)), Message(topic="T")],
        [Message(topic="T", body=b"a"),
         Message(topic="T", body=b"b", sys_flag=codec.TRANSACTION_PREPARED_TYPE)],
        [Message(topic="T", body=b"a", sys_flag=codec.TRANSACTION_ROLLBACK_TYPE)],
        [Message(topic="T", body=b"a"), Message(topic="T", body=b"b",
                                               properties_string="p\x01" + "v" * 32766 + "\x02")],
        [],
    ]
    for batch in bad_batches:
        r = store.put_messages(batch)
        assert r.status in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED), r
        assert r.append_result is None and r.reason
        assert store.get_max_phy_offset() == end
    ok(r := store.put_messages([Message(topic="T", body=b"x"), Message(topic="T", body=b"y")]))
    assert r.append_result.logics_offset == 1 and r.append_result.wrote_offset == end


def test_get_bulk_commit_log_data(open_store, store_path):
    store = open_store(mapped_file_size_commit_log=8 * 1024 * 1024)
    base = os.urandom(2 * 1024 * 1024 - 8)
    bodies = [b"%08d" % i + base for i in range(10)]
    offsets = []
    for b in bodies:
        r = store.put_message(Message(topic="Bulk", body=b))
        ok(r)
        offsets.append(r.append_result.wrote_offset)
    assert len(os.listdir(store_path / "commitlog")) == 4  # three 2 MiB records per 8 MiB file
    for b, off in zip(bodies, offsets, strict=True):
        raw = store.select_one_message_by_offset(off)
        m = codec.decode_message(raw, check_crc=True)
        assert m.body == b and m.commit_log_offset == off
    # Bulk reads of whole segments (read-only, beside the live writer) decode every record.
    with StoreReader(store_path) as reader:
        got = [(m.commit_log_offset, m.body) for m in reader.iter_messages()]
    assert got == list(zip(offsets, bodies, strict=True))
    assert store.wait_for_dispatch()
    r = store.get_message("g", "Bulk", 0, 0, 32)
    assert r.status == GetMessageStatus.FOUND and r.message_count >= 1
    assert r.messages[0].body == bodies[0]


def test_put_long_message(open_store):
    store = open_store(mapped_file_size_commit_log=8 * 1024 * 1024)
    topic = "T" * 127
    props = "a\x01" + "v" * (32767 - 3) + "\x02"
    assert len(props.encode()) == 32767
    body = bytes(range(256)) * (MAX_BODY // 256)
    assert len(body) == MAX_BODY
    r = store.put_message(Message(topic=topic, body=body, properties_string=props))
    ok(r)
    assert r.append_result.wrote_bytes == 91 + MAX_BODY + 127 + 32767
    m = store.look_message_by_offset(r.append_result.wrote_offset)
    assert m.topic == topic and m.body == body and m.properties_string == props
    assert m.version == "V1" and m.body_crc == zlib.crc32(body) & 0x7FFFFFFF
    end = store.get_max_phy_offset()
    r = store.put_message(Message(topic=topic, body=body + b"x", properties_string=props))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL
    r = store.put_message(Message(topic=topic, body=body, properties_string=props[:-1] + "vv"))
    assert r.status == PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    r = store.put_message(Message(topic="T" * 32767, body=b"x"))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL
    assert store.get_max_phy_offset() == end
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue(topic, 0) == 1


# -- bad input never reaches the disk ------------------------------------------------------------------------
@pytest.mark.parametrize("topic", ["../x", "a/b", "", "x" * 128, "中文", "..", "/abs", "ok\n", " ", "a b",
                                   "%RETRY%" + "g" * 249])
def test_illegal_topic_is_refused_before_touching_the_disk(store, store_path, topic):
    ok(store.put_message(Message(topic="Good", body=b"x", keys=["good"])))
    assert store.wait_for_dispatch()
    parent = store_path.parent
    before = snapshot(parent)
    end = store.get_max_phy_offset()
    r = store.put_message(Message(topic=topic, body=b"evil", keys=["k"]))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and r.append_result is None
    assert repr(topic) in r.reason, r.reason
    r = store.put_messages([Message(topic="Good", body=b"y"), Message(topic=topic, body=b"evil")])
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and repr(topic) in r.reason
    # Reads with such a name do not create anything either.
    g = store.get_message("g", topic, 0, 0, 32)
    assert g.status == GetMessageStatus.NO_MESSAGE_IN_QUEUE
    assert store.query_message(topic, "k").messages == []
    assert store.get_max_offset_in_queue(topic, 0) == 0
    assert store.wait_for_dispatch()
    assert store.get_max_phy_offset() == end
    assert snapshot(parent) == before
    ok(r := store.put_message(Message(topic="Good", body=b"z")))
    assert r.append_result.logics_offset == 1


@pytest.mark.parametrize("topic", ["%RETRY%group", "%DLQ%group", "a-b_c|d%e", "T" * 127,
                                   "%RETRY%" + "g" * 200])
def test_legal_topics_are_stored(store, store_path, topic):
    r = store.put_message(Message(topic=topic, body=b"hello", keys=["k"]))
    ok(r)
    assert store.wait_for_dispatch()
    assert (store_path / "consumequeue" / topic / "0").is_dir()
    g = store.get_message("g", topic, 0, 0, 32)
    assert g.status == GetMessageStatus.FOUND and g.messages[0].topic == topic
    assert g.messages[0].version == ("V2" if len(topic) > 127 else "V1")
    assert [m.body for m in store.query_message(topic, "k").messages] == [b"hello"]


@pytest.mark.parametrize("msg, status", [
    (Message(topic="T", body=None), PutMessageStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", queue_id=-1), PutMessageStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", born_host="not-a-host"), PutMessageStatus.MESSAGE_ILLEGAL),
    (Message(topic="T", body=b"x", born_host="[::1:5"), PutMessageStatus.MESSAGE_ILLEGAL),
], ids=["null-body", "negative-queue", "bad-born-host", "bad-v6-born-host"])
def test_bad_messages_are_refused(store, msg, status):
    ok(store.put_message(Message(topic="T", body=b"first")))
    end = store.get_max_phy_offset()
    r = store.put_message(msg)
    assert r.status == status and r.reason
    assert store.get_max_phy_offset() == end
    ok(r := store.put_message(Message(topic="T", body=b"second")))
    assert r.append_result.logics_offset == 1


@pytest.mark.parametrize("field, value", [
    ("queue_id", 2**31), ("flag", 2**31), ("flag", -2**31 - 1), ("sys_flag", 2**31),
    ("reconsume_times", 2**31), ("born_timestamp", 2**63), ("prepared_transaction_offset", -2**63 - 1),
])
def test_out_of_range_header_fields_are_refused_as_values(store, field, value):
    """The record's int and long fields are Java ints and longs: a Python int outside their range is bad
    input, refused with MESSAGE_ILLEGAL and a reason (errors are values at the engine boundary), never an
    exception out of `put_message`, and nothing is written."""
    ok(store.put_message(Message(topic="T", body=b"first")))
    end = store.get_max_phy_offset()
    msg = Message(topic="T", body=b"x")
    setattr(msg, field, value)
    r = store.put_message(msg)
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and r.reason, r
    r = store.put_messages([Message(topic="T", body=b"ok"), msg])
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and r.reason, r
    assert store.get_max_phy_offset() == end
    ok(r := store.put_message(Message(topic="T", body=b"second")))
    assert r.append_result.logics_offset == 1


def test_put_after_shutdown_is_refused(store):
    ok(store.put_message(Message(topic="T", body=b"x")))
    store.shutdown()
    r = store.put_message(Message(topic="T", body=b"y"))
    assert r.status == PutMessageStatus.SERVICE_NOT_AVAILABLE and not r.is_ok()
    r = store.put_messages([Message(topic="T", body=b"y")])
    assert r.status == PutMessageStatus.SERVICE_NOT_AVAILABLE


# -- SYNC_FLUSH ---------------------------------------------------------------------------------------------
def test_sync_flush_acknowledges_only_flushed_messages(open_store):
    store = open_store(mapped_file_size_commit_log=4096, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    assert store.config.flush_disk_type == FlushDiskType.SYNC_FLUSH
    mfq = store.commit_log.mapped_file_queue
    for i in range(60):
        if i % 4 == 3:
            r = store.put_messages([Message(topic="S", body=b"b" * 90) for _ in range(4)])
        else:
            r = store.put_message(Message(topic="S", body=b"s" * (i * 5)))
        ok(r)
        a = r.append_result
        assert mfq.flushed_where >= a.wrote_offset + a.wrote_bytes, (i, mfq.flushed_where, a)
    assert store.get_max_phy_offset() > 3 * 4096  # the acknowledgements covered file roll-overs


def test_sync_flush_with_concurrent_writers(open_store):
    store = open_store(mapped_file_size_commit_log=8192, flush_disk_type="SYNC_FLUSH")
    mfq = store.commit_log.mapped_file_queue
    errors: list[str] = []

    def writer(tid: int) -> None:
        try:
            for i in range(30):
                r = store.put_message(Message(topic="S", body=b"%d-%d" % (tid, i) * 10, queue_id=tid))
                if r.status != PutMessageStatus.PUT_OK:
                    errors.append(repr(r))
                    continue
                a = r.append_result
                if mfq.flushed_where < a.wrote_offset + a.wrote_bytes:
                    errors.append(f"acknowledged {a.wrote_offset}+{a.wrote_bytes} before the flush "
                                  f"({mfq.flushed_where})")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.wait_for_dispatch()
    assert [store.get_max_offset_in_queue("S", q) for q in range(4)] == [30] * 4


# -- concurrency ---------------------------------------------------------------------------------------------
CONC_TOPIC = "Concurrent"
WRITERS, PER_WRITER, QUEUES = 4, 2000, 4


def conc_body(tid: int, seq: int) -> bytes:
    pad = (tid * 7919 + seq * 31) % 200
    return b"%d:%d:" % (tid, seq) + bytes([65 + tid]) * pad


def test_concurrent_writers_and_readers(open_store, read_queue):
    store = open_store(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 256,
                       max_hash_slot_num=2048, max_index_num=8192)
    placed: dict[tuple[int, int], tuple[int, int, int]] = {}  # (queue, queue offset) -> (tid, seq, phys)
    errors: list[str] = []
    stop = threading.Event()
    reads = [0]

    def check(buf: bytes, queue_id: int, qoff: int, where: str) -> None:
        m = codec.decode_message(buf, check_crc=True)
        tid, seq, _ = m.body.split(b":", 2)
        tid, seq = int(tid), int(seq)
        if m.body != conc_body(tid, seq) or m.keys != f"t{tid}-{seq}":
            errors.append(f"{where}: torn or foreign record {m!r}")
        if (m.queue_id, m.queue_offset) != (queue_id, qoff):
            errors.append(f"{where}: record says {m.queue_id}/{m.queue_offset}, unit says {queue_id}/{qoff}")

    def writer(tid: int) -> None:
        rnd = random.Random(tid)
        seq = 0
        try:
            while seq < PER_WRITER:
                q = rnd.randrange(QUEUES)
                n = 1 if rnd.random() < 0.5 else min(rnd.randint(2, 10), PER_WRITER - seq)
                msgs = [Message(topic=CONC_TOPIC, body=conc_body(tid, seq + i), queue_id=q,
                                keys=[f"t{tid}-{seq + i}"], tags=f"Tag{tid}") for i in range(n)]
                r = store.put_message(msgs[0]) if n == 1 else store.put_messages(msgs)
                if r.status != PutMessageStatus.PUT_OK:
                    errors.append(f"writer {tid}: {r!r}")
                    return
                a = r.append_result
                offs = a.offsets or [a.wrote_offset]
                for i in range(n):
                    placed[(q, a.logics_offset + i)] = (tid, seq + i, offs[i])
                seq += n
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"writer {tid}: {e!r}")

    def reader(rid: int) -> None:
        rnd = random.Random(100 + rid)
        try:
            while not stop.is_set():
                q = rnd.randrange(QUEUES)
                mx = store.get_max_offset_in_queue(CONC_TOPIC, q)
                if mx == 0:
                    continue
                off = rnd.randrange(mx)
                g = store.get_message("g", CONC_TOPIC, q, off, 16)
                if g.status != GetMessageStatus.FOUND:
                    errors.append(f"reader {rid}: {g.status} at {q}/{off} (max {mx})")
                    continue
                for buf, qoff in zip(g.message_buffers, g.message_queue_offsets, strict=True):
                    check(buf, q, qoff, f"reader {rid}")
                reads[0] += 1
                time.sleep(0.0005)  # a spinning reader would only measure the GIL's lock convoy
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"reader {rid}: {e!r}")

    writers = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    readers = [threading.Thread(target=reader, args=(r,)) for r in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert reads[0] > 0
    assert store.wait_for_dispatch()
    total = 0
    phys: list[int] = []
    for q in range(QUEUES):
        got = read_queue(store, CONC_TOPIC, q, batch=32)
        assert [o for o, _ in got] == list(range(len(got))), f"queue {q} offsets are not dense"
        assert store.get_max_offset_in_queue(CONC_TOPIC, q) == len(got)
        for qoff, m in got:
            tid, seq, off = placed[(q, qoff)]
            assert m.commit_log_offset == off and m.body == conc_body(tid, seq)
            assert (m.queue_id, m.queue_offset) == (q, qoff)
            phys.append(off)
        total += len(got)
    assert total == WRITERS * PER_WRITER == len(placed)
    assert len(set(phys)) == total, "duplicate physical offsets"
    by_key = {(tid, seq): off for tid, seq, off in placed.values()}
    for (tid, seq), off in by_key.items():
        found = store.query_message(CONC_TOPIC, f"t{tid}-{seq}").messages
        assert [(m.commit_log_offset, m.body) for m in found] == [(off, conc_body(tid, seq))]
