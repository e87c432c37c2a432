"""THE END LANE: an END_TRANSACTION's commit record properties and the half's properties dict in C
(`_native.end_commit_props`, `_native.end_props_dict`), and the op message's properties string written
directly (`op_properties_string`), against the Python they replace.

Each C function is compared with its Python reference on any properties text (it returns the same or
declines with None), and twin brokers, one ending transactions with the C functions and one with them off
(`service.END_NATIVE = None`, the pure path; both also under RMQ_EVENTSTORE_PURE), store the same records (commit, op message, consume queues,
index) and remember the same ends.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.processor.end_transaction import EndTransactionProcessor
from rmq_eventstore.broker.transaction import service as tx_service
from rmq_eventstore.common import Message, MessageExt, codec
from rmq_eventstore.common.codec import DispatchRequest
from rmq_eventstore.common.properties import (
    delete_properties,
    get_property,
    set_property,
    string_to_properties,
)
from rmq_eventstore.common.topic import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store import index as index_module
from rmq_eventstore.store.index import IndexService
from tests.conftest import SMALL_GEOMETRY, import_native

NATIVE = import_native()  # the C functions are compared directly, with the native core on or off
NATIVE.init_pull(MessageExt)  # its pull decoder's type (bound by codec only with the native core on)
DROPPED = ("REAL_TOPIC", "REAL_QID", "TRANSACTION_CHECK_TIMES")


def commit_props_py(props: str, queue_offset: int, drop_crc: bool) -> tuple[str, str, int]:
    """`TransactionalMessageService._commit_message`'s Python path (the reference)."""
    real_topic = get_property(props, "REAL_TOPIC") or ""
    real_qid = int(get_property(props, "REAL_QID") or 0)
    props = delete_properties(props, (*DROPPED, "__CRC32#") if drop_crc else DROPPED)
    props = set_property(props, "TRAN_PREPARED_QUEUE_OFFSET", str(queue_offset))
    return props, real_topic, real_qid


SEGMENTS = st.sampled_from([
    "REAL_TOPIC\x01Tx\x02", "REAL_TOPIC\x01Other\x02", "REAL_TOPIC\x01\x02", "REAL_TOPIC\x01", "REAL_TOPIC",
    "REAL_QID\x013\x02", "REAL_QID\x0107\x02", "REAL_QID\x01\x02", "REAL_QID\x01-1\x02", "REAL_QID\x01 2\x02",
    "REAL_QID\x011_0\x02", "REAL_QID\x019999999999\x02", "TRANSACTION_CHECK_TIMES\x012\x02",
    "TRAN_PREPARED_QUEUE_OFFSET\x015\x02", "__CRC32#\x010123456789\x02", "UNIQ_KEY\x01AC11\x02", "PGROUP\x01g\x02",
    "TAGS\x01t", "KEYS\x01a b\x02", "\x02", "\x01", "x", "caf\xe9\x02", "\u4e2d\x01v\x02", "XREAL_TOPIC\x01y\x02",
    "REAL_TOPIC\x01a\x01b\x02", "STREAM_ID\x01s-1\x02",
])


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(SEGMENTS, max_size=8), queue_offset=st.integers(-2**63, 2**63 - 1),
       drop_crc=st.booleans())
def test_commit_props_in_c_are_the_pythons_or_declined(parts: list[str], queue_offset: int,
                                                        drop_crc: bool) -> None:
    props = "".join(parts)
    got = NATIVE.end_commit_props(props, queue_offset, drop_crc)
    try:
        want = commit_props_py(props, queue_offset, drop_crc)
    except ValueError:  # int() of an odd REAL_QID: the Python path raises, the C one must decline
        assert got is None
        return
    if got is None:  # declined: only non-ASCII text or a REAL_QID that is not plain digits (up to 9)
        qid = get_property(props, "REAL_QID") or ""
        assert not props.isascii() or not (qid.isdigit() and qid.isascii() and len(qid) <= 9)
        return
    assert got == want
    assert type(got[0]) is str and type(got[1]) is str and type(got[2]) is int


