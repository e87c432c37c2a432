"""The ACK lane (`_native.ack_frame` / `ack_body`, `AckMessageProcessor.lane`, `PopBufferMergeService.ack_runs`)
against the general path (`AckMessageProcessor.process`), the reference:

* the C readers: a BATCH_ACK body gives the entries `BatchAck.from_dict` reads from `loads_text`'s document, or
  None (hypothesis over generated bodies, hand-made edge cases); a frame gives the fields of the command the frame
  decoder makes and the bytes of its SUCCESS response, or None;
* two brokers given the same checkpoints and messages, one serving each request by the lane (the general path
  only when the lane declines), the other by `process`: the same response bytes, journal bytes, buffer state,
  consume offsets and revive records, request after request, and the lane declines with nothing changed
  wherever the reference would write a record or answer anything but SUCCESS;
* a served broker: the lane answers a waiting consumer's ACK and BATCH_ACK frames and a pipelined BATCH_ACK.

The lane is the native core's (not in the Makefile's RMQ_EVENTSTORE_PURE pass: without it acks take `process`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.processor.pop import ACK_BODY, ACK_FRAME
from rmq_eventstore.common import Message
from rmq_eventstore.common.pop import REVIVE_QUEUE_NUM, BatchAck, ExtraInfo, PopCheckPoint, pop_retry_topic
from rmq_eventstore.remoting import FrameDecoder, RemotingCommand, RequestCode, loads_text
from rmq_eventstore.store import MessageStore

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
MAX_FRAME, MAX_HEADER = 16 << 20, 1 << 20
G, T = "g", "jobs"
RETRY = pop_retry_topic(G, T)
PT = 1_700_000_000_000


# -- the body reader ---------------------------------------------------------------------------------------------
def reference_entries(body: bytes) -> list[BatchAck] | None:
    """What `AckMessageProcessor._batch_ack` reads from a body; None when it answers an error or NO_MESSAGE."""
    try:
        doc = loads_text(body.decode() if body else "{}")
        acks = [BatchAck.from_dict(a) for a in doc.get("acks") or []]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return acks or None


def check_body(body: bytes) -> Any:
    got = ACK_BODY(body)
    if got is not None:
        ref = reference_entries(body)
        assert ref is not None, body
        assert got == [(a.group, a.topic, a.retry, a.start_offset, a.queue_id, a.revive_qid, a.pop_time,
                        a.invisible_time, a.bits[0], len(a.bits)) for a in ref], body
        assert all(a.bits == list(range(a.bits[0], a.bits[0] + len(a.bits))) for a in ref)
    return got


def entry(**kw: Any) -> dict:
    d = {"c": G, "t": T, "r": "0", "so": 5, "q": 1, "rq": 3, "pt": PT, "it": 60000, "b": [0, 1, 2]}
    d.update(kw)
    return {k: v for k, v in d.items() if v is not ...}


TAKEN = [
    {"acks": [entry()]},
    {"acks": [entry(r="1"), entry(q=0, b=[7])]},
    {"acks": [entry(r=...)], "other": 1},
    {"acks": [entry(it=...)]},
    {"acks": [entry(extra="x", n=None, f=True, z=-4)]},
    {"acks": [entry(r="yes")]},
    {"acks": [entry(so=-3, b=[-1, 0])]},
    {"acks": [entry(b=list(range(100, 1124)))]},
    {"acks": [entry(pt=999999999999999999, so=0)]},
]
DECLINED = [
    {}, {"acks": []}, {"acks": None}, {"other": 1}, {"acks": [entry(b=[])]},
    {"acks": [entry(b=...)]},  # no bits: the reference skips the entry (nothing acked)
    {"acks": [entry(b=[0, 2])]}, {"acks": [entry(b=[1, 0])]}, {"acks": [entry(b=[0, 0])]},
    {"acks": [entry(b="Bw==")]}, {"acks": [entry(b=[0.0])]}, {"acks": [entry(b=[True])]},
    {"acks": [entry(c=...)]}, {"acks": [entry(t=5)]}, {"acks": [entry(c="gé")]}, {"acks": [entry(t="a\nb")]},
    {"acks": [entry(so="5")]}, {"acks": [entry(q=1.0)]}, {"acks": [entry(rq=True)]}, {"acks": [entry(pt=None)]},
    {"acks": [entry(r=1)]}, {"acks": [entry(r=True)]}, {"acks": [entry(extra=[1])]}, {"acks": [entry(extra={})]},
    {"acks": [entry(pt=10**19)]}, {"acks": [entry(), 5]}, {"acks": {"c": G}}, {"acks": [entry()], "x": {"y": 1}},
]


@pytest.mark.parametrize("doc", TAKEN)
def test_the_body_reader_takes_the_plain_shape(doc: dict) -> None:
    for text in (json.dumps(doc), json.dumps(doc, separators=(",", ":")), json.dumps(doc, indent=2),
                 " \n" + json.dumps(doc) + "\r\n\t"):
        assert check_body(text.encode()) is not None, text


@pytest.mark.parametrize("doc", DECLINED)
def test_the_body_reader_declines_the_rest(doc: dict) -> None:
    assert check_body(json.dumps(doc, ensure_ascii=False).encode()) is None


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b"null", b'{"acks":[' + json.dumps(entry()).encode() + b"]} x",
    b'{"acks":[' + json.dumps(entry()).encode() + b"]}}", b'{"acks":[' + json.dumps(entry()).encode() + b",]}",
    b'{"acks":[{"c":"g","c":"h","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',  # repeated key: json keeps the last
    b'{"acks":[{"\\u0063":"g","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[{"c":"\\u0067","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[{"c":"g","t":"jobs","so":01,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[{"c":"g","t":"jobs","so":1e3,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[],"acks":[{"c":"g","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[{"c":"g","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}],"acks":[]}',
    b'{"acks":[{"c":"g","t":"jobs","so":-0,"q":0,"rq":0,"pt":1,"b":[ 3 , 4 ]}]}',
    b'\xef\xbb\xbf{"acks":[{"c":"g","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',
    b'{"acks":[{"c":"g\xff","t":"jobs","so":1,"q":0,"rq":0,"pt":1,"b":[0]}]}',
])
def test_the_body_reader_on_hand_made_bodies(body: bytes) -> None:
    check_body(body)  # whatever it takes is what the reference reads


def test_what_our_client_writes_is_taken() -> None:
    body = ('{"acks":[' + BatchAck.json_head(G, RETRY, True, 5, 0, 7, PT, 60000) + "0,1,2,3]}" + ","
            + BatchAck.json_head(G, T, False, 9, 2, 1, PT + 1, 30000) + "4]}" + "]}").encode()
    assert check_body(body) == [(G, RETRY, True, 5, 0, 7, PT, 60000, 0, 4), (G, T, False, 9, 2, 1, PT + 1, 30000, 4, 1)]


_scalar = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=6), st.booleans(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False))
_bits = st.one_of(st.builds(lambda a, n: list(range(a, a + n)), st.integers(-5, 2**62), st.integers(0, 40)),
                  st.lists(st.integers(-3, 40), max_size=6), st.lists(_scalar, max_size=3), _scalar)
_entry = st.fixed_dictionaries(
    {}, optional={"c": st.one_of(st.text(max_size=8), _scalar), "t": st.one_of(st.text(max_size=8), _scalar),
                  "r": st.one_of(st.sampled_from(["0", "1", "", "10"]), _scalar), "so": _scalar, "q": _scalar,
                  "rq": _scalar, "pt": _scalar, "it": _scalar, "b": _bits, "x": _scalar})
_plain_entry = st.fixed_dictionaries(
    {"c": st.text("abcXYZ_-%09", min_size=1, max_size=8), "t": st.text("abc%RETRY_", min_size=1, max_size=8),
     "so": st.integers(-(10**17), 10**17), "q": st.integers(0, 2**31), "rq": st.integers(0, 7),
     "pt": st.integers(0, 10**15), "b": st.builds(lambda a, n: list(range(a, a + n)), st.integers(0, 1000),
                                                  st.integers(1, 64))},
    optional={"r": st.sampled_from(["0", "1"]), "it": st.integers(0, 10**9)})


_separators = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_entry, _plain_entry), max_size=3), _separators, st.booleans())
def test_the_body_reader_reads_what_the_reference_reads(acks: list, separators: tuple, ascii_only: bool) -> None:
    check_body(json.dumps({"acks": acks}, separators=separators, ensure_ascii=ascii_only).encode())


@settings(max_examples=200, deadline=None)
@given(st.lists(_plain_entry, min_size=1, max_size=3), _separators)
def test_the_body_reader_takes_every_plain_body(acks: list, separators: tuple) -> None:
    assert check_body(json.dumps({"acks": acks}, separators=separators).encode()) is not None


# the bit list's own text, as our clients write it (`0,1,...,31]`: the C reader's quick scan) and every near miss
# (white space, signs, leading zeros, 18 / 19 digits, floats, gaps, a trailing comma, a cut): the reader takes
# exactly what the reference reads as a run of consecutive ascending integers, with the same first bit and count
_bit_text = st.one_of(
    st.builds(lambda a, n: ",".join(map(str, range(a, a + n))), st.integers(0, 10**18 - 50), st.integers(1, 40)),
    st.builds(lambda a, n: ",".join(map(str, range(a, a + n))), st.integers(0, 40), st.integers(1, 40)),
    st.builds(lambda a, n: ",".join(map(str, range(a, a + n))), st.integers(10**18 - 40, 10**18 + 3),
              st.integers(1, 40)),  # across 18 -> 19 digits
    st.lists(st.sampled_from(["0", "1", "2", "3", "9", "10", "11", "00", "01", "-0", "-1", "1.0", "1e1", " 1", "1 ",
                              "999999999999999999", "1000000000000000000", "999999999999999998", ""]), max_size=5
             ).map(",".join))


@settings(max_examples=600, deadline=None)
@given(_bit_text, st.sampled_from(["", ",", " ", "]", ",]", "x"]), st.booleans())
def test_the_bit_list_scan_reads_what_the_reference_reads(bits: str, tail: str, cut: bool) -> None:
    head = BatchAck.json_head(G, T, False, 5, 1, 3, PT, 60000)
    text = bits + tail
    if cut and text:
        text = text[:len(text) // 2]
    body = ('{"acks":[' + head + text + "]}" + "]}").encode()
    got = check_body(body)
    ref = reference_entries(body)
    raw = loads_text(body.decode())["acks"][0]["b"] if ref is not None else None  # the list as written
    plain = bool(raw) and all(type(b) is int and -(10**18) < b < 10**18 for b in raw) and raw == list(
        range(raw[0], raw[0] + len(raw)))
    assert (got is not None) == plain, body


def test_the_bit_list_scan_on_our_client_s_batch() -> None:
    head = BatchAck.json_head(G, T, False, 5, 1, 3, PT, 60000)
    for first, n in ((0, 32), (7, 1), (10**18 - 33, 32), (99, 2)):
        bits = ",".join(map(str, range(first, first + n)))
        assert check_body(('{"acks":[' + head + bits + "]}]}").encode()) == [(G, T, False, 5, 1, 3, PT, 60000, first, n)]
    for bits in ("0,1,2,4", "0,1,1", "1,0", "01,2", "0,1,", "10000000000000000000", "1000000000000000000",
                 "999999999999999999,1000000000000000000", "1.0", ""):
        assert check_body(('{"acks":[' + head + bits + "]}]}").encode()) is None, bits
    for bits, first, n in (("0, 1", 0, 2), ("-1,0", -1, 2), (" 3 ,4", 3, 2), ("-0", 0, 1)):  # the general loop's
        assert check_body(('{"acks":[' + head + bits + "]}]}").encode()) == [(G, T, False, 5, 1, 3, PT, 60000, first, n)]


# -- the frame reader ----------------------------------------------------------------------------------------------
def ack_cmd(queue_id: Any = 1, offset: Any = 6, extra: str | None = None, **ext: Any) -> RemotingCommand:
    fields = {"consumerGroup": G, "topic": T, "queueId": queue_id,
              "extraInfo": extra if extra is not None else ExtraInfo(5, PT, 60000, 3, False, "b", 1, 6).build(),
              "offset": offset}
    fields.update(ext)
    return RemotingCommand.request(RequestCode.ACK_MESSAGE, {k: v for k, v in fields.items() if v is not None})


def batch_cmd(*entries: dict) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps({"acks": list(entries)}).encode())


def decoded(frame: bytes) -> RemotingCommand:
    cmds = FrameDecoder(MAX_FRAME).feed(frame)
    assert len(cmds) == 1
    return cmds[0]


def check_frame(frame: bytes) -> Any:
    got = ACK_FRAME(frame, MAX_FRAME, MAX_HEADER, bytearray())
    if got is None:
        return None
    cmd = decoded(frame)
    assert not cmd.flag & 3
    assert got[0] == cmd.response().encode()
    if cmd.code == RequestCode.BATCH_ACK_MESSAGE:
        assert len(got) == 2 and got[1] == ACK_BODY(cmd.body) and got[1] is not None
    else:
        assert cmd.code == RequestCode.ACK_MESSAGE
        x = cmd.ext_fields
        e = ExtraInfo.split(cmd.get_str("extraInfo"))
        assert got[1:] == (None, x["consumerGroup"], x["topic"], cmd.get_int("queueId"), cmd.get_int("offset"),
                           e.ck_queue_offset, e.pop_time, e.invisible_time, e.revive_qid, e.retry, e.broker_name,
                           e.queue_id, e.queue_offset)
    return got


@pytest.mark.parametrize("make", [
    lambda: ack_cmd(), lambda: ack_cmd(queue_id=-1, offset=0), lambda: ack_cmd(extra="5 1 2 3 1 broker-a 0 9"),
    lambda: ack_cmd(extra="5 1 2 3  b 0 9"), lambda: ack_cmd(extra="5 1 2 3 x  0 9"),
    lambda: ack_cmd(extra="-5 -1 -2 -3 0 b -0 9".replace("-0", "0")), lambda: ack_cmd(other="é"),
    lambda: batch_cmd(entry()), lambda: batch_cmd(entry(), entry(r="1", q=0)),
])
def test_the_frame_reader_takes_plain_requests(make: Callable[[], RemotingCommand]) -> None:
    cmd = make()
    for opaque, version in ((1, 435), (2**31 - 1, -1), (-(2**31), 0)):
        cmd.opaque, cmd.version = opaque, version
        assert check_frame(cmd.encode()) is not None


@pytest.mark.parametrize("make", [
    lambda: ack_cmd(queue_id=None), lambda: ack_cmd(offset=None), lambda: ack_cmd(consumerGroup=None),
    lambda: ack_cmd(topic=None), lambda: ack_cmd(extraInfo=None), lambda: ack_cmd(queue_id=""),
    lambda: ack_cmd(queue_id="+1"), lambda: ack_cmd(offset="06"), lambda: ack_cmd(offset=" 6"),
    lambda: ack_cmd(offset=10**18), lambda: ack_cmd(extra="5 1 2 3 0 b 1"), lambda: ack_cmd(extra="5 1 2 3 0 b 1 6 7"),
    lambda: ack_cmd(extra="5 1 2 x 0 b 1 6"), lambda: ack_cmd(extra="5 1 2 3 0 bé 1 6"), lambda: ack_cmd(topic="jo\nbs"),
    lambda: ack_cmd(consumerGroup="gé"), lambda: batch_cmd(), lambda: batch_cmd(entry(b=[0, 2])),
    lambda: RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, b""),
    lambda: RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {"topic": T}),
    lambda: RemotingCommand.request(RequestCode.POP_MESSAGE, {"topic": T}),
    lambda: RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": T}),
])
def test_the_frame_reader_declines_the_rest(make: Callable[[], RemotingCommand]) -> None:
    assert check_frame(make().encode()) is None


def test_the_frame_reader_declines_what_is_not_one_plain_request_frame() -> None:
    frame = ack_cmd().encode()
    assert check_frame(frame) is not None
    assert ACK_FRAME(frame, MAX_FRAME, MAX_HEADER, bytearray(b"x")) is None  # the decoder holds part of a frame
    assert ACK_FRAME(frame + frame, MAX_FRAME, MAX_HEADER, bytearray()) is None
    assert ACK_FRAME(frame[:-1], MAX_FRAME, MAX_HEADER, bytearray()) is None
    assert ACK_FRAME(frame, len(frame) - 5, MAX_HEADER, bytearray()) is None  # over the decoder's limits
    assert ACK_FRAME(frame, MAX_FRAME, 10, bytearray()) is None
    for flag in (1, 2, 3):
        cmd = ack_cmd()
        cmd.flag = flag
        assert check_frame(cmd.encode()) is None
    header = frame[8:]
    for variant in (header.replace(b'"language":"PYTHON"', b'"language":"PYTHON","x":[1]'),
                    header.replace(b'"language":"PYTHON"', b'"language":"PYTHON","x":1.5'),
                    header.replace(b'"flag":0', b'"flag":"0"'),
                    header.replace(b'"offset":"6"', b'"offset":6'),
                    header.replace(b'"offset":"6"', b'"offset":"\\u0036"'),
                    header.replace(b'"topic":"jobs"', b'"topic":"jo\\u0062s"'),
                    header.replace(b'"extFields":{', b'"extFields":{"\\u0078":"1",'),
                    header + b" x"):
        f = len(variant).to_bytes(4, "big")
        frame2 = (4 + len(variant)).to_bytes(4, "big") + f + variant
        assert check_frame(frame2) is None
    # taken: white space, another field, a repeated extFields object (the decoder keeps the last)
    for variant in (header.replace(b'"flag":0', b'"flag" : 0 , "y":null, "z":true'),
                    header.replace(b'"extFields":{', b'"extFields":{"topic":"zz"},"extFields":{'),
                    header.replace(b'"extFields":{', b'"extFields":{"offset":"99",')):
        frame2 = (4 + len(variant)).to_bytes(4, "big") + len(variant).to_bytes(4, "big") + variant
        assert check_frame(frame2) is not None


# -- the lane against the reference, over two brokers ---------------------------------------------------------------
def open_broker(root: Path) -> tuple[MessageStore, Broker]:
    store = MessageStore.open(root / "store", **SMALL)
    b = Broker(store)
    b.start()
    ps = b.pop_service
    ps._stop.set()  # no revive round: its flush and journal rewrites would come at any time
    if ps._thread is not None:
        ps._thread.join()
    b.topic_manager.ensure(T, 3)
    b.topic_manager.ensure(RETRY, 1)
    for q in (0, 1):
        store.put_messages([Message(T, f"{q}-{i}".encode(), tags="t", queue_id=q) for i in range(12)])
    store.put_messages([Message(RETRY, f"r{i}".encode(), tags="t", queue_id=0) for i in range(6)])
    store.wait_for_dispatch()
    return store, b


def seed(b: Broker) -> None:
    """The same checkpoints in both brokers' buffers (journal C lines)."""
    buf, name = b.pop_service.buffer, b.config.broker_name
    for topic, q, start, n, pt, diffs, nxt in ((T, 1, 5, 3, PT, [0, 1, 2], 8), (T, 1, 8, 2, PT + 1, [0, 1], 10),
                                               (T, 0, 0, 4, PT, [0, 1, 2, 3], 4), (T, 0, 4, 3, PT + 2, [0, 2, 5], 10),
                                               (RETRY, 0, 1, 3, PT, [0, 1, 2], 4), (T, 1, 10, 2, PT + 3, [0, 1], 12)):
        ck = PopCheckPoint(start, pt, 60000, n, q, topic, G, name, diffs)
        assert buf.add_ck(ck, 3, nxt)


