"""The native core (`rmq_eventstore._native`, issue 16) against its pure-Python references, in one process.

Each C loop must give exactly what its Python reference gives, byte for byte and object for object, on
everything it handles, and hand back None (the reference then decides) on anything else:
`encode_plain_batch` against `RecordEncoder.encode_plain_batch_py`, `index_keys` against
`index.index_entries_py`, `group_units` against `message_store.group_units_py`, `skim_records` against
`codec.skim_records_py` (with `prop_crc`: + `recovery.prop_crc_damage`), `crc32` against `zlib.crc32`. The
golden vectors, the codec property tests and the crash suite run once per implementation in `make test`
(`RMQ_EVENTSTORE_PURE=1` for the second pass).

The tests skip when the extension is not built, unless `RMQ_EVENTSTORE_REQUIRE_NATIVE=1` (set by
`make test`), which makes a missing extension a failure.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from rmq_eventstore.store import index as index_module
from rmq_eventstore.store import message_store as ms_module
from tests.conftest import import_native

_native = import_native()
_native.init(Message)

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
TOPICS = ["TopicA", "%RETRY%g", "t-1", "Tö", "L" * 200]
# text that is valid UTF-8 / UTF-16 (no lone surrogates), non-ASCII and non-BMP included
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)


def _encoder(store_host: str, append_crc: bool = False) -> codec.RecordEncoder:
    enc = codec.RecordEncoder(store_host, append_crc=append_crc)
    for t in TOPICS:
        enc._topic_part(t, False)  # topics are cached once validated by the put path
    return enc


def _native_plain(enc: codec.RecordEncoder, msgs, uniq, table, base, now):
    addr, port = enc.store_host
    return _native.encode_plain_batch(
        msgs, uniq, table, base, now, enc._topics, addr, port,
        (codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG) if enc._store_v6 else 0, enc.max_message_size,
        enc.max_message_size + codec.RECORD_HEADROOM, codec._TAGS_CODE_CACHE, codec.tags_string_to_tags_code,
        codec.DispatchRequest, enc.append_crc)


def _same_batch(a: codec.PlainBatch, b: codec.PlainBatch) -> None:
    assert a.data == b.data and type(a.data) is type(b.data) is bytes
    assert a.requests == b.requests
    for x, y in zip(a.requests, b.requests, strict=True):
        assert type(x) is type(y) is codec.DispatchRequest
        assert [type(v) for v in x] == [type(v) for v in y]
    assert a.offsets == b.offsets and a.uniq_keys == b.uniq_keys
    assert list(a.queue_offsets.items()) == list(b.queue_offsets.items())  # same order too
    assert a.first_queue_offset == b.first_queue_offset


def test_native_is_active_unless_pure_is_asked_for():
    assert codec.NATIVE is (os.environ.get("RMQ_EVENTSTORE_PURE", "0") in ("", "0"))
    probe = ("import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stdout);"
             "from rmq_eventstore.common import codec; print('NATIVE', codec.NATIVE)")
    env = dict(os.environ, RMQ_EVENTSTORE_PURE="1")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert "NATIVE False" in out and "RMQ_EVENTSTORE_PURE is set" in out
    env["RMQ_EVENTSTORE_PURE"] = "0"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert "NATIVE True" in out


# -- (a) record encoding of a batch -----------------------------------------------------------------------
_plain = st.builds(
    Message,
    topic=st.sampled_from(TOPICS),
    body=st.binary(max_size=300),
    tags=st.none() | st.just("") | TEXT,
    keys=st.none() | TEXT | st.lists(TEXT, max_size=3) | st.lists(TEXT, max_size=3).map(tuple),
    queue_id=st.integers(0, 5),
    flag=INT32,
    uniq_key=st.none() | st.just("") | st.just("0A0B0C0D0E0F00000000000000000001"),
)


@PROPS
@given(msgs=st.lists(_plain, max_size=12), store_host=st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]),
       base=st.integers(0, 2 ** 40), table=st.dictionaries(st.sampled_from(["TopicA-1", "Tö-0", "t-1-3"]),
                                                             st.integers(0, 2 ** 40)),
       with_uniq=st.booleans(), append_crc=st.booleans())
def test_encode_plain_batch_native_equals_python(msgs, store_host, base, table, with_uniq, append_crc):
    enc = _encoder(store_host, append_crc)
    now = 1_700_000_000_123
    uniq = [f"{i:032X}" if i % 3 else None for i in range(len(msgs))] if with_uniq else None
    before = dict(table)
    ref = enc.encode_plain_batch_py(msgs, uniq, table, base, now)
    raw = _native_plain(enc, msgs, uniq, table, base, now)
    assert table == before  # neither changes the queue table (the caller applies the new offsets)
    assert ref is not None and raw is not None  # every message here is plain: the native loop takes them all
    _same_batch(codec.PlainBatch(*raw), ref)
    if codec.NATIVE:
        _same_batch(enc.encode_plain_batch(msgs, uniq, table, base, now), ref)
        # the columns hand-off: the units and index entries the dispatchers' references make of the requests
        got = enc.encode_plain_batch(msgs, uniq, table, base, now, columns=True)
        _same_batch(got._replace(requests=ref.requests), ref)
        cols = got.requests
        assert type(cols) is codec.DispatchColumns and len(cols) == len(msgs) and cols.store_timestamp == now
        groups = ms_module.group_units_py(ref.requests)
        assert [k for k, _ in cols.units] == list(groups)
        for k, u in cols.units:
            assert np.frombuffer(u, np.int64).reshape(-1, 4).tolist() == [list(x) for x in groups[k]]
        h, p, t = index_module.index_entries_py(ref.requests, 0)
        assert np.frombuffer(cols.hashes, np.int32).tolist() == h.tolist()
        assert np.frombuffer(cols.phy, np.int64).tolist() == p.tolist()
        assert np.frombuffer(cols.ts, np.int64).tolist() == t.tolist()


@PROPS
@given(msg=_plain, store_host=st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]), base=st.integers(0, 2 ** 40),
       q=st.integers(0, 2 ** 40), uniq=st.none() | st.just("00000000000000000000000000000ABC"),
       append_crc=st.booleans())
def test_encode_plain_one_equals_the_batch_of_one(msg, store_host, base, q, uniq, append_crc):
    """A single put's encoder (`encode_plain_one`, native and Python) gives the record and request of a batch
    of one message at the same queue offset."""
    enc = _encoder(store_host, append_crc)
    now = 1_700_000_000_123
    ref = enc.encode_plain_batch_py([msg], [uniq], {f"{msg.topic}-{msg.queue_id}": q}, base, now)
    assert ref is not None
    for got in (enc.encode_plain_one(msg, uniq, q, base, now),
                _native.encode_plain_one(msg, uniq, q, base, now, (
                    enc._topics, *enc.store_host, codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG
                    if enc._store_v6 else 0, enc.max_message_size, enc.max_message_size + codec.RECORD_HEADROOM,
                    codec._TAGS_CODE_CACHE, codec.tags_string_to_tags_code, codec.DispatchRequest, append_crc))):
        assert got is not None
        data, req = got
        assert data == ref.data and type(data) is bytes
        assert req == ref.requests[0] and type(req) is codec.DispatchRequest
        assert [type(v) for v in req] == [type(v) for v in ref.requests[0]]
    # written in place (a single put into its mapped file; the Python path under RMQ_EVENTSTORE_PURE=1): the
    # same bytes at pos, nothing around them; nothing at all when the room is one byte short
    size = len(ref.data)
    buf = bytearray(b"\xee" * (size + 20))
    assert enc.encode_plain_one_into(msg, uniq, q, base, now, memoryview(buf), 7, size - 1) is None
    assert buf == b"\xee" * (size + 20)
    assert enc.encode_plain_one_into(msg, uniq, q, base, now, memoryview(buf), 7, size) == (size, ref.requests[0])
    assert buf[7:7 + size] == ref.data and buf[:7] == b"\xee" * 7 and buf[7 + size:] == b"\xee" * 13


def test_encode_plain_one_declines_what_is_not_plain():
    enc = _encoder("127.0.0.1:10911")
    for m in (Message(topic="TopicA", body=b"x", properties={"a": "b"}), Message(topic="new", body=b"x"),
              Message(topic="TopicA", body=b"x", properties_string="a\x01b"), Message(topic="TopicA", body=b"x", queue_id=-1),
              Message(topic="TopicA", body=bytearray(b"x"))):
        assert enc.encode_plain_one(m, None, 0, 0, 1) is None
    m = Message(topic="TopicA", body=b"x", flag=2 ** 31)  # out of int32: the reference raises struct.error
    assert _native.encode_plain_one(m, None, 0, 0, 1, (enc._topics, *enc.store_host, 0, 100, 200, {}, str,
                                                      codec.DispatchRequest, False)) is None
    with pytest.raises(struct.error):
        enc.encode_plain_one_py(m, None, 0, 0, 1)
    assert enc.encode_plain_one(Message(topic="TopicA", body=b"x"), None, -1, 0, 1) is None  # a bad offset


class _MyMessage(Message):
    __slots__ = ()


def test_encode_plain_batch_native_declines_what_the_reference_must_decide():
    enc = _encoder("127.0.0.1:10911")
    ok = Message(topic="TopicA", body=b"ok", keys="k")
    odd = [
        Message(topic="TopicA", body=b"x", properties={"a": "b"}),  # not plain: the reference says None
        Message(topic="TopicA", body=b"x", born_host="1.2.3.4:5"),
        Message(topic="TopicA", body=b"x", sys_flag=8),
        Message(topic="TopicA", body=b"x", born_timestamp=5),
        Message(topic="TopicA", body=b"x", reconsume_times=1),
        Message(topic="TopicA", body=b"x", prepared_transaction_offset=1),
        Message(topic="TopicA", body=b"x", force_v2=True),
        Message(topic="new", body=b"x"),
        Message(topic="TopicA", body=b"x", properties_string="a\x01b"),
        Message(topic="TopicA", body=bytearray(b"x")),
        Message(topic="TopicA", body=b"x" * (4 * 2 ** 20 + 1)),
        Message(topic="TopicA", body=b"x", queue_id=-1),
        Message(topic="TopicA", body=b"x", tags="t" * 40000),  # properties over 32767 bytes
        Message(topic="TopicA", body=b"x", flag=2 ** 31),  # out of int32: the reference raises struct.error
        Message(topic="TopicA", body=b"x", queue_id=2 ** 31),
        Message(topic="TopicA", body=b"x", tags=7),  # a type the f-strings of the reference would format
        Message(topic="TopicA", body=b"x", keys={"a"}),  # a sequence type the reference joins
        Message(topic="TopicA", body=b"x", keys=["a", 1]),
        Message(topic="TopicA", body=b"x", tags="\ud800"),  # not strict UTF-8: the reference raises
        _MyMessage(topic="TopicA", body=b"x"),  # a subclass: its slots may differ
    ]
    for m in odd:
        table = {"TopicA-0": 3}
        assert _native_plain(enc, [ok, m], None, table, 0, 1) is None, m
        assert table == {"TopicA-0": 3}
        try:
            ref = enc.encode_plain_batch_py([ok, m], None, table, 0, 1)
        except Exception as e:  # noqa: BLE001  (struct.error, TypeError, UnicodeEncodeError: the put path's to report)
            ref = e
        if codec.NATIVE:  # the wrapper gives what the reference gives
            try:
                got = enc.encode_plain_batch([ok, m], None, table, 0, 1)
            except Exception as e:  # noqa: BLE001
                got = e
            if isinstance(ref, Exception):
                assert type(got) is type(ref)
            elif ref is None:
                assert got is None
            else:
                _same_batch(got, ref)
    assert _native_plain(enc, [ok], ["x"] * 0, {}, 0, 1) is None  # uniq keys shorter than the batch


def test_encode_plain_batch_native_queue_offsets_past_many_queues():
    enc = _encoder("127.0.0.1:10911")
    msgs = [Message(topic=TOPICS[i % 3], body=b"b", queue_id=i % 97) for i in range(2000)]
    table = {"TopicA-0": 10, "t-1-5": 2 ** 40}
    _same_batch(codec.PlainBatch(*_native_plain(enc, msgs, None, table, 77, 5)),
                enc.encode_plain_batch_py(msgs, None, table, 77, 5))


# -- (b) the dispatch of a batch: consume-queue units and index entries ------------------------------------
_requests = st.lists(
    st.builds(
        codec.DispatchRequest,
        topic=st.sampled_from(TOPICS) | TEXT,
        queue_id=st.integers(0, 3),
        commit_log_offset=st.integers(0, 2 ** 50),
        msg_size=st.integers(1, 5000),
        tags_code=st.integers(-(2 ** 63), 2 ** 63 - 1),
        store_timestamp=st.integers(0, 2 ** 45),
        consume_queue_offset=st.integers(0, 2 ** 40),
        keys=st.none() | TEXT | st.lists(TEXT, max_size=4).map(" ".join),
        uniq_key=st.none() | st.just("") | TEXT,
        sys_flag=st.sampled_from([0, codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_COMMIT_TYPE,
                                  codec.TRANSACTION_ROLLBACK_TYPE, codec.TRANSACTION_COMMIT_TYPE | 0x10]),
        prepared_transaction_offset=st.integers(0, 100),
        properties_string=st.just(""),
    ),
    max_size=40,
)


@PROPS
@given(requests=_requests, end_phy=st.integers(0, 2 ** 50) | st.just(0))
def test_index_keys_native_equals_python(requests, end_phy):
    raw = _native.index_keys(requests, end_phy, codec.TRANSACTION_ROLLBACK_TYPE)
    assert raw is not None
    h, p, t = (np.frombuffer(raw[0], dtype=np.int32), np.frombuffer(raw[1], dtype=np.int64),
               np.frombuffer(raw[2], dtype=np.int64))
    rh, rp, rt = index_module.index_entries_py(requests, end_phy)
    assert h.dtype == rh.dtype and p.dtype == rp.dtype and t.dtype == rt.dtype
    assert h.tolist() == rh.tolist() and p.tolist() == rp.tolist() and t.tolist() == rt.tolist()


def test_index_keys_native_hashes_like_java():
    # String.hashCode values computed by Java (and by the reference); "Aa"/"BB" collide in Java too
    reqs = [codec.DispatchRequest("T", 0, 100 + i, 1, 0, 5, i, k, None, 0, 0, "") for i, k in
            enumerate(["Aa", "BB", "polygenelubricants", "😀 é", "x" * 600])]
    raw = _native.index_keys(reqs, 0, codec.TRANSACTION_ROLLBACK_TYPE)
    want = [index_module.index_key_hash(f"T#{k}") for r in reqs for k in r.keys.split(" ") if k]
    assert np.frombuffer(raw[0], dtype=np.int32).tolist() == want
    # a lone surrogate is not UTF-16: the reference decides (it raises)
    bad = [codec.DispatchRequest("T", 0, 1, 1, 0, 5, 0, "a\udc00", None, 0, 0, "")]
    assert _native.index_keys(bad, 0, codec.TRANSACTION_ROLLBACK_TYPE) is None
    with pytest.raises(UnicodeEncodeError):
        index_module.index_entries_py(bad, 0)


@PROPS
@given(requests=_requests)
def test_group_units_native_equals_python(requests):
    raw = _native.group_units(requests, codec.TRANSACTION_PREPARED_TYPE)
    ref = ms_module.group_units_py(requests)
    assert [key for key, _ in raw] == list(ref)
    for (_key, units), want in zip(raw, ref.values(), strict=True):
        assert np.frombuffer(units, dtype=np.int64).reshape(-1, 4).tolist() == [list(u) for u in want]
    got = ms_module.group_units(requests)
    assert list(got) == list(ref)
    assert all(np.asarray(got[k]).tolist() == [list(u) for u in ref[k]] for k in ref)


# -- (c) the record walk of recovery and verify ------------------------------------------------------------
_records = st.lists(
    st.tuples(st.sampled_from(TOPICS[:4] + ["V" * 130]), st.binary(max_size=400), TEXT,
              st.sampled_from([(b"\x7f\x00\x00\x01", 1), (b"\x00" * 15 + b"\x01", 2)]),
              st.sampled_from([(b"\x0a\x00\x00\x02", 3), (b"\x00" * 15 + b"\x02", 4)]), st.booleans()),
    min_size=1, max_size=8)


@PROPS
@given(records=_records, tail=st.sampled_from(["none", "blank", "zeros", "garbage"]),
       damage=st.none() | st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)),
       check_crc=st.booleans(), max_records=st.integers(1, 10), cut=st.integers(0, 40))
def test_skim_records_native_equals_python(records, tail, damage, check_crc, max_records, cut):
    parts = []
    for i, (topic, body, props, born, store, v2) in enumerate(records):
        parts.append(codec.encode_record(
            topic=topic, body=body, properties_string=f"KEYS\x01{props}\x02" if props else "", queue_id=i % 3,
            queue_offset=i, physical_offset=sum(map(len, parts)), born_host=born, store_host=store,
            store_timestamp=1000 + i, force_v2=v2))
    buf = bytearray(b"".join(parts))
    buf += {"none": b"", "blank": codec.encode_blank(64) + b"\0" * 56, "zeros": b"\0" * 64,
            "garbage": b"\x01\x02\x03\x04" * 16}[tail]
    if damage is not None:
        buf[damage[0] % len(buf)] = damage[1]
    data = bytes(buf)
    for limit in (len(data), max(0, len(data) - cut)):
        for pos in (0, len(parts[0])):
            want = codec.skim_records_py(data, pos, limit, check_crc, max_records)
            got = _native.skim_records(data, pos, limit, check_crc, max_records, True, codec._SKIM_STATES)
            if got is not None:  # None: a read past the buffer, whose error message the reference words
                assert got == want
                assert _native.skim_records(memoryview(data), pos, limit, check_crc, max_records, False,
                                            codec._SKIM_STATES) == ([], *want[1:])
            assert codec.skim_records(data, pos, limit, check_crc, max_records) == want


def _prop_crc_walk(recs, nxt, state, reason, undecided, data):
    """walk_commit_log's use of `skim_records_prop_crc`: the full check on the records the skim left."""
    from rmq_eventstore.store.recovery import prop_crc_damage

    for i in undecided:
        why = prop_crc_damage(data, recs[i][0], recs[i][1])
        if why:
            return recs[:i], recs[i][0], codec.SKIM_DAMAGE, why
    return recs, nxt, state, reason