@pytest.mark.parametrize("props", [
    "", "UNIQ_KEY\x01A\x02TRAN_MSG\x01true\x02PGROUP\x01g\x02REAL_TOPIC\x01Tx\x02REAL_QID\x013\x02",
    "REAL_TOPIC\x01Tx\x02REAL_QID\x011",  # no final separator: the dropped last segment
    "REAL_QID\x011\x02KEYS\x01k",  # a kept last segment without its separator
    "a" * 600 + "\x02REAL_TOPIC\x01T\x02",  # longer than the C function's stack buffer
])
def test_the_usual_halves_are_served_in_c(props: str) -> None:
    for drop_crc in (False, True):
        assert NATIVE.end_commit_props(props, 12, drop_crc) == commit_props_py(props, 12, drop_crc)


def test_commit_props_decline_what_they_do_not_take() -> None:
    assert NATIVE.end_commit_props(None, 1, False) is None
    assert NATIVE.end_commit_props("a", 2**64, False) is None
    assert NATIVE.end_commit_props("a", "1", False) is None
    assert NATIVE.end_commit_props("caf\xe9", 1, False) is None
    assert NATIVE.end_props_dict(None) is None
    assert NATIVE.end_props_dict("caf\xe9\x01v") is None


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(SEGMENTS, max_size=8))
def test_props_dict_in_c_is_string_to_properties(parts: list[str]) -> None:
    props = "".join(parts)
    got = NATIVE.end_props_dict(props)
    if got is None:
        assert not props.isascii()
        return
    want = string_to_properties(props)
    assert got == want and list(got) == list(want)


@given(txid=st.text(alphabet=st.sampled_from("AZ09 -_:\x01\xe9"), max_size=40))
def test_op_properties_string_is_build_properties_strings(txid: str) -> None:
    op = Message(topic=RMQ_SYS_TRANS_OP_HALF_TOPIC, body=b"0", tags=tx_service.REMOVE_TAG, keys=[txid])
    assert tx_service.op_properties_string(txid) == codec.build_properties_string(op)


# -- twin brokers -----------------------------------------------------------------------------------------
def _broker(path: Path, prop_crc: bool) -> Iterator[Broker]:
    with MessageStore.open(path, enabled_append_prop_crc=prop_crc, **SMALL_GEOMETRY) as store:
        b = Broker(store)
        b.start()
        b.topic_manager.ensure("Tx", 4)
        b.topic_manager.ensure("Other", 4)
        try:
            yield b
        finally:
            b.shutdown()


@pytest.fixture(params=[False, True], ids=["plain", "prop-crc"])
def twins(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    c = _broker(tmp_path / "c", request.param)
    py = _broker(tmp_path / "py", request.param)
    yield next(c), next(py)
    for g in (c, py):
        next(g, None)


HALVES = [  # (properties sent, commit?)
    ("UNIQ_KEY\x01AC110001000000000000000000000{i}\x02TRAN_MSG\x01true\x02PGROUP\x01g\x02TAGS\x01t\x02", True),
    ("KEYS\x01k1 k2\x02UNIQ_KEY\x01AC110001000000000000000000001{i}\x02PGROUP\x01g\x02", False),
    ("UNIQ_KEY\x01AC110001000000000000000000002{i}\x02PGROUP\x01g\x02TRANSACTION_CHECK_TIMES\x013\x02", True),
    ("UNIQ_KEY\x01AC110001000000000000000000003{i}\x02PGROUP\x01g\x02TRAN_PREPARED_QUEUE_OFFSET\x019\x02"
     "CLUSTER\x01c", True),
    ("UNIQ_KEY\x01AC110001000000000000000000004{i}\x02PGROUP\x01g\x02KEYS\x01caf\xe9\x02", True),  # declined
    ("UNIQ_KEY\x01AC110001000000000000000000005{i}\x02PGROUP\x01g\x02STREAM_ID\x01s-{i}\x02", True),
]


def _prepare(b: Broker, props: str, topic: str, qid: int) -> tuple[int, int]:
    msg = Message(topic, b"body-" + props.encode()[:8], queue_id=qid, flag=3, born_timestamp=1700000000123)
    msg.properties_string = props
    msg.sys_flag = codec.TRANSACTION_PREPARED_TYPE
    b.transaction_service.prepare(msg)
    r = b.store.put_message(msg)
    assert r.is_ok(), r.status
    return r.append_result.wrote_offset, r.append_result.logics_offset


def _end(b: Broker, offsets: tuple[int, int], commit: bool, wait: bool) -> tuple[int, str | None] | None:
    req = RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": "g", "tranStateTableOffset": offsets[1], "commitLogOffset": offsets[0],
        "commitOrRollback": codec.TRANSACTION_COMMIT_TYPE if commit else codec.TRANSACTION_ROLLBACK_TYPE,
        "fromTransactionCheck": False})
    b.store.reput_message_service.wait_for(b.store.get_max_phy_offset(), 5.0)
    r = EndTransactionProcessor(b).process(req, None, wait=wait)
    return None if r is None else (r.code, r.remark)


