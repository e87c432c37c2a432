"""THE END LANE: an END_TRANSACTION's commit record properties and the half's properties dict in C
(`_native.end_commit_props`, `_native.end_props_dict`), and the op message's properties string written
directly (`op_properties_string`), against the Python they replace.

Each C function is compared with its Python reference on any properties text (it returns the same or
declines with None), and twin brokers, one ending transactions with the C functions and one with them off
(`service.END_NATIVE = None`, the pure path; both also under RMQ_EVENTSTORE_PURE), store the same records (commit, op message, consume queues,
index) and remember the same ends.
"""

from __future__ import annotations

import itertools
import re
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
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
from rmq_eventstore.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_SIZE,
    FrameDecoder,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
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


# -- THE END FRAME: a one-way END served from its bytes in one C call (`_native.end_frame`) ------------------
NATIVE.init(Message)  # the Message type end_frame builds (bound by codec only with the native core on)
END_FRAME = NATIVE.end_frame


class Host:
    """A channel with a peer address (what `process_now` is given)."""

    remote_address = "10.1.2.3:4"


class Lane:
    """A broker's END frame lane as `Connection.data_received` calls it, counting the dispatch holds."""

    def __init__(self, b: Broker) -> None:
        self.b = b
        self.holds = 0
        self.ctx = EndTransactionProcessor(b).frame_context()

    def _hold(self) -> None:
        self.holds += 1

    def __call__(self, data: bytes, at: int = 0, buffered: bytearray | None = None) -> int | None:
        return END_FRAME(data, at, (self.ctx, self._hold, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE,
                                    bytearray() if buffered is None else buffered))


def _end_frame(offsets: tuple[int, int], commit: bool = True, oneway: bool = True, **over: object) -> bytes:
    """The END our TransactionProducer sends (`_end_at`), header fields replaced (None: left out)."""
    header: dict[str, object] = {
        "topic": "Tx", "producerGroup": "g", "tranStateTableOffset": offsets[1], "commitLogOffset": offsets[0],
        "commitOrRollback": codec.TRANSACTION_COMMIT_TYPE if commit else codec.TRANSACTION_ROLLBACK_TYPE,
        "fromTransactionCheck": "false", "msgId": "AC11", "transactionId": "AC11"}
    header.update(over)
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {k: v for k, v in header.items() if v is not None},
                                   oneway=oneway).encode()


def _served_python(b: Broker, frame: bytes) -> None:
    """What the server does with a decoded END: `process_now`, or `process` on a thread when it would wait."""
    cmd = FrameDecoder().feed(frame)[0]
    if b.process_now(cmd, Host()) is None:
        b.process(cmd, Host())


def _files(b: Broker) -> dict[str, bytes]:
    """The bytes of every commitlog, consume-queue and index file (index files by their order: they are named
    by the wall clock; the checkpoint holds wall-clock times)."""
    b.store.reput_message_service.wait_for()
    cfg = b.store.config
    out = {}
    for d in (cfg.commit_log_path, cfg.consume_queue_path, cfg.index_path):
        for i, f in enumerate(sorted(p for p in Path(d).rglob("*") if p.is_file())):
            out[f"index #{i}" if d == cfg.index_path else str(f.relative_to(cfg.store_path_root_dir))] = f.read_bytes()
    return out


def _unchanged(b: Broker) -> tuple:
    return b.store.get_max_phy_offset(), list(b.transaction_service._recent.items())