@PROPS
@given(records=st.lists(st.tuples(_records.map(lambda r: r[0]), st.booleans(), st.sampled_from(["", "a\x01b"])),
                        min_size=1, max_size=8),
       damage=st.none() | st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)),
       check_crc=st.booleans(), max_records=st.integers(1, 10), cut=st.integers(0, 40))
def test_skim_records_prop_crc_native_equals_python(records, damage, check_crc, max_records, cut):
    """The trailer check inside the C walk (`skim_records_prop_crc`) + the full check on what it leaves gives
    what the reference gives: `skim_records_py` + `recovery.prop_crc_damage` on every record."""
    from rmq_eventstore.store.recovery import prop_crc_damage

    parts = []
    for i, ((topic, body, props, born, store, v2), crc, extra) in enumerate(records):
        parts.append(codec.encode_record(
            topic=topic, body=body, properties_string=(f"KEYS\x01{props}\x02" if props else "") + extra,
            queue_id=i % 3, queue_offset=i, physical_offset=sum(map(len, parts)), born_host=born,
            store_host=store, store_timestamp=1000 + i, force_v2=v2, append_crc=crc))
    buf = bytearray(b"".join(parts)) + b"\0" * 64
    if damage is not None:
        buf[damage[0] % len(buf)] = damage[1]
    data = bytes(buf)
    for limit in (len(data), max(0, len(data) - cut)):
        for pos in (0, len(parts[0])):
            recs, nxt, state, reason = codec.skim_records_py(data, pos, limit, check_crc, max_records)
            want = (recs, nxt, state, reason)
            for i, r in enumerate(recs):
                why = prop_crc_damage(data, r[0], r[1])
                if why:
                    want = (recs[:i], r[0], codec.SKIM_DAMAGE, why)
                    break
            got = codec.skim_records_prop_crc(data, pos, limit, check_crc, max_records)
            assert _prop_crc_walk(*got, data) == want
            raw = _native.skim_records(data, pos, limit, check_crc, max_records, True, codec._SKIM_STATES, True)
            if raw is not None:
                if codec.NATIVE:
                    assert raw == got
                assert _prop_crc_walk(*raw, data) == want
                # left undecided: exactly the records that do not end with 0x02 + a trailer
                assert raw[4] == [i for i, r in enumerate(raw[0])
                                  if not (r[1] > 112 and data[r[0] + r[1] - 21:r[0] + r[1] - 11] == b"\x02__CRC32#\x01"
                                          and data[r[0] + r[1] - 11:r[0] + r[1] - 1].isdigit()
                                          and data[r[0] + r[1] - 1] == 2)]