def state(store: MessageStore, b: Broker) -> tuple:
    buf = b.pop_service.buffer
    with open(os.path.join(store.config.store_path_root_dir, "pop", "ckbuffer.journal"), "rb") as f:
        journal = f.read()
    offsets = {(t, q): b.offset_manager.file.query_offset(G, t, q) for t in (T, RETRY) for q in range(3)}
    store.wait_for_dispatch()
    records = []
    for qid in range(REVIVE_QUEUE_NUM):
        r = store.get_message("probe", b.pop_service.revive_topic, qid, 0, 64, None)
        records += [(qid, m.tags, bytes(m.body)) for m in (r.messages if r is not None else [])]
    return (journal, sorted((k, e.acked, e.stored) for k, e in buf._by_key.items()),
            sorted((k, [(e.next_offset, e.acked, e.stored) for e in q]) for k, q in buf._queues.items()),
            buf.settled, buf.stored, offsets, records)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[tuple[MessageStore, Broker], tuple[MessageStore, Broker]]]:
    a, b = open_broker(tmp_path / "lane"), open_broker(tmp_path / "ref")
    try:
        seed(a[1])
        seed(b[1])
        yield a, b
    finally:
        for store, broker in (a, b):
            broker.shutdown()
            store.shutdown()


def serve_lane(b: Broker, frame: bytes, from_body: bool) -> tuple[bytes, bool]:
    """What the server answers with the lane on: (response frame, whether the lane served it)."""
    acker = b._processors[RequestCode.ACK_MESSAGE]
    cmd = decoded(frame)
    got = (None, ACK_BODY(cmd.body)) if from_body else ACK_FRAME(frame, MAX_FRAME, MAX_HEADER, bytearray())
    if got is not None and (got[1] is not None or not from_body) and acker.lane(got):
        return (got[0] if not from_body else cmd.response().encode()), True
    return b.process(cmd, None).encode(), False


