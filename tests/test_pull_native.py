"""The pull read in C (issue 16) against its pure-Python references, in one process, whatever
`RMQ_EVENTSTORE_PURE` says (it runs in both passes of `make test`, PURE_TESTS):

* `_native.read_runs` (the broker's match-all read, `MessageStore._get_matching_all_native`) must give what
  `_get_matching_all` and the general unit loop `_get_by_units` give: statuses, next_begin_offset, transfer
  limits, BLANK units, removed records, unreadable units, runs crossing commitlog files, and the same
  record bytes (its `body` is them back to back);
* `_native.decode_records` (the client's decode of a pull body, `codec.decode_records_with`) must give
  what `codec.decode_records_py` gives, field for field, and the same `CorruptRecordError` on damage.

The tests skip when the extension is not built, unless `RMQ_EVENTSTORE_REQUIRE_NATIVE=1`.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import MessageExt
from rmq_eventstore.store import GetMessageResult, GetMessageStatus, MessageFilter, MessageStore
from rmq_eventstore.store.consume_queue import UNIT
from tests.conftest import import_native
from tests.match_all_helpers import COMMITLOG_FILE_SIZE, draw_crafted_read, fill, match_all_reads

_native = import_native()
_native.init_pull(MessageExt)


# -- the broker's read ------------------------------------------------------------------------------------
def _three(store: MessageStore, units: list[tuple[int, int, int]], offset: int, max_nums: int,
           max_total: int) -> tuple[GetMessageResult | None, ...]:
    return match_all_reads(store, units, offset, max_nums, max_total, native=_native)


def test_native_read_crosses_commitlog_files_and_equals_the_python_reads(open_store):
    store = open_store(max_transfer_count_on_message_in_memory=1000,
                       max_transfer_bytes_on_message_in_memory=1 << 20)
    fill(store, 600)  # ~120 KiB over 64 KiB commitlog files: several files, each ended by a blank record
    units = store.find_consume_queue("T", 0).get_units(0, 600)
    assert store.find_consume_queue("T", 0).get_units_raw(0, 600) == b"".join(UNIT.pack(*u) for u in units)
    assert len({u[0] // COMMITLOG_FILE_SIZE for u in units}) >= 2
    c, py, slow = _three(store, units, 0, 600, 1 << 30)
    assert c is not None and c == py == slow
    assert c.message_count == 600 and c.status is GetMessageStatus.FOUND
    assert c.body == b"".join(slow.message_buffers)
    assert [m.keys for m in c.messages] == [f"k{j}" for j in range(600)]


def test_get_message_result_from_native_read_unpacks_lazily(open_store):
    store = open_store()
    fill(store, 100)
    max_phy, min_phy = store.commit_log.get_max_offset(), store.commit_log.get_min_offset()
    raw = store.find_consume_queue("T", 0).get_units_raw(10, 32)
    r = store._get_matching_all_native(GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 10, 0, 100), raw,
                                       10, 32, 1 << 20, max_phy, min_phy, impl=_native)
    assert r is not None and r._buffers is None and r.message_count == 32  # nothing unpacked for a pull
    body = r.body
    assert r.message_queue_offsets == list(range(10, 42))
    assert b"".join(r.message_buffers) == body and r.body is body
    assert [m.queue_offset for m in r.messages] == list(range(10, 42))
    assert r.commit_log_offsets == [m.commit_log_offset for m in r.messages]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_crafted_units_give_the_same_result_in_c_and_python(store, data):
    units, run = draw_crafted_read(data, store, [0, 40, 100], more_units=(
        st.tuples(st.just(0), st.integers(-5, -1), st.just(0)),  # a negative size
        st.tuples(st.just(-100), st.just(50), st.just(0)),     # below the commitlog's first offset
        st.tuples(st.just(2 ** 63 - 10), st.just(100), st.just(0)),  # damaged: offset + size overflows int64
    ))
    cfg = store.config
    max_phy = store.commit_log.get_max_offset()
    ram = store.__dict__.setdefault("_real_total_ram", store._total_ram)
    store._total_ram = ram
    if cfg.access_message_in_memory_max_ratio == 100 and len(run) > 1:
        # the in-memory floor (max_phy - RAM) falls exactly on a record of the run: the limits change there
        store._total_ram = max_phy - data.draw(st.sampled_from(run[1:]))[0]
    c, py, slow = _three(store, units, 7, data.draw(st.integers(1, 64)), data.draw(st.integers(100, 30_000)))
    assert c is not None and c == py == slow
    assert c.body == b"".join(slow.message_buffers)


def test_the_in_memory_floor_on_a_record_counts_it_in_memory(store):
    fill(store, 50)
    units = store.find_consume_queue("T", 0).get_units(0, 50)
    cfg = store.config
    cfg.max_transfer_count_on_message_in_disk, cfg.max_transfer_count_on_message_in_memory = 1, 60
    cfg.access_message_in_memory_max_ratio = 100
    store._total_ram = store.commit_log.get_max_offset() - units[1][0]  # the floor: the second record
    c, py, slow = _three(store, units, 0, 32, 1 << 20)
    assert c == py == slow and c is not None and c.message_count == 32  # record 1 on: in memory
    store._total_ram -= 1  # now record 1 is on disk: the disk count (1) ends the batch before it
    c, py, slow = _three(store, units, 0, 32, 1 << 20)
    assert c == py == slow and c is not None and c.message_count == 1 and c.next_begin_offset == 1


def test_get_message_is_the_same_on_both_paths(open_store, monkeypatch):
    store = open_store(max_transfer_count_on_message_in_memory=256)
    fill(store, 300)
    for offset, n in ((0, 32), (5, 256), (290, 32), (299, 1), (300, 32), (301, 5)):
        monkeypatch.setattr(codec, "pull_native", _native)
        c = store.get_message("g", "T", 0, offset, n, MessageFilter("*"))
        monkeypatch.setattr(codec, "pull_native", None)
        py = store.get_message("g", "T", 0, offset, n, MessageFilter("*"))
        assert c == py and c.body == py.body, (offset, n)


def test_a_file_view_gone_under_the_read_gives_none():
    view = memoryview(bytearray(1000))
    view.release()  # as a view of an unmapped commitlog file
    unit = UNIT.pack(100, 50, 0)
    span = lambda off: (0, 1000, view)  # noqa: E731
    assert _native.read_runs(unit, 0, 32, 1 << 20, 0, 1 << 20, 32, 1 << 20, 32, 0, span) is None
    live = memoryview(bytes(range(256)) * 4)
    r = _native.read_runs(unit * 2, 0, 32, 1 << 20, 0, 1 << 20, 32, 1 << 20, 32, 0, lambda off: (0, 1000, live))
    assert r is not None and r[:4] == (2, 2, 100, 100) and r[4] == bytes(live[100:150]) * 2
    # offset + size past int64 (a damaged unit): unreadable, as Python's unbounded ints make it
    seen = []
    r = _native.read_runs(UNIT.pack(2 ** 63 - 10, 100, 0), 0, 32, 1 << 20, 0, 1 << 20, 32, 1 << 20, 32, 0,
                          lambda off: seen.append(off))
    assert r == (1, 1, 0, -1, b"", b"") and seen == [2 ** 63 - 10]
    with pytest.raises(ZeroDivisionError):  # an error of the lookup is the caller's
        _native.read_runs(unit, 0, 32, 1 << 20, 0, 1 << 20, 32, 1 << 20, 32, 0, lambda off: 1 / 0)


# -- the client's decode ----------------------------------------------------------------------------------
_EXT_FIELDS = ("store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
               "sys_flag", "born_timestamp", "born_host_bytes", "born_port", "store_timestamp", "store_host_bytes",
               "store_port", "reconsume_times", "prepared_transaction_offset", "body", "topic",
               "properties_string")


def _fields(m: MessageExt) -> tuple:
    assert m._properties is None
    return tuple((type(getattr(m, f)), getattr(m, f)) for f in _EXT_FIELDS)


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=10)
INT32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
HOST = st.one_of(st.tuples(st.binary(min_size=4, max_size=4), INT32), st.tuples(st.binary(min_size=16, max_size=16), INT32))


@st.composite
def records(draw) -> bytes:
    props = draw(st.lists(st.tuples(TEXT, TEXT), max_size=4))
    body = draw(st.binary(max_size=300))
    sys_flag = draw(st.integers(0, 0xFFFF)) & ~0x1  # COMPRESSED below, with a real ZLIB body or not
    compressed = draw(st.sampled_from(["no", "zlib", "bad", "lz4"]))
    if compressed == "zlib":
        body, sys_flag = zlib.compress(body), (sys_flag | codec.COMPRESSED_FLAG) & ~0x700
    elif compressed == "bad":  # the COMPRESSED bit on a body that does not inflate: left as stored
        sys_flag = (sys_flag | codec.COMPRESSED_FLAG) & ~0x700
    elif compressed == "lz4":
        sys_flag = (sys_flag | codec.COMPRESSED_FLAG | codec.COMPRESSION_LZ4_TYPE)
    rec = codec.encode_record(
        topic=draw(st.sampled_from(["T", "TopicA", "Tö", "%RETRY%g", "L" * 200, "x" * 127])),
        body=body, properties_string="".join(f"{k}\x01{v}\x02" for k, v in props), queue_id=draw(INT32),
        flag=draw(INT32), queue_offset=draw(INT64), physical_offset=draw(INT64), sys_flag=sys_flag,
        born_timestamp=draw(INT64), born_host=draw(HOST), store_timestamp=draw(INT64), store_host=draw(HOST),
        reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64), force_v2=draw(st.booleans()),
        append_crc=draw(st.booleans()))
    if props and draw(st.booleans()):  # not UTF-8 in the properties: both decode with "replace"
        rec[-2:] = b"\xff\xc3"
    return bytes(rec)


def _decode_both(buf: bytes, decompress: bool) -> tuple[object, object]:
    out = []
    for f in (lambda: codec.decode_records_with(_native, buf, decompress),
              lambda: codec.decode_records_py(buf, decompress=decompress)):
        try:
            out.append([_fields(m) for m in f()])
        except codec.CorruptRecordError as e:
            out.append(("error", e.offset, e.reason))
    return out[0], out[1]


@settings(max_examples=300, deadline=None)
@given(recs=st.lists(records(), min_size=1, max_size=8), decompress=st.booleans(), cut=st.integers(0, 2 ** 31))
def test_native_decode_equals_the_python_decode(recs, decompress, cut):
    buf = b"".join(recs)
    c, py = _decode_both(buf, decompress)
    assert c == py
    assert isinstance(c, list) and len(c) == len(recs)
    # damaged: cut short, or a byte flipped (a header field, a length, the magic, the topic...)
    bad = bytearray(buf)
    if cut % 2:
        bad = bad[:cut % len(buf)]
    else:
        bad[cut % len(buf)] ^= 1 << (cut % 8)
    c, py = _decode_both(bytes(bad), decompress)
    assert c == py


def test_decode_of_a_pull_body_from_the_store(open_store):
    store = open_store(max_transfer_count_on_message_in_memory=256)
    fill(store, 300)
    body = store.get_message("g", "T", 0, 0, 256, MessageFilter("*")).body
    c, py = _decode_both(body, True)
    assert c == py and len(c) == 256
    assert c[0] == _fields(codec.decode_message(body, 0))
    assert codec.decode_records_with(_native, b"", True) == []
    with pytest.raises(TypeError):
        _native.decode_records(bytearray(body), 0, [], True)  # the wrapper passes bytes only