def test_skim_records_native_declines_limits_past_the_buffer():
    rec = bytes(codec.encode_record(topic="T", body=b"b", born_host=(b"\1\2\3\4", 1), store_host=(b"\1\2\3\4", 1)))
    assert _native.skim_records(rec, 0, len(rec) + 1, True, 10, True, codec._SKIM_STATES) is None
    assert codec.skim_records(rec, 0, len(rec) + 1, True, 10) == codec.skim_records_py(rec, 0, len(rec) + 1, True, 10)


@PROPS
@given(data=st.binary(max_size=5000), start=st.integers(0, 2 ** 32 - 1))
def test_crc32_equals_zlib(data, start):
    assert _native.crc32(data, start) == zlib.crc32(data, start)
    assert _native.crc32(data) == zlib.crc32(data)


_unit_batches = st.lists(  # batches of (size, tags, queue-offset step, offset step): mostly in order
    st.lists(st.tuples(st.integers(1, 500), st.integers(-(2 ** 63), 2 ** 63 - 1),
                       st.sampled_from([1, 1, 1, 1, 0, 2, -1]), st.sampled_from([1, 1, 1, 0, -1])),
             min_size=1, max_size=40),
    min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=_unit_batches, start_q=st.sampled_from([0, 0, 3]))
def test_consume_queue_native_arrays_write_what_lists_write(tmp_path_factory, batches, start_q):
    from rmq_eventstore.store.consume_queue import ConsumeQueue

    root = tmp_path_factory.mktemp("cq")
    queues = []
    for name in ("lists", "arrays", "packed"):
        cq = ConsumeQueue("T", 0, str(root / name), 20 * 50)  # 50 units per file: batches roll files
        cq.load()
        queues.append(cq)
    q, off = start_q, 1000
    written = []
    for batch in batches:
        units = []
        for size, tags, dq, doff in batch:
            units.append((off, size, tags, q))
            q = max(0, q + dq)
            off = max(0, off + doff * size)
        ref = queues[0].put_message_position_infos(units)
        got = queues[1].put_message_position_infos(np.asarray(units, dtype=np.int64))
        packed = queues[2].put_units_packed(np.asarray(units, dtype=np.int64).tobytes())  # rows as dispatch hands them
        written.append((ref, got, packed))
    try:
        assert all(a == b == c for a, b, c in written), written
        files = [[bytes(mf.mm) for mf in cq.mapped_file_queue.mapped_files] for cq in queues]
        assert files[0] == files[1] == files[2]
        assert queues[0].get_max_offset_in_queue() == queues[1].get_max_offset_in_queue() == \
            queues[2].get_max_offset_in_queue()
    finally:
        for cq in queues:
            cq.destroy()