FRAME_HALVES = [  # (properties sent, topic, commit?, header fields replaced, served by the C lane?)
    ("UNIQ_KEY\x01F0{i}\x02TRAN_MSG\x01true\x02PGROUP\x01g\x02TAGS\x01t\x02", "Tx", True, {}, True),
    ("UNIQ_KEY\x01F1{i}\x02TRAN_MSG\x01true\x02PGROUP\x01g\x02TAGS\x01t\x02", "Tx", False, {}, True),
    ("KEYS\x01k1 k2\x02UNIQ_KEY\x01F2{i}\x02PGROUP\x01g\x02", "Other", True, {}, True),
    ("UNIQ_KEY\x01F3{i}\x02PGROUP\x01g\x02TRANSACTION_CHECK_TIMES\x013\x02", "Tx", True, {}, True),
    ("UNIQ_KEY\x01F4{i}\x02PGROUP\x01g\x02TRAN_PREPARED_QUEUE_OFFSET\x019\x02CLUSTER\x01c", "Tx", True, {}, True),
    ("UNIQ_KEY\x01F5 id:{i}\x02PGROUP\x01g\x02", "Tx", True, {"tranStateTableOffset": None}, True),
    ("UNIQ_KEY\x01F6{i}\x02PGROUP\x01g\x02", "Tx", False, {"tranStateTableOffset": ""}, True),
    ("UNIQ_KEY\x01F7{i}\x02PGROUP\x01g\x02", "Tx", True, {"topic": None, "msgId": None, "transactionId": None,
                                                          "fromTransactionCheck": "TRUE"}, True),
    ("UNIQ_KEY\x01F8{i}\x02PGROUP\x01g\x02a\x01\x02\x01b\x02", "Tx", True, {"commitOrRollback": "08"}, True),
    # what the lane leaves to the Python path (its refusals and log lines, its other paths)
    ("UNIQ_KEY\x01D0{i}\x02PGROUP\x01g\x02KEYS\x01caf\xe9\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01D1{i}\x02PGROUP\x01g\x02STREAM_ID\x01s-{i}\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01D2{i}\x02PGROUP\x01g\x02UNIQ_KEY\x01D2b{i}\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01\x02PGROUP\x01g\x02", "Tx", True, {}, False),
    ("PGROUP\x01g\x02TAGS\x01t\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01D5{i}\x02PGROUP\x01g\x02PGROUP\x01g\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01D6{i}\x02PGROUP\x01h\x02", "Tx", True, {}, False),
    ("UNIQ_KEY\x01D7{i}\x02PGROUP\x01\x02", "Tx", True, {"producerGroup": ""}, False),
    ("UNIQ_KEY\x01D8{i}\x02PGROUP\x01g\x02", "Tx", True, {"tranStateTableOffset": 10**6}, False),
    ("UNIQ_KEY\x01DA{i}\x02PGROUP\x01g\x02", "Tx", True, {"commitOrRollback": " 8"}, False),
    ("UNIQ_KEY\x01DB{i}\x02PGROUP\x01g\x02", "Tx", True, {"commitOrRollback": 0}, False),
    ("UNIQ_KEY\x01DC{i}\x02PGROUP\x01g\x02", "Tx", True, {"producerGroup": None}, False),
    ("UNIQ_KEY\x01DD{i}\x02PGROUP\x01g\x02", "Tx", True, {"oneway": False}, False),
    ("UNIQ_KEY\x01DE{i}\x02PGROUP\x01g\x02", "Tx", True, {"commitLogOffset": "+0"}, False),
]


def _prepare_on(b: Broker, props: str, topic: str, qid: int, **fields: object) -> tuple[int, int]:
    msg = Message(topic, b"body-" + props.encode()[:8], queue_id=qid, flag=3, born_timestamp=1700000000123,
                  born_host="10.20.30.40:6543", reconsume_times=2, **fields)  # type: ignore[arg-type]
    msg.properties_string = props
    msg.sys_flag = codec.TRANSACTION_PREPARED_TYPE | 0x2  # and MULTI_TAGS, kept
    b.transaction_service.prepare(msg)
    r = b.store.put_message(msg)
    assert r.is_ok(), r.status
    return r.append_result.wrote_offset, r.append_result.logics_offset