def _stored(b: Broker) -> list[tuple]:
    """Every record of the real topics and the half and op topics, through their consume queues (every field
    but the store timestamp, an op message's born timestamp, both the clock's, and the `__CRC32#` trailer's
    value, a CRC of the record with its store timestamp; with equal offsets and sizes, the same bytes), and
    what the index finds."""
    b.store.reput_message_service.wait_for()
    out: list[tuple] = []
    for topic, queues in (("Tx", 4), ("Other", 4), (RMQ_SYS_TRANS_HALF_TOPIC, 1), (RMQ_SYS_TRANS_OP_HALF_TOPIC, 4)):
        for q in range(queues):
            for offset in range(b.store.get_max_offset_in_queue(topic, q)):
                for m in b.store.get_message("g", topic, q, offset, 1).messages:
                    out.append((m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.store_size,
                                bytes(m.body), re.sub("__CRC32#\x01[0-9]{10}", "__CRC32#*", m.properties_string), m.flag, m.sys_flag,
                                None if topic == RMQ_SYS_TRANS_OP_HALF_TOPIC else m.born_timestamp,
                                m.born_host, m.store_host, m.reconsume_times, m.body_crc,
                                m.prepared_transaction_offset, m.tags_code))
                    for key in filter(None, [m.uniq_key, *m.keys_list()]):
                        found = b.store.query_message(topic, key, 32).messages
                        out.append((topic, key, sorted(f.commit_log_offset for f in found)))
    return out


def _state(b: Broker) -> tuple:
    s = b.transaction_service
    return dict(s._recent), [s.known_end(t) for t in s._recent], dict(b.stream_versions._pending)


def test_twin_brokers_store_the_same_ends(twins: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch) -> None:
    c, py = twins
    for i in range(2):
        for k, (props, commit) in enumerate(HALVES):
            topic = "Other" if k == 3 else "Tx"
            text = props.format(i=i)
            for b, native in ((c, NATIVE), (py, None)):
                monkeypatch.setattr(tx_service, "END_NATIVE", native)
                offsets = _prepare(b, text, topic, (i + k) & 3)
                if "STREAM_ID" in text:
                    b.stream_versions.reserve(topic, f"s-{i}", text.split("UNIQ_KEY\x01")[1].split("\x02")[0], 1)
                first = _end(b, offsets, commit, wait=bool(i))
                if first is None:  # on the loop it may decline (a stream transaction): then on a thread
                    first = _end(b, offsets, commit, wait=True)
                again = _end(b, offsets, not commit, wait=True)  # a late, crossing end changes nothing
                assert first == (ResponseCode.SUCCESS, None) and again == first
    assert _stored(c) == _stored(py)
    assert _state(c) == _state(py)
    commits = [r for r in _stored(c) if len(r) > 3 and r[0] in ("Tx", "Other")]
    assert len(commits) == 2 * sum(commit for _, commit in HALVES)


# -- the half message read -------------------------------------------------------------------------------
LOOKED = [  # messages whose records are read back by offset, as an END reads its half
    {"topic": "Tx", "body": b"x" * 200, "properties_string": "UNIQ_KEY\x01A\x02REAL_TOPIC\x01Tx\x02"},
    {"topic": "Tx", "body": b"", "properties_string": ""},
    {"topic": "Tx", "body": b"\x00\xff", "properties_string": "KEYS\x01caf\xe9 \u4e2d\x02", "flag": 7,
     "reconsume_times": 3, "prepared_transaction_offset": 99},
    {"topic": "%RETRY%" + "g" * 140, "body": b"v2 record", "properties_string": "TAGS\x01t\x02"},
    {"topic": "Tx", "body": b"v2 forced", "properties_string": "TAGS\x01t\x02", "force_v2": True},
    {"topic": "Tx", "body": b"six", "properties_string": "a\x01b", "born_host": "[::1]:5"},
    {"topic": "Tx", "body": b"sys", "properties_string": "", "sys_flag": codec.TRANSACTION_PREPARED_TYPE | 0x1},
]