@settings(max_examples=60, deadline=None)
@given(units=st.lists(st.tuples(st.integers(0, 2 ** 40), st.integers(-5, 2 ** 31), st.integers(-(2 ** 63), 2 ** 63 - 1),
                                st.integers(0, 8)), max_size=12),
       expect_q=st.integers(0, 3), prev_end=st.integers(0, 2 ** 40))
def test_cq_pack_checks_what_put_small_in_order_checks(units, expect_q, prev_end):
    raw = _native.cq_pack(np.asarray(units, dtype=np.int64).reshape(-1, 4).tobytes(), expect_q, prev_end)
    ok, parts = True, []
    for off, size, tags, q in units:  # the reference's checks, unit by unit
        if q != expect_q or off + size <= prev_end or size > 2 ** 31 - 1:
            ok = False
            break
        parts.append(struct.pack(">qiq", off, size, tags))
        prev_end, expect_q = off + size, expect_q + 1
    assert (raw is not None) == ok
    if ok:
        assert raw == (b"".join(parts), prev_end)


# -- UNIQ_KEY ids -------------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(head=st.text(alphabet="0123456789ABCDEF", max_size=40), c0=st.integers(0, 0xFFFF), k=st.integers(0, 70))
def test_format_ids_native_equals_python(head, c0, k):
    assert _native.format_ids(head, c0, k) == [f"{head}{(c0 + i) & 0xFFFF:04X}" for i in range(k)]
    assert _native.format_ids("é" + head, c0, k) is None  # not ASCII: the reference formats