@pytest.mark.parametrize("clock", ["fake", "real"])
def test_end_frames_store_what_process_stores_byte_for_byte(twins: tuple[Broker, Broker], clock: str,
                                                            request: pytest.FixtureRequest,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin brokers given the same halves, one ending them from the frame in C (`end_frame`, what the server calls
    first), the other through `process_now` (the reference): with the store clock stopped (puts then take the
    Python put) every commitlog, consume-queue and index file is the same byte for byte; with the real clock (the
    native put) the same records but for their times. The lane serves exactly the usual ends, with one dispatch
    hold; what it declines changes nothing and is then the Python path's."""
    if clock == "fake":  # the store's clock, and the born time the encoder gives a message without one
        request.getfixturevalue("fake_clock")
        monkeypatch.setattr(codec, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.5))
    c, py = twins
    lane = Lane(c)
    for i in range(3):
        for k, (props, topic, commit, over, served) in enumerate(FRAME_HALVES):
            text = props.format(i=i)
            over = dict(over)
            oneway = bool(over.pop("oneway", True))
            offsets = [_prepare_on(b, text, topic, (i + k) & 3) for b in (c, py)]
            assert offsets[0] == offsets[1]
            if "STREAM_ID" in text:
                for b in (c, py):
                    b.stream_versions.reserve(topic, f"s-{i}", f"D1{i}", 1)
            frame = _end_frame(offsets[0], commit, oneway, **over)
            for b in (c, py):
                b.store.reput_message_service.wait_for(b.store.get_max_phy_offset(), 5.0)
            before, holds = _unchanged(c), lane.holds
            got = lane(frame)
            if served:
                assert got == len(frame), (k, text)
                assert lane.holds == holds + 1
            else:
                assert got is None, (k, text)
                assert _unchanged(c) == before and lane.holds == holds
                _served_python(c, frame)
            _served_python(py, frame)
            assert _state(c) == _state(py), (k, text)
            # a late, crossing end: after an end the lane declines it (remembered) and nothing changes; after a
            # refusal it is the transaction's first end
            crossing = _end_frame(offsets[0], not commit)
            got = lane(crossing)
            assert got is None or (got == len(crossing) and not served)
            if got is None:
                _served_python(c, crossing)
            _served_python(py, crossing)
            assert _state(c) == _state(py)
    assert _stored(c) == _stored(py)
    assert _state(c) == _state(py)
    if clock == "fake":
        assert _files(c) == _files(py)
    commits = [r for r in _stored(c) if len(r) > 3 and r[0] in ("Tx", "Other")]
    assert len(commits) >= 3 * sum(commit and served for _, _, commit, _, served in FRAME_HALVES)


def _raw_frame(header: str, body: bytes = b"", kind: int = 0) -> bytes:
    """A frame around a header text as given (JSON serialize type unless `kind`)."""
    h = header.encode()
    return (4 + len(h) + len(body)).to_bytes(4, "big") + ((kind << 24) | len(h)).to_bytes(4, "big") + h + body


def _header_text(offsets: tuple[int, int], ext: str | None = None, head: str = "", tail: str = "",
                 flag: int = 2) -> str:
    ext = ext if ext is not None else (f'"producerGroup":"g","tranStateTableOffset":"{offsets[1]}",'
                                       f'"commitLogOffset":"{offsets[0]}","commitOrRollback":"8"')
    return f'{{"code":37,{head}"language":"PYTHON","version":1,"opaque":7,"flag":{flag},"extFields":{{{ext}}}{tail}}}'


def _spaced(header: str) -> str:
    """White space around every separator after the leading `{"code":37,`."""
    i = header.index(",") + 1
    return header[:i] + header[i:].replace(",", " ,\n ").replace(":", " : ").replace("}", " }")


HEADER_VARIANTS = [  # served: (name, header text of the END of a half at offsets o)
    ("ours", lambda o: _header_text(o)),
    ("remark with escapes, extra fields", lambda o: _header_text(
        o, head='"remark":"boom: \\"x\\" \\u00e9\\n",', tail=',"serializeTypeCurrentRPC":"JSON","n":null,"t":true,"i":-3')),
    ("white space after the code", lambda o: _spaced(_header_text(o))),
    ("keys in another order", lambda o: (f'{{"code":37,"extFields":{{"commitOrRollback":"8","commitLogOffset":"{o[0]}",'
                                         f'"producerGroup":"g"}},"flag":2}}')),
    ("a repeated key: the last", lambda o: _header_text(o, ext=(
        f'"commitOrRollback":"12","producerGroup":"x","commitLogOffset":"{o[0]}","commitOrRollback":"8",'
        f'"producerGroup":"g","tranStateTableOffset":"{o[1]}","other":"\\u0041"'))),
    ("two extFields: the last", lambda o: _header_text(o, head='"extFields":{"commitOrRollback":"12"},')),
    ("other bits of the flag", lambda o: _header_text(o, flag=2 | 4)),
]