def serve_ref(b: Broker, frame: bytes) -> bytes:
    return b.process(decoded(frame), None).encode()


E = entry
CASES: list[tuple[str, list[tuple[RemotingCommand, bool]]]] = [
    # (name, [(request, the lane serves it)])
    ("batch, part then the rest (settles, offset moves)", [(batch_cmd(E(b=[0])), True), (batch_cmd(E(b=[1, 2])), True)]),
    ("batch, all of a pop at once", [(batch_cmd(E()), True), (batch_cmd(E(so=8, pt=PT + 1, b=[0, 1])), True)]),
    ("batch, a later pop first (no offset move until the first settles)",
     [(batch_cmd(E(so=8, pt=PT + 1, b=[0, 1])), True), (batch_cmd(E(b=[0, 1, 2])), True)]),
    ("batch, two entries of two queues", [(batch_cmd(E(), E(q=0, so=0, b=[0, 1, 2, 3])), True)]),
    ("batch, a pop with gaps (filtered messages)", [(batch_cmd(E(q=0, so=4, pt=PT + 2, b=[0])), True),
                                                    (batch_cmd(E(q=0, so=4, pt=PT + 2, b=[1, 2, 3, 4, 5])), True),
                                                    (batch_cmd(E(q=0, so=0, b=[0, 1, 2, 3])), True)]),
    ("batch, bits beyond the checkpoint's", [(batch_cmd(E(b=[2, 3])), True)]),
    ("batch, the retry topic by its popped name", [(batch_cmd(E(r="1", q=0, so=1, b=[0, 1, 2])), True)]),
    ("batch, the retry topic named", [(batch_cmd(E(t=RETRY, r="1", q=0, so=1, b=[0, 1])), True)]),
    ("batch, acked twice (the second not in the buffer: a record)", [(batch_cmd(E()), True), (batch_cmd(E()), False)]),
    ("batch, the same pop twice in one request", [(batch_cmd(E(b=[0]), E(b=[1, 2])), False)]),
    ("batch, an unknown checkpoint beside a known one", [(batch_cmd(E(), E(pt=PT + 9)), False)]),
    ("batch, an offset at the queue's end", [(batch_cmd(E(so=10, pt=PT + 3, b=[1, 2])), True)]),
    ("batch, offsets past the queue's end", [(batch_cmd(E(so=10, pt=PT + 3, b=[2, 3])), False)]),
    ("batch, a queue that does not exist", [(batch_cmd(E(q=2)), False), (batch_cmd(E(t="nope")), False)]),
    ("batch, not consecutive bits", [(batch_cmd(E(b=[0, 2])), False)]),
    ("ack, one message then the rest", [(ack_cmd(), True), (ack_cmd(offset=5), True), (ack_cmd(offset=7), True)]),
    ("ack, the extra info names the checkpoint", [
        (ack_cmd(offset=2, queue_id=0, extra=ExtraInfo(0, PT, 60000, 3, False, "b", 0, 2).build()), True)]),
    ("ack, refused or written by the reference", [
        (ack_cmd(queue_id=5), False), (ack_cmd(topic="nope"), False), (ack_cmd(offset=13), False),
        (ack_cmd(extra=ExtraInfo(5, PT + 7, 60000, 3, False, "b", 1, 6).build()), False),
        (ack_cmd(extra="5 1 2"), False)]),
]