def test_uniq_ids_from_create_and_create_many_are_unique_and_well_formed():
    from rmq_eventstore.common.message_id import UniqueIdGenerator

    gen = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    ids = [gen.create() for _ in range(300)] + gen.create_many(70_000) + [gen.create() for _ in range(300)]
    assert len(set(ids)) == len(ids)  # 70,600 ids: past one millisecond's 65,536 counters
    assert all(len(i) == 32 and i == i.upper() and bytes.fromhex(i)[:4] == b"\x0a\x00\x00\x01" for i in ids)
    assert len({i[:28] for i in ids}) >= 2  # the burst borrowed the next millisecond


# -- (a) the network batch (messages that carry a properties string) ---------------------------------------
def _native_network(enc: codec.RecordEncoder, msgs, table, base, now):
    addr, port = enc.store_host
    return _native.encode_network_batch(
        msgs, table, base, now, enc._topics, addr, port, enc.max_message_size,
        enc.max_message_size + codec.RECORD_HEADROOM, codec._TAGS_CODE_CACHE, codec.tags_string_to_tags_code,
        codec.DispatchRequest, codec.parse_host, codec.SCHEDULE_TOPIC, enc.append_crc)


_prop_pairs = st.lists(st.tuples(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "a", "TAGSX", "XKEYS",
                                                  codec.PROPERTY_CRC32, "x__CRC32#"])
                                 | TEXT.filter(bool), TEXT.filter(bool)), max_size=6)