@pytest.mark.parametrize("make", [m for _, m in HEADER_VARIANTS], ids=[n for n, _ in HEADER_VARIANTS])
def test_end_frames_of_any_plain_header_are_served_as_the_decoder_reads_them(twins: tuple[Broker, Broker],
                                                                           make: object) -> None:
    c, py = twins
    lane = Lane(c)
    for i in range(2):
        offsets = [_prepare_on(b, f"UNIQ_KEY\x01H{i}\x02PGROUP\x01g\x02", "Tx", i) for b in (c, py)]
        frame = _raw_frame(make(offsets[0]))  # type: ignore[operator]
        cmd = FrameDecoder().feed(frame)[0]  # what the server would decode: an END the C decoder takes
        assert cmd.code == RequestCode.END_TRANSACTION and cmd.is_oneway
        assert lane(frame) == len(frame)
        _served_python(py, frame)
        assert _state(c) == _state(py)
    assert _stored(c) == _stored(py)


def test_end_frames_it_does_not_take_are_left_to_the_decoder(twins: tuple[Broker, Broker]) -> None:
    c, _ = twins
    lane = Lane(c)
    o = _prepare_on(c, "UNIQ_KEY\x01N0\x02PGROUP\x01g\x02", "Tx", 0)
    c.store.reput_message_service.wait_for()
    ours = _raw_frame(_header_text(o))
    frames = {
        "two-way": _raw_frame(_header_text(o, flag=0)),
        "a response": _raw_frame(_header_text(o, flag=3)),
        "another request": _send_frame(),
        "binary header": _raw_frame(_header_text(o), kind=1),
        "cut short": ours[:-1],
        "header length past the frame": ours[:4] + (len(ours)).to_bytes(4, "big") + ours[8:],
        "an escaped group": _raw_frame(_header_text(o).replace('"producerGroup":"g"', '"producerGroup":"\\u0067"')),
        "an escaped kind": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":"\\u0038"')),
        "an escaped key": _raw_frame(_header_text(o).replace('"producerGroup"', '"producer\\u0047roup"')),
        "a number for a string": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":8')),
        "a float": _raw_frame(_header_text(o, tail=',"x":1.5')),
        "a nested value": _raw_frame(_header_text(o, tail=',"x":[1]')),
        "no code": _raw_frame(_header_text(o).replace('"code":37,', "")),
        "the code not first": _raw_frame(_header_text(o).replace('"code":37,', "").replace('"flag":2', '"flag":2,"code":37')),
        "white space in the code": _raw_frame(_header_text(o).replace('"code":37', '"code" : 37')),
        "white space before the code": _raw_frame(" " + _header_text(o)),
        "kind 0": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":"0"')),
        "kind 4": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":"4"')),
        "kind empty": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":""')),
        "kind +8": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":"+8"')),
        "kind 8.0": _raw_frame(_header_text(o).replace('"commitOrRollback":"8"', '"commitOrRollback":"8.0"')),
        "no kind": _raw_frame(_header_text(o).replace(',"commitOrRollback":"8"', "")),
        "no group": _raw_frame(_header_text(o).replace('"producerGroup":"g",', "")),
        "another group": _raw_frame(_header_text(o).replace('"producerGroup":"g"', '"producerGroup":"h"')),
        "a wide group": _raw_frame(_header_text(o).replace('"producerGroup":"g"', '"producerGroup":"g\u00e9"')),
        "no offset": _raw_frame(_header_text(o).replace(f'"commitLogOffset":"{o[0]}",', "")),
        "a negative offset": _raw_frame(_header_text(o).replace(f'"commitLogOffset":"{o[0]}"', '"commitLogOffset":"-1"')),
        "inside the record": _raw_frame(_header_text(o).replace(f'"commitLogOffset":"{o[0]}"',
                                                               f'"commitLogOffset":"{o[0] + 1}"')),
        "past the log": _raw_frame(_header_text(o).replace(f'"commitLogOffset":"{o[0]}"',
                                                          f'"commitLogOffset":"{c.store.get_max_phy_offset()}"')),
        "another queue offset": _raw_frame(_header_text(o).replace(f'"tranStateTableOffset":"{o[1]}"',
                                                                  f'"tranStateTableOffset":"{o[1] + 1}"')),
        "a queue offset with a sign": _raw_frame(_header_text(o).replace(f'"tranStateTableOffset":"{o[1]}"',
                                                                        f'"tranStateTableOffset":"+{o[1]}"')),
        "trailing bytes in the header": _raw_frame(_header_text(o) + " x"),
    }
    before = _unchanged(c)
    for name, frame in frames.items():
        assert lane(frame) is None, name
        assert lane.holds == 0 and _unchanged(c) == before, name
    assert lane(ours, buffered=bytearray(b"\0")) is None  # the decoder holds part of a frame: its read
    small = (lane.ctx, lane._hold, len(ours) - 5, DEFAULT_MAX_HEADER_SIZE, bytearray())
    assert END_FRAME(ours, 0, small) is None  # past the decoder's frame limit
    assert END_FRAME(ours, 0, (lane.ctx, lane._hold, DEFAULT_MAX_FRAME_SIZE, 10, bytearray())) is None
    assert END_FRAME(b"x" + ours, 0, (lane.ctx, lane._hold, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE,
                                      bytearray())) is None
    assert _unchanged(c) == before
    assert lane(b"x" + ours, 1) == 1 + len(ours)  # at a position: the one it takes
    with pytest.raises(TypeError):
        END_FRAME(ours, 0, (lane.ctx[:-1], lane._hold, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE, bytearray()))


