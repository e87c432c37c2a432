"""The network single put (issue 16, branch send-single): `_native.append_one_net`, the broker's
SEND_MESSAGE store of one message that carries a properties string, against its pure-Python reference
`CommitLog._append_one_net_py`, and whole stores fed such puts through the native path, the reference and
the general batch path (`_append_plain`), which must leave the same records, consume queues and index.
The functions are called directly, so the file also runs (and compares) under `RMQ_EVENTSTORE_PURE=1`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from rmq_eventstore.common.status import AppendMessageStatus, PutMessageStatus
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store import commitlog as commitlog_module
from rmq_eventstore.store.commitlog import AppendMessageResult, CommitLog, PutMessageResult
from tests.conftest import import_native

_native = import_native()
_native.init(Message)
_native.single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK, PutMessageStatus.PUT_OK)

GEOMETRY = {"mapped_file_size_commit_log": 16 * 1024, "mapped_file_size_consume_queue": 20 * 100,
            "max_hash_slot_num": 64, "max_index_num": 300}


def _messages(n: int) -> list[Message]:
    """Messages as the broker builds them from SEND_MESSAGE_V2 (a properties string with the broker's
    UNIQ_KEY and CLUSTER, a born host), of several sizes, queues, tags and keys; and a few the network
    path declines: a prepared transaction, an empty TAGS value, no properties string at all."""
    out = []
    for i in range(n):
        props = ""
        if i % 3:
            props += f"TAGS\x01tag{i % 4}\x02"
        if i % 7:
            props += f"KEYS\x01k{i} x{i % 3}\x02"
        props += f"WAIT\x01{'true' if i % 2 else 'false'}\x02UNIQ_KEY\x01{i:032X}\x02CLUSTER\x01DefaultCluster\x02"
        m = Message(topic="TopicA" if i % 5 else "%RETRY%g-1", body=bytes([i % 251]) * (i * 37 % 700),
                    queue_id=i % 3, properties_string=props, born_timestamp=1_700_000_000_000 + i,
                    born_host="10.0.0.1:9" if i % 4 else "[::1]:10911", flag=i % 5, reconsume_times=i % 2)
        if i % 29 == 28:
            m.sys_flag = codec.TRANSACTION_PREPARED_TYPE
        if i % 31 == 30:
            m.properties_string = "TAGS\x01\x02" + props
        if i % 37 == 36:
            m.properties_string = None
        out.append(m)
    return out


def _store(path: Path, append_crc: bool) -> MessageStore:
    return MessageStore.open(path, auto_create_uniq_key=False, enabled_append_prop_crc=append_crc, **GEOMETRY)


def _at(ts: int):
    return lambda: ts


@pytest.mark.parametrize("append_crc", [False, True])
def test_append_one_net_equals_the_reference(tmp_path: Path, append_crc: bool) -> None:
    """Put by put, `_native.append_one_net` writes what `_append_one_net_py` writes at the same store time
    (record bytes, write position, store timestamp, queue table, the request handed to `on_appended`) and
    declines exactly what it declines (a new queue, no room before the file's end, a message the network
    encoder does not cover), changing nothing then; its result objects are those `_append_one` builds."""
    a, b = _store(tmp_path / "native", append_crc), _store(tmp_path / "ref", append_crc)
    try:
        handed: dict[str, list] = {"native": [], "ref": []}
        for name, s in (("native", a), ("ref", b)):
            s.commit_log.on_appended = lambda start, end, reqs, name=name: handed[name].append((start, end, reqs))
        declined = taken = 0
        for i, m in enumerate(_messages(400)):
            cla, clb = a.commit_log, b.commit_log
            mfs = cla.mapped_file_queue.mapped_files
            before = (dict(cla.topic_queue_table), len(mfs), mfs[-1].wrote_position if mfs else -1)
            with cla.put_lock:
                res = _native.append_one_net(cla, m, cla.encoder.network_context(), cla.file_size)
            if res is None:
                declined += 1
                mfs = cla.mapped_file_queue.mapped_files
                assert (dict(cla.topic_queue_table), len(mfs), mfs[-1].wrote_position if mfs else -1) == before
                assert cla.begin_time_in_lock == 0
                real = commitlog_module.now_ms
                commitlog_module.now_ms = _at(1_700_000_000_000)
                try:
                    assert clb._append_one_net_py(m) is None, i
                finally:
                    commitlog_module.now_ms = real
                ra = a.put_message(m)  # the general path takes it, in both stores alike
                commitlog_module.now_ms = _at(ra.append_result.store_timestamp if ra.append_result else 0)
                try:
                    rb = b.put_message(m)
                finally:
                    commitlog_module.now_ms = real
                assert ra.status == rb.status, (i, ra, rb)
                continue
            taken += 1
            ap = res.append_result
            real = commitlog_module.now_ms
            commitlog_module.now_ms = _at(ap.store_timestamp)
            try:
                ref = clb._append_one_net_py(m)
            finally:
                commitlog_module.now_ms = real
            assert ref is not None, i
            base, total, begin, q, req = ref
            expect = PutMessageResult(PutMessageStatus.PUT_OK, AppendMessageResult(
                AppendMessageStatus.PUT_OK, base, total, begin, q, 1, ap.page_cache_rt, clb.store_host_bytes,
                clb.store_port, [base], [req.uniq_key]))
            assert res == expect and res.status is PutMessageStatus.PUT_OK and res.reason == ""
            assert res.append_result.msg_id == expect.append_result.msg_id and req.uniq_key == f"{i:032X}"
            assert handed["native"][-1] == handed["ref"][-1] == (base, base + total, (req,))
            mfa, mfb = cla.mapped_file_queue.mapped_files[-1], clb.mapped_file_queue.mapped_files[-1]
            pos = base - mfa.file_from_offset
            assert bytes(mfa.view[pos:pos + total]) == bytes(mfb.view[pos:pos + total])
            assert (mfa.wrote_position, mfa.store_timestamp) == (mfb.wrote_position, mfb.store_timestamp)
            assert cla.topic_queue_table == clb.topic_queue_table
            assert cla.begin_time_in_lock == clb.begin_time_in_lock == 0
        assert 30 < declined < 200 and taken > 200  # new queues, file ends and the declined kinds came up
        assert len(a.commit_log.mapped_file_queue.mapped_files) > 3  # the files rolled
    finally:
        a.shutdown()
        b.shutdown()


_FIELDS = ("store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
           "sys_flag", "born_host_bytes", "born_port", "store_host_bytes", "store_port", "reconsume_times",
           "prepared_transaction_offset", "born_timestamp", "body", "topic", "properties_string")


@pytest.mark.parametrize("append_crc", [False, True])
def test_network_single_puts_native_reference_and_general_path_agree(tmp_path: Path, monkeypatch,
                                                                     append_crc: bool) -> None:
    """Whole stores fed the same single puts through `put_message`: natively (`append_one_net`), through
    the reference (`_append_one_net_py`) and through the general batch path only (`_append_plain`, what the
    broker's sends took before) leave the same records (all fields but the store time), the same
    consume-queue bytes and the same index answers, across file rolls and new queues."""
    msgs = _messages(300)

    def run(name: str) -> tuple[list, dict, dict]:
        root = tmp_path / name
        s = MessageStore.open(root, enabled_append_prop_crc=append_crc, auto_create_uniq_key=False, **GEOMETRY)
        for i, m in enumerate(msgs):
            r = s.put_message(m)
            assert r.is_ok(), (i, r)
            assert r.append_result.offsets == [r.append_result.wrote_offset]
        assert s.wait_for_dispatch(10)
        records, off = [], s.commit_log.get_min_offset()
        while off < s.commit_log.get_max_offset():
            buf = s.commit_log.get_message(off, 8)
            if buf is None or codec._INT.unpack_from(buf, 4)[0] == codec.BLANK_MAGIC_CODE:  # a file's end
                off = s.commit_log.roll_next_file(off)
                continue
            m = codec.decode_message(s.commit_log.read_record(off), 0)
            row = [getattr(m, f) for f in _FIELDS]
            if append_crc:  # the trailer's CRC covers the store time: its digits are left out
                row[-1] = re.sub("__CRC32#\x01[0-9]{10}", "__CRC32#", row[-1])
            records.append(tuple(row))
            off += m.store_size
        keys = {}
        for i in range(len(msgs)):
            for k in (f"k{i}", f"x{i % 3}", f"{i:032X}"):
                for topic in ("TopicA", "%RETRY%g-1"):
                    found = s.query_message(topic, k, 64, 0, 2 ** 62)
                    got = sorted(x.queue_offset for x in found.messages) if found is not None else []
                    if got:
                        keys[(topic, k)] = got
        s.shutdown()
        return records, {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*"))
                         if p.is_file()}, keys

    native = run("native")
    monkeypatch.setattr(commitlog_module, "_native_append_one", None)
    monkeypatch.setattr(commitlog_module, "_native_append_one_net", None)
    ref = run("ref")
    monkeypatch.setattr(CommitLog, "_append_one", lambda self, msg, uniq: None)
    general = run("general")
    assert len(native[0]) == len(msgs)
    assert all(("__CRC32#" in r[-1]) == append_crc for r in native[0])
    for i, (x, y, z) in enumerate(zip(native[0], ref[0], general[0], strict=True)):
        assert x == y == z, (i, [(f, u, v, w) for f, u, v, w in zip(_FIELDS, x, y, z, strict=True) if not u == v == w and f != "body"])
    assert native[1] == ref[1] == general[1] and len(native[1]) > 3
    assert native[2] == ref[2] == general[2] and len(native[2]) > 100