@pytest.mark.parametrize("requests", [c[1] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("from_body", [False, True], ids=["frame", "decoded"])
def test_the_lane_does_what_the_reference_does(pair: Any, requests: list, from_body: bool) -> None:
    (sa, a), (sb, b) = pair
    assert state(sa, a) == state(sb, b)
    for cmd, served in requests:
        if from_body and cmd.code != RequestCode.BATCH_ACK_MESSAGE:
            served = False  # a decoded ACK_MESSAGE takes the general path
        frame = cmd.encode()
        got, lane = serve_lane(a, frame, from_body)
        assert got == serve_ref(b, frame)
        assert lane == served, (cmd, frame)
        assert state(sa, a) == state(sb, b)


def test_a_stored_checkpoint_is_the_reference_s(pair: Any) -> None:
    (sa, a), (sb, b) = pair
    for _store, broker in pair:
        broker.pop_service.buffer.flush_queue(G, T, 1)
    before = state(sa, a)
    assert before == state(sb, b) and before[-1]  # the checkpoints were written
    for cmd in (batch_cmd(E(b=[0])), ack_cmd(offset=9, extra=ExtraInfo(8, PT + 1, 60000, 3, False, "b", 1, 9).build())):
        frame = cmd.encode()
        got = ACK_FRAME(frame, MAX_FRAME, MAX_HEADER, bytearray())
        assert got is not None and not a._processors[RequestCode.ACK_MESSAGE].lane(got)
        assert state(sa, a) == before  # declined: nothing changed
        assert serve_ref(a, frame) == serve_ref(b, frame)
        before = state(sa, a)
        assert before == state(sb, b)


def test_the_lane_without_the_buffer_declines(tmp_path: Path) -> None:
    store, b = open_broker(tmp_path)
    try:
        b.pop_service.buffer.enabled = False
        assert b.pop_service.buffer.add_ck(PopCheckPoint(5, PT, 60000, 3, 1, T, G, "b", [0, 1, 2]), 3, 8)
        got = ACK_FRAME(batch_cmd(E()).encode(), MAX_FRAME, MAX_HEADER, bytearray())
        assert not b._processors[RequestCode.ACK_MESSAGE].lane(got)
    finally:
        b.shutdown()
        store.shutdown()


# -- a served broker ---------------------------------------------------------------------------------------------------
def test_a_served_broker_answers_acks_by_the_lane(tmp_path: Path) -> None:
    from rmq_eventstore.broker.server import serve_in_thread
    from rmq_eventstore.client import PopConsumer, Producer

    with serve_in_thread(tmp_path / "s", announce=False) as running:
        server = running.server
        assert server._ack_frame is ACK_FRAME and server._ack_body is ACK_BODY
        calls: list[bool] = []
        lane = server._ack_lane

        def counted(got: tuple) -> bool:
            calls.append(lane(got))
            return calls[-1]

        server._ack_lane = counted
        running.broker.topic_manager.ensure("Lane", 1)
        with Producer(running.namesrv_address, "p") as p:
            for i in range(40):
                p.send(Message("Lane", f"m{i}".encode()), queue_id=0)
        with PopConsumer(running.namesrv_address, "lg") as c:
            got = c.pop("Lane", max_nums=1, invisible_time=60_000)
            assert len(got) == 1
            c.ack(got[0])  # ACK_MESSAGE frame
            batch = c.pop("Lane", max_nums=8, invisible_time=60_000)
            c.ack_batch(batch)  # BATCH_ACK_MESSAGE frame
            assert calls == [True, True]
            batch = c.pop("Lane", max_nums=8, invisible_time=60_000)
            more = c.pop("Lane", max_nums=8, invisible_time=60_000, ack=batch)  # pipelined: decoded BATCH_ACK
            assert calls == [True, True, True] and len(more) == 8
            c.ack_batch(more)
            c.ack_batch(more)  # not in the buffer any more: the reference writes a record
            assert calls == [True, True, True, True, False]
        assert running.broker.offset_manager.file.query_offset("lg", "Lane", 0) == 25
        running.store.wait_for_dispatch()
        revive = running.broker.pop_service.revive_topic
        assert sum(running.store.get_max_offset_in_queue(revive, q) for q in range(REVIVE_QUEUE_NUM)) == 1  # the bAck