_network = st.builds(
    Message,
    topic=st.sampled_from(TOPICS),
    body=st.binary(max_size=300),
    queue_id=st.integers(0, 3),
    flag=INT32,
    properties_string=st.tuples(_prop_pairs, st.booleans()).map(
        lambda t: "".join(f"{k}\x01{v}\x02" for k, v in t[0])[: None if t[1] else -1]),
    sys_flag=st.sampled_from([0, codec.TRANSACTION_COMMIT_TYPE, 0x10, 0x20 | 0x1, codec.TRANSACTION_COMMIT_TYPE | 0x30]),
    born_timestamp=st.just(0) | st.integers(1, 2 ** 62),
    born_host=st.none() | st.just("") | st.sampled_from(["10.1.2.3:4567", "[::1]:9", "[::ffff:1.2.3.4]:80"]),
    reconsume_times=INT32,
    prepared_transaction_offset=st.integers(-(2 ** 63), 2 ** 63 - 1),
)


@PROPS
@given(msgs=st.lists(_network, max_size=12), store_host=st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]),
       base=st.integers(0, 2 ** 40), table=st.dictionaries(st.sampled_from(["TopicA-1", "Tö-0"]), st.integers(0, 2 ** 40)),
       append_crc=st.booleans())
def test_encode_network_batch_native_equals_python(msgs, store_host, base, table, append_crc):
    enc = _encoder(store_host, append_crc)
    now = 1_700_000_000_123
    ref = enc.encode_network_batch_py(msgs, table, base, now)
    raw = _native_network(enc, msgs, table, base, now)
    if ref is None:  # an empty TAGS/KEYS/UNIQ_KEY value or a __CRC32# with append_crc: the general path decides
        assert raw is None
        return
    assert raw is not None  # everything else here is covered by the C loop
    _same_batch(codec.PlainBatch(*raw), ref)
    if codec.NATIVE:
        _same_batch(enc.encode_network_batch(msgs, table, base, now), ref)