def _send_frame() -> bytes:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g", "b": "Tx", "e": 0, "i": ""},
                                   b"x").encode()


def test_end_frames_at_the_head_of_a_read(twins: tuple[Broker, Broker]) -> None:
    """A transaction producer's END is often read together with its next request: each END at the head is served
    at its position, and the lane stops at the first frame that is not one (or not whole)."""
    c, py = twins
    lane = Lane(c)
    o1, o2 = (_prepare_on(c, f"UNIQ_KEY\x01R{i}\x02PGROUP\x01g\x02", "Tx", i) for i in range(2))
    for i in range(2):
        _prepare_on(py, f"UNIQ_KEY\x01R{i}\x02PGROUP\x01g\x02", "Tx", i)
    c.store.reput_message_service.wait_for()
    e1, e2, send = _end_frame(o1), _end_frame(o2, commit=False), _send_frame()
    data = e1 + e2 + send + e1
    assert lane(data, 0) == len(e1)
    assert lane(data, len(e1)) == len(e1) + len(e2)
    assert lane(data, len(e1) + len(e2)) is None
    assert lane(e1 + e2[:-3], len(e1)) is None  # cut short
    for frame in (e1, e2):
        _served_python(py, frame)
    assert _state(c) == _state(py)
    assert _stored(c) == _stored(py)