def _fields(m: object) -> dict[str, object]:
    return {k: getattr(m, k) for k in type(m).__slots__ if k != "_properties"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("prop_crc", [False, True])
def test_a_record_looked_up_by_offset_is_decode_messages(tmp_path: Path, prop_crc: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with MessageStore.open(tmp_path / "s", enabled_append_prop_crc=prop_crc, **SMALL_GEOMETRY) as store:
        offsets = []
        for fields in LOOKED:
            r = store.put_message(Message(born_timestamp=1700000000123, **fields))  # type: ignore[arg-type]
            assert r.is_ok(), r.status
            offsets.append(r.append_result.wrote_offset)
        taken = [NATIVE.decode_records(bytes(store.commit_log.read_record(o)), 0, [], False) > 0  # type: ignore[arg-type]
                 for o in offsets]
        assert all(taken)  # each is decoded in C
        monkeypatch.setattr(codec, "pull_native", NATIVE)  # the C decoder, with the native core on or off
        got = [store.look_message_by_offset(o) for o in offsets]
        monkeypatch.setattr(codec, "pull_native", None)  # the Python path
        want = [store.look_message_by_offset(o) for o in offsets]
        assert [_fields(m) for m in want] == [_fields(codec.decode_message(store.commit_log.read_record(o)))  # type: ignore[arg-type]
                                              for o in offsets]
        assert [_fields(m) for m in got] == [_fields(m) for m in want]
        assert [type(m.body) for m in got] == [bytes] * len(LOOKED)
        assert [m.properties for m in got] == [m.properties for m in want]
        for bad in (offsets[1] + 1, store.get_max_phy_offset(), store.get_max_phy_offset() + 10**6):
            monkeypatch.setattr(codec, "pull_native", NATIVE)
            assert store.look_message_by_offset(bad) is None


# -- the index's look for earlier ends ---------------------------------------------------------------------
KEY_TEXT = st.text(alphabet=st.sampled_from("abAB#\xe9\u4e2d"), min_size=0, max_size=4)


@settings(max_examples=150, deadline=None)
@given(stored=st.lists(st.tuples(st.sampled_from(["T", "U", "Aa", "BB"]), KEY_TEXT, st.integers(0, 5)),
                       max_size=40),
       asked=st.lists(st.tuples(st.sampled_from(["T", "U", "Aa", "BB", ""]), KEY_TEXT), max_size=6))
def test_have_candidates_in_c_is_the_python_walk(tmp_path_factory: pytest.TempPathFactory,
                                                 stored: list[tuple[str, str, int]],
                                                 asked: list[tuple[str, str]]) -> None:
    """Small files (4 slots, 7 entries: chains, hash collisions, several files) with keys of any text, times
    over several seconds; the C walk (`_native.end_index_have`, with the native core on or off) answers as
    `have_candidates_py`."""
    svc = IndexService(str(tmp_path_factory.mktemp("idx")), 4, 7, flush_in_background=False)
    try:
        svc.build_index([DispatchRequest(t, 0, i * 100, 100, 0, 1_000_000 + s * 1000, 0, k or None, None, 0, 0, "")
                         for i, (t, k, s) in enumerate(stored)])
        want = svc.have_candidates_py(asked)
        for f in reversed(svc.files):  # the C walk itself, file by file, takes every file here
            found = [False] * len(asked)
            assert NATIVE.end_index_have(f.mm, f.mapped_size, f.hash_slot_num, f._index_count, f._begin_timestamp,
                                         f._entries_base, [f"{t}#{k}" for t, k in asked], found) is not None
        original = index_module._INDEX_HAVE
        index_module._INDEX_HAVE = NATIVE.end_index_have
        try:
            assert svc.have_candidates(asked) == want
        finally:
            index_module._INDEX_HAVE = original
        assert want == [bool(svc.query_offset(t, k, 64, 0, 2**62).phy_offsets) for t, k in asked]
    finally:
        svc.shutdown()


def test_have_candidates_declines_a_lone_surrogate() -> None:
    assert NATIVE.end_index_have(b"\0" * 100, 100, 4, 2, 0, 56, ["T#\ud800"], [False]) is None
    assert NATIVE.end_index_have(b"\0" * 10, 100, 4, 2, 0, 56, ["T#k"], [False]) is None  # a read past the buffer