def test_encode_network_batch_native_declines_what_the_reference_must_decide():
    enc = _encoder("127.0.0.1:10911")
    enc._topic_part(codec.SCHEDULE_TOPIC, False)
    ok = Message(topic="TopicA", body=b"ok", properties_string="TAGS\x01a\x02")
    for m in (Message(topic="TopicA", body=b"x"),  # no properties string: the plain path's
              Message(topic="TopicA", body=b"x", properties_string="", sys_flag=codec.TRANSACTION_PREPARED_TYPE),
              Message(topic="TopicA", body=b"x", properties_string="", sys_flag=codec.TRANSACTION_ROLLBACK_TYPE),
              Message(topic="new", body=b"x", properties_string=""),
              Message(topic="TopicA", body=b"x", properties_string="", force_v2=True),
              Message(topic=codec.SCHEDULE_TOPIC, body=b"x", properties_string="DELAY\x011\x02"),
              Message(topic="TopicA", body=b"x", properties_string="TAGS\x01a\x02TAGS\x01\x02"),
              Message(topic="TopicA", body=b"x", properties_string="KEYS\x01\x02"),
              Message(topic="TopicA", body=b"x", properties_string="UNIQ_KEY\x01"),
              Message(topic="TopicA", body=bytearray(b"x"), properties_string=""),
              Message(topic="TopicA", body=b"x", properties_string="p\x01" + "v" * 40000),
              Message(topic="TopicA", body=b"x" * (4 * 2 ** 20 + 1), properties_string=""),
              Message(topic="TopicA", body=b"x", properties_string="", queue_id=-1),
              Message(topic="TopicA", body=b"x", properties_string="", born_host="nonsense"),
              Message(topic="TopicA", body=b"x", properties_string="", sys_flag=2 ** 31),
              Message(topic="TopicA", body=b"x", properties_string="a\x01\ud800\x02")):
        table: dict[str, int] = {}
        assert _native_network(enc, [ok, m], table, 0, 1) is None, m
        assert table == {}


def test_encoders_native_crc_trailer_edges():
    """append_crc at the edges: properties that fill PROPLEN to the last byte with the trailer (and the 0x02
    the network path adds), one byte more (declined by both), a `__CRC32#` already sent (declined), and records
    whose trailer `prop_crc_damage` accepts."""
    from rmq_eventstore.store.recovery import prop_crc_damage

    enc = _encoder("127.0.0.1:10911", append_crc=True)
    room = codec.MAX_PROPERTIES_LENGTH - codec.CRC32_RESERVED_LEN
    for n, fits in ((room - 6, True), (room - 5, False)):  # "TAGS\x01" + value + "\x02"
        m = Message(topic="TopicA", body=b"b", tags="t" * n)
        ref = enc.encode_plain_batch_py([m], None, {}, 0, 1)
        raw = _native_plain(enc, [m], None, {}, 0, 1)
        assert (ref is not None) is fits and (raw is not None) is fits
        if fits:
            _same_batch(codec.PlainBatch(*raw), ref)
    for ps, fits in (("a\x01" + "v" * (room - 3), True), ("a\x01" + "v" * (room - 2), False),
                     ("a\x01" + "v" * (room - 3) + "\x02", True), ("", True), ("a\x01b", True),
                     ("a\x01b\x02__CRC32#\x010123456789\x02", False), ("x__CRC32#y\x01b", False)):
        m = Message(topic="TopicA", body=b"b", properties_string=ps)
        ref = enc.encode_network_batch_py([m], {}, 0, 1)
        raw = _native_network(enc, [m], {}, 0, 1)
        assert (ref is not None) is fits and (raw is not None) is fits, ps
        if fits:
            _same_batch(codec.PlainBatch(*raw), ref)
            assert raw[1][0].properties_string == ps  # the request keeps what the producer sent
            assert prop_crc_damage(raw[0], 0, len(raw[0])) == ""
    m = Message(topic="TopicA", body=b"b" * 200, tags="t", keys="k")
    data = bytearray(_native_plain(enc, [m], None, {}, 0, 1)[0])
    assert prop_crc_damage(data, 0, len(data)) == ""
    data[100] ^= 1
    assert prop_crc_damage(data, 0, len(data)) == "__CRC32# property mismatch"