def test_what_the_service_state_leaves_to_the_python_path(twins: tuple[Broker, Broker],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    c, py = twins
    lane = Lane(c)

    def half(tag: str) -> bytes:
        offsets = [_prepare_on(b, f"UNIQ_KEY\x01{tag}\x02PGROUP\x01g\x02", "Tx", 1) for b in (c, py)]
        for b in (c, py):
            b.store.reput_message_service.wait_for()
        return _end_frame(offsets[0])

    def declined_then_python(frame: bytes) -> None:
        before = _unchanged(c)
        assert lane(frame) is None
        assert _unchanged(c) == before and lane.holds == 0
        for b in (c, py):
            _served_python(b, frame)
        assert _state(c) == _state(py)

    service = c.transaction_service
    frame = half("S0")
    with service._lock:  # the lock busy: the END waits on a thread (Python's)
        assert lane(frame) is None
    monkeypatch.setattr(service, "_boot_offset", 10**15)  # the dispatcher behind the records before the start
    assert lane(frame) is None
    monkeypatch.undo()
    assert lane.holds == 0 and lane(frame) == len(frame) and lane.holds == 1  # now free to end it
    lane.holds = 0
    _served_python(py, frame)
    declined_then_python(frame)  # the end remembered
    frame = half("S1")
    assert lane(frame) == len(frame)
    lane.holds = 0
    _served_python(py, frame)
    for b in (c, py):  # forgotten (a restart): the index knows the op message, the Python path looks it up
        b.store.reput_message_service.wait_for()
        b.transaction_service._recent.clear()
    declined_then_python(_end_frame_like(frame, commit=False))
    frame = half("S2")
    real_service = c.transaction_service
    c.transaction_service = type("Other", (tx_service.TransactionalMessageService,), {})(c)  # not the stock class
    assert lane(frame) is None and lane.holds == 0
    c.transaction_service = real_service
    assert lane(frame) == len(frame)
    _served_python(py, frame)
    assert _state(c) == _state(py)
    assert _stored(c) == _stored(py)


def _end_frame_like(frame: bytes, commit: bool) -> bytes:
    ext = FrameDecoder().feed(frame)[0].ext_fields
    return _end_frame((int(ext["commitLogOffset"]), int(ext["tranStateTableOffset"])), commit)


def test_a_half_in_an_older_file_or_a_store_shut_down_is_left_to_python(twins: tuple[Broker, Broker]) -> None:
    c, py = twins
    lane = Lane(c)
    offsets = [_prepare_on(b, "UNIQ_KEY\x01OLD\x02PGROUP\x01g\x02", "Tx", 2) for b in (c, py)]
    for b in (c, py):  # the commitlog rolls (64 KiB files) before the end
        for j in range(40):
            assert b.store.put_message(Message("Other", b"f" * 2000, properties_string=f"UNIQ_KEY\x01F{j}\x02",
                                                born_timestamp=1700000000123, born_host="10.0.0.1:1")).is_ok()
        b.store.reput_message_service.wait_for()
    assert len(c.store.commit_log.mapped_file_queue.mapped_files) > 1
    frame = _end_frame(offsets[0])
    assert lane(frame) is None and lane.holds == 0
    for b in (c, py):
        _served_python(b, frame)
    assert _state(c) == _state(py) and _stored(c) == _stored(py)
    o = _prepare_on(c, "UNIQ_KEY\x01DOWN\x02PGROUP\x01g\x02", "Tx", 2)
    c.store.shutdown()
    assert lane(_end_frame(o)) is None


def _put_half(b: Broker, props: str) -> tuple[int, int]:
    """A half message stored as it is (no `prepare`): whatever REAL_* properties the text holds."""
    r = b.store.put_message(Message(RMQ_SYS_TRANS_HALF_TOPIC, b"as is", flag=1, born_timestamp=1700000000123,
                                    born_host="10.0.0.1:1", properties_string=props))
    assert r.is_ok()
    return r.append_result.wrote_offset, r.append_result.logics_offset


_FRESH = itertools.count()
HALF_PIECES = st.sampled_from([  # pieces an END served in C may meet
    "TRANSACTION_CHECK_TIMES\x011\x02", "__CRC32#\x01123\x02", "TRAN_PREPARED_QUEUE_OFFSET\x014\x02", "KEYS\x01a b\x02",
    "TAGS\x01t\x02", "\x02", "\x01", "x\x01y", "__transactionId__\x01T9\x02", "REAL_QID\x011\x02", "UNIQ_KEYX\x01z\x02",
    "PGROUPS\x01q\x02", "\x01REAL_TOPIC\x01", "REAL_QIDS\x01w\x02", "STREAM_IDX\x01s\x02",
])
ODD_PIECES = st.sampled_from([  # ... and pieces that leave it to Python (or change what the commit holds)
    "UNIQ_KEY\x01U2\x02", "UNIQ_KEY\x01\x02", "PGROUP\x01g\x02", "PGROUP\x01h\x02", "PGROUP\x01", "REAL_TOPIC\x01Tx\x02",
    "REAL_TOPIC\x01Other\x02", "REAL_TOPIC\x01\x02", "REAL_QID\x01x\x02", "REAL_QID\x0112345678901\x02", "STREAM_ID\x01\x02",
    "STREAM_ID\x01s\x02", "caf\xe9\x01v\x02", "UNIQ_KEY\x01U1\x01more\x02",
])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(usual=st.permutations(["UNIQ_KEY\x01U1\x02", "PGROUP\x01g\x02", "REAL_TOPIC\x01Tx\x02", "REAL_QID\x013\x02"]),
       parts=st.lists(HALF_PIECES, max_size=5), odd=st.lists(ODD_PIECES, max_size=1),
       at=st.lists(st.integers(0, 10), max_size=6),
       commit=st.booleans())
def test_any_half_properties_are_ended_as_python_ends_them_or_declined(twins: tuple[Broker, Broker],
                                                                       usual: list[str], parts: list[str],
                                                                       odd: list[str], at: list[int],
                                                                       commit: bool) -> None:
    """The usual properties of a half in any order, with other pieces around them."""
    c, py = twins
    lane = Lane(c)
    for piece, i in zip(parts + odd, at, strict=False):
        usual.insert(min(i, len(usual)), piece)
    n = next(_FRESH)
    props = "".join(usual).replace("U1", f"U1-{n}").replace("U2", f"U2-{n}")  # fresh transaction ids
    offsets = [_put_half(b, props) for b in (c, py)]
    for b in (c, py):
        b.store.reput_message_service.wait_for()
    frame = _end_frame(offsets[0], commit)
    before = _unchanged(c)
    got = lane(frame)
    event("served in C" if got is not None else "declined")
    if got is None:
        assert _unchanged(c) == before
        _served_python(c, frame)
    else:
        assert got == len(frame)
    _served_python(py, frame)
    assert _state(c) == _state(py)
    assert _stored(c) == _stored(py)


def test_failed_puts_end_as_python_ends_them(twins: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    c, py = twins
    lane = Lane(c)
    offsets = [_prepare_on(b, "UNIQ_KEY\x01P0\x02PGROUP\x01g\x02", "Tx", 0) for b in (c, py)]
    for b in (c, py):  # the commit refused (disk full): nothing written, nothing remembered
        b.store.reput_message_service.wait_for()
        b.store.running_flags.get_and_make_disk_full("test")
    frame = _end_frame(offsets[0])
    assert lane(frame) == len(frame)
    _served_python(py, frame)
    assert _state(c) == _state(py) and not c.transaction_service._recent
    for b in (c, py):
        b.store.running_flags.get_and_make_disk_ok()
    real = {b: b.store.put_message for b in (c, py)}

    def refusing_ops(b: Broker) -> object:
        def put(msg: Message) -> object:
            if msg.topic == RMQ_SYS_TRANS_OP_HALF_TOPIC:
                b.store.running_flags.get_and_make_disk_full("test")
                try:
                    return real[b](msg)
                finally:
                    b.store.running_flags.get_and_make_disk_ok()
            return real[b](msg)
        return put

    for b in (c, py):  # the op message refused: the commit stays, remembered without its op message, a warning
        monkeypatch.setattr(b.store, "put_message", refusing_ops(b))
    caplog.clear()
    assert lane(frame) == len(frame)
    _served_python(py, frame)
    warnings = [r.getMessage() for r in caplog.records if "op message for transaction" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0] == warnings[1]
    assert c.transaction_service._recent["P0"] == (tx_service.COMMIT, False)
    assert _state(c) == _state(py)
    monkeypatch.undo()
    assert _stored(c) == _stored(py)

    def boom(msg: Message) -> object:
        raise RuntimeError("boom")

    o = _prepare_on(c, "UNIQ_KEY\x01P1\x02PGROUP\x01g\x02", "Tx", 0)
    c.store.reput_message_service.wait_for()
    monkeypatch.setattr(c.store, "put_message", boom)
    with pytest.raises(RuntimeError, match="boom"):
        lane(_end_frame(o))
    assert c.transaction_service._lock.acquire(blocking=False)  # released on the way out
    c.transaction_service._lock.release()


def test_the_recent_ends_are_bounded_as_python_bounds_them(twins: tuple[Broker, Broker],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    c, py = twins
    lane = Lane(c)
    monkeypatch.setattr(tx_service, "RECENT_ENDS", 3)
    for i in range(6):
        offsets = [_prepare_on(b, f"UNIQ_KEY\x01B{i}\x02PGROUP\x01g\x02", "Tx", i & 3) for b in (c, py)]
        for b in (c, py):
            b.store.reput_message_service.wait_for()
        frame = _end_frame(offsets[0], commit=bool(i & 1))
        assert lane(frame) == len(frame)
        _served_python(py, frame)
        assert list(c.transaction_service._recent.items()) == list(py.transaction_service._recent.items())
    assert len(c.transaction_service._recent) == 3


def test_a_served_broker_ends_a_transaction_producers_halves_from_their_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rmq_eventstore.broker import server as server_module
    from rmq_eventstore.client import PullConsumer, TransactionProducer, TransactionState

    served: list[int] = []

    def counted(data: bytes, at: int, args: tuple) -> int | None:
        got = END_FRAME(data, at, args)
        if got is not None:
            served.append(got - at)
        return got

    monkeypatch.setattr(server_module, "END_FRAME", counted if server_module.END_FRAME is not None else None)
    with server_module.serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic("Tx", 4, 4)
        with TransactionProducer(running.namesrv_address, "g", lambda half: TransactionState.COMMIT) as tp:
            for i in range(30):  # each END one-way, read with the next half or alone
                sent = tp.prepare(Message("Tx", b"m%d" % i, keys=[f"k{i}"]))
                tp.end_transaction(sent, TransactionState.ROLLBACK if i % 3 == 0 else TransactionState.COMMIT)
            tp.send_in_transaction(Message("Tx", b"last"), lambda m: TransactionState.COMMIT)
        bodies: list[bytes] = []
        with PullConsumer(running.namesrv_address, "end-frame-reader") as consumer:
            for _ in range(100):
                bodies = sorted(bytes(m.body) for q in range(4) for m in consumer.pull("Tx", q, 0, 64, 0).messages)
                if len(bodies) == 21:
                    break
                time.sleep(0.05)
        assert bodies == sorted([b"m%d" % i for i in range(30) if i % 3] + [b"last"])
        recent = running.broker.transaction_service._recent
        assert len(recent) == 31 and all(op for _, op in recent.values())
    if server_module.END_FRAME is not None:
        assert len(served) == 31


def test_an_end_the_lane_fails_on_split_across_reads_is_left_to_the_decoder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When `end_frame` raises (its one-time set-up failing) on an END that the read holds only in part, the
    server leaves the bytes to the decoder rather than skipping past the read by the frame's length: the END is
    served when its rest arrives, and the requests after it are read in step."""
    import socket

    from rmq_eventstore.broker import server as server_module

    raised: list[int] = []

    def failing(data: bytes, at: int, args: tuple) -> int | None:
        if data[at + 8:at + 19] == b'{"code":37,':
            raised.append(at)
            raise RuntimeError("set-up failed")
        return END_FRAME(data, at, args) if END_FRAME is not None else None

    monkeypatch.setattr(server_module, "END_FRAME", failing)
    with server_module.serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        b = running.broker
        if running.server._end_frame is None:
            pytest.skip("ENDs are served from their bytes only with the native core")
        b.create_topic("Tx", 1, 1)
        offsets = _prepare_on(b, "UNIQ_KEY\x01S0\x02PGROUP\x01g\x02", "Tx", 0)
        end = _end_frame(offsets)
        probe = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "Tx", "queueId": 0})
        host, port = running.broker_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(end[:30])
            deadline = time.monotonic() + 5
            while not raised and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # the loop has read the part
            s.sendall(end[30:] + probe.encode())
            dec, got = FrameDecoder(), []
            while not got:
                data = s.recv(1 << 16)
                assert data, "the broker closed the connection"
                got = dec.feed(data)
        assert raised == [0]
        assert got[0].opaque == probe.opaque and got[0].code == ResponseCode.SUCCESS
        deadline = time.monotonic() + 5
        while not b.transaction_service._recent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(b.transaction_service._recent) == 1  # the END, decoded, was served by the Python path