# -- (g) the columns hand-off of a batch put -------------------------------------------------------------
def _tree(root, sub):
    base = root / sub
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def test_columns_dispatch_writes_what_requests_write(tmp_path, monkeypatch, small_geometry):
    """A batch put hands its dispatch over as `DispatchColumns` (native) instead of one request per record:
    the commitlog, consume queues and index files it leaves are byte for byte those of the request path,
    across file rolls, several queues, tags and multi-token keys, with single puts in between; the arrival
    listeners hear of the same queue ends."""
    from rmq_eventstore.common.codec import DispatchColumns
    from rmq_eventstore.store import MessageStore
    from rmq_eventstore.store import commitlog as commitlog_module
    from rmq_eventstore.store.commitlog import CommitLog

    small_geometry.update(max_index_num=300, max_hash_slot_num=64,  # index files roll too
                          auto_create_uniq_key=False)  # records without a UNIQ_KEY, the same in both stores
    clock = [1_700_000_000_000]
    monkeypatch.setattr(commitlog_module, "now_ms", lambda: clock[0])
    handed: dict[str, list[type]] = {"columns": [], "requests": []}

    def run(name: str) -> tuple[dict, dict, dict, dict]:
        root = tmp_path / name
        store = MessageStore.open(root, **small_geometry)
        grown: dict = {}
        store.add_message_arriving_listener(lambda g: grown.update(g))
        orig = store.commit_log.on_appended
        store.commit_log.on_appended = lambda s, e, r: (handed[name].append(type(r)), orig(s, e, r))
        clock[0] = 1_700_000_000_000
        n = 0
        for size in (7, 1, 40, 3, 120, 1, 65, 200, 2, 90):  # a batch first: its born time is the clock's
            msgs = [Message(topic="TopicA" if i % 5 else "%RETRY%g-1", body=bytes([i % 251]) * (i % 97),
                            keys=None if i % 7 == 0 else (f"k{i} x{i % 3}" if i % 2 else [f"a{i}", "", f"b{i}"]),
                            tags=None if i % 3 else f"tag{i % 4}", queue_id=i % 3,
                            uniq_key=f"{i:032X}" if i % 11 else None)
                    for i in range(n, n + size)]
            n += size
            clock[0] += 3
            r = store.put_messages(msgs) if size > 1 else store.put_message(msgs[0])
            assert r.is_ok(), r
        assert store.wait_for_dispatch(10)
        store.shutdown()
        index = [p.read_bytes() for p in sorted((root / "index").iterdir())]
        return _tree(root, "commitlog"), _tree(root, "consumequeue"), {"index": index}, grown

    a = run("columns")
    monkeypatch.setattr(CommitLog, "_encode_plain_columns",
                        lambda self, msgs, uniq, table, base, begin: self.encoder.encode_plain_batch(
                            msgs, uniq, table, base, begin))
    b = run("requests")
    assert len(a[0]) > 1 and len(a[2]["index"]) > 1  # commitlog and index files rolled
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert a[2] == b[2]
    assert a[3] == b[3]
    assert DispatchColumns not in handed["requests"]
    if codec.NATIVE:
        assert DispatchColumns in handed["columns"]


def test_dispatch_columns_merge_and_grown():
    from rmq_eventstore.common.codec import DispatchColumns

    def rows(*r):
        return np.array(r, dtype=np.int64).tobytes()

    a = DispatchColumns(2, [(("T", 0), rows([0, 10, 0, 5])), (("T", 1), rows([10, 10, 0, 0]))],
                        np.array([1, 2], np.int32).tobytes(), rows(0, 10), rows(7, 7), 7)
    b = DispatchColumns(1, [(("T", 0), rows([20, 10, 3, 6]))], np.array([3], np.int32).tobytes(), rows(20), rows(8), 8)
    m = DispatchColumns.merge([a, b])
    assert len(m) == 3 and m.store_timestamp == 8
    assert [k for k, _ in m.units] == [("T", 0), ("T", 1)]
    assert np.frombuffer(m.units[0][1], np.int64).reshape(-1, 4).tolist() == [[0, 10, 0, 5], [20, 10, 3, 6]]
    assert np.frombuffer(m.hashes, np.int32).tolist() == [1, 2, 3]
    assert np.frombuffer(m.phy, np.int64).tolist() == [0, 10, 20]
    assert m.grown() == {("T", 0): 7, ("T", 1): 1}
    assert DispatchColumns.merge([a]) is a


def test_copy_into_copies_small_and_large_and_checks_bounds(tmp_path):
    import mmap

    path = tmp_path / "f"
    path.write_bytes(b"\0" * (1 << 20))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 1 << 20) as mm:
        view = memoryview(mm)
        big = bytes(range(256)) * 400  # 100 KiB: copied without the GIL
        _native.copy_into(view, 5, b"abc")
        _native.copy_into(view, 1000, big)
        assert mm[5:8] == b"abc" and mm[1000:1000 + len(big)] == big and mm[:5] == b"\0" * 5
        _native.copy_into(view, (1 << 20) - 3, b"xyz")  # exactly at the end
        for pos, data in ((-1, b"a"), ((1 << 20) - 2, b"xyz"), (1 << 21, b"")):
            with pytest.raises(ValueError):
                _native.copy_into(view, pos, data)
        with pytest.raises(TypeError):
            _native.copy_into(b"read-only", 0, b"a")
        view.release()


@PROPS
@given(flags=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=20))
def test_count_missing_uniq_counts_what_uniq_keys_counts(flags):
    msgs = [Message(topic="TopicA", body=b"x", uniq_key="U" if u else None, properties_string="a\x01b\x02" if p else None)
            for u, p in flags]
    assert _native.count_missing_uniq(msgs) == sum(1 for m in msgs if m.uniq_key is None and m.properties_string is None)
    assert _native.count_missing_uniq(tuple(msgs)) == _native.count_missing_uniq(msgs)
    assert _native.count_missing_uniq([*msgs, _MyMessage(topic="TopicA", body=b"x")]) is None  # not exactly a Message
