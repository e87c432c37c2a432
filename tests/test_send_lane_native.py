"""The C lane of plain sends (`_native.send_lane`, through `SendMessageProcessor.serve_lane`, what the server
does inline) against the Python lane (`SendMessageProcessor.lane`, the reference): for a spread of requests
(queue ids, flags, properties with and without UNIQ_KEY or CLUSTER, narrow and wide characters, born hosts)
the same response frame bytes and the same stored records; for every request the Python lane leaves to the
full path or would read differently (non-canonical integers, a random queue), nothing stored and the Python
lane's answer; a refused put answered as the Python lane answers it. Real stores on real files."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.processor.send import NATIVE_FRAME_LANE, NATIVE_LANE
from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import Message, Producer
from rmq_eventstore.common import codec
from rmq_eventstore.common.rng import rng
from rmq_eventstore.common.topic_config import PermName
from rmq_eventstore.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_SIZE,
    FrameDecoder,
    RemotingCommand,
    ResponseCode,
)
from tests.conftest import SMALL_GEOMETRY
from tests.test_send_lane import DECLINED, PLAIN, SPECIAL_TOPICS, TOPIC, _broker, _records, _send


class Host:
    """A channel with the given peer address (or none at all)."""

    def __init__(self, address: str | None) -> None:
        if address is not None:
            self.remote_address = address


@pytest.fixture
def c_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "c")


@pytest.fixture
def py_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "py")


def _frame(r: RemotingCommand | bytes | None) -> bytes | None:
    return r if r is None or isinstance(r, bytes) else r.encode()


UNIQ = "UNIQ_KEY\x01AC1100010000000000000000000001\x02"
SPREAD: list[dict[str, Any]] = [
    *PLAIN,
    {"e": "2", "h": "-5", "j": "15", "f": "3", "g": "-1"},  # negative flag and timestamp: canonical texts
    {"e": "0", "f": "16", "h": "2147483647", "g": "999999999999999999"},
    {"i": "KEYS\x01k1 k2\x02TAGS\x01t\x02"},
    {"i": "CLUSTER\x01mine\x02"},  # CLUSTER kept, UNIQ_KEY added after it
    {"i": "UNIQ_KEY\x01ID\x02CLUSTER\x01c\x02"},  # nothing added
    {"i": "KEYS\x01caf\xe9\x02"},  # Latin-1: one byte a character, not ASCII
    {"i": "KEYS\x01\u6d88\u606f"},  # wide characters, no trailing separator
    {"i": "KEYS\x01\U0001f600\x02" + UNIQ},
    {"i": "\x02"},  # a lone separator
    {"i": "MYCLUSTER\x01x\x02KEYS\x01UNIQ_KEY\x02"},  # markers as substrings: CLUSTER found, UNIQ_KEY not
    {"i": "TAGS\x01DELA\x02KEYS\x01TIMER TRAN_MSG\x02D"},  # near misses of the declined names, a 'D' at the end
    {"i": "KEYS\x01\u6d88\x02CLUSTER\x01c"},  # wide characters, CLUSTER found
    {"m": "false", "l": "", "d": ""},  # empty optional integers: not read
    {"k": "true", "n": "broker-a", "o": "x"},  # fields neither lane reads
]
HOSTS = ["10.1.2.3:45678", "[::1]:9876", "", None]


@pytest.mark.parametrize("fields", SPREAD, ids=[str(i) for i in range(len(SPREAD))])
def test_the_c_lane_stores_and_answers_what_the_python_lane_does(c_broker: Broker, py_broker: Broker,
                                                                 fields: dict[str, Any]) -> None:
    for b in (c_broker, py_broker):  # the topic's route is made by the Python lane (the C lane only reads it)
        assert b.send_processor.lane(_send(), Host("10.9.8.7:1")) is not None
    served = 0
    for i, host in enumerate(HOSTS):
        body = (b"", b"hello", bytes(range(256)) * 8, b"x" * 30000)[i]
        rng.seed(5)
        got = c_broker.send_processor.serve_lane(_send(body=body, **fields), Host(host))
        rng.seed(5)
        want = py_broker.send_processor.lane(_send(body=body, **fields), Host(host))
        assert want is not None and want.code == ResponseCode.SUCCESS
        assert _frame(got) == want.encode()
        served += isinstance(got, bytes)
    c_broker.store.reput_message_service.wait_for()
    py_broker.store.reput_message_service.wait_for()
    generated = "UNIQ_KEY\x01" not in _send(**fields).ext_fields["i"]
    assert _records(c_broker, generated) == _records(py_broker, generated)
    assert sum(c_broker.store.get_max_offset_in_queue(TOPIC, q) for q in range(4)) == len(HOSTS) + 1
    ext = _send(**fields).ext_fields
    canonical = all(ext[k] == str(int(ext[k])) for k in "efghj") and int(ext["e"]) >= 0 and all(
        ext.get(k, "") in ("", str(int(ext.get(k) or 0))) for k in "ld")
    if NATIVE_LANE is not None and canonical:
        assert served == len(HOSTS), "the C lane declined a plain send"


# the Python lane's declines, less the usual half message, which the C lane serves (tests/test_half_lane.py)
C_DECLINED = {k: v for k, v in DECLINED.items() if k != "half message property"}


@pytest.mark.parametrize("fields", C_DECLINED.values(), ids=C_DECLINED.keys())
def test_the_c_lane_declines_what_the_python_lane_leaves_to_the_full_path(c_broker: Broker,
                                                                          fields: dict[str, Any]) -> None:
    end = c_broker.store.get_max_phy_offset()
    sp = c_broker.send_processor
    if NATIVE_LANE is not None:
        sp.lane(_send(), Host("1.2.3.4:5"))  # the topic's route is made
        end = c_broker.store.get_max_phy_offset()
        assert NATIVE_LANE(_send(**fields), "1.2.3.4:5", sp.lane_context()) is None
    assert sp.serve_lane(_send(**fields), Host("1.2.3.4:5")) is None
    assert c_broker.store.get_max_phy_offset() == end  # nothing stored


@pytest.mark.parametrize("props", ["KEYS\x01\u6d88\x02DELAY\x013\x02", "\u6d88TIMER_DELIVER_MS\x011\x02",
                                   "KEYS\x01caf\xe9\x02TRAN_MSG\x01TRUE\x02", "DELAY", "xTIMER_",
                                   "KEYS\x01\u6d88\x02TRAN_MSG\x01true\x02"])
def test_the_c_lane_declines_delays_timers_and_unusual_half_messages_in_any_text(c_broker: Broker, props: str) -> None:
    sp = c_broker.send_processor
    sp.lane(_send(), Host("1.2.3.4:5"))
    end = c_broker.store.get_max_phy_offset()
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_send(i=props), "1.2.3.4:5", sp.lane_context()) is None
    assert sp.serve_lane(_send(i=props), Host("1.2.3.4:5")) is None
    assert c_broker.store.get_max_phy_offset() == end


@pytest.mark.parametrize("topic", SPECIAL_TOPICS)
def test_the_c_lane_declines_special_and_unknown_topics(c_broker: Broker, topic: str) -> None:
    if topic.startswith("%RETRY%"):
        c_broker.create_topic(topic, 1, 1)
    end = c_broker.store.get_max_phy_offset()
    assert c_broker.send_processor.serve_lane(_send(topic=topic), Host("1.2.3.4:5")) is None
    assert c_broker.store.get_max_phy_offset() == end


def test_the_c_lane_leaves_a_new_topic_version_to_the_python_lane(c_broker: Broker) -> None:
    sp = c_broker.send_processor
    ctx = sp.lane_context()
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_send(), "10.9.8.7:1", ctx) is None  # no route made yet: the Python lane makes it
        assert isinstance(sp.serve_lane(_send(), Host("10.9.8.7:1")), RemotingCommand)
        assert isinstance(NATIVE_LANE(_send(), "10.9.8.7:1", ctx), bytes)
    else:
        assert isinstance(sp.serve_lane(_send(), Host("10.9.8.7:1")), RemotingCommand)
    c_broker.create_topic(TOPIC, 4, 4, perm=PermName.PERM_READ)  # read-only now: the version moved
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_send(), "10.9.8.7:1", ctx) is None
    assert sp.serve_lane(_send(), Host("10.9.8.7:1")) is None
    c_broker.create_topic(TOPIC, 2, 2)  # writeable again, two queues
    assert _frame(sp.serve_lane(_send(e="1"), Host("10.9.8.7:1"))) is not None
    assert sp.serve_lane(_send(e="2"), Host("10.9.8.7:1")) is None  # out of range now
    if NATIVE_LANE is not None:
        assert isinstance(NATIVE_LANE(_send(e="1"), "10.9.8.7:1", ctx), bytes)


def test_a_refused_put_is_answered_as_the_python_lane_answers_it(c_broker: Broker, py_broker: Broker) -> None:
    for b in (c_broker, py_broker):
        b.send_processor.lane(_send(), Host("10.9.8.7:1"))  # routes made while the stores run
        b.store.shutdown()
    got = c_broker.send_processor.serve_lane(_send(), Host("10.9.8.7:1"))
    want = py_broker.send_processor.lane(_send(), Host("10.9.8.7:1"))
    assert want is not None and want.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert isinstance(got, RemotingCommand) and got.encode() == want.encode()


def test_a_born_host_that_is_no_address_is_refused_as_the_python_lane_refuses_it(c_broker: Broker,
                                                                                py_broker: Broker) -> None:
    for b in (c_broker, py_broker):
        b.send_processor.lane(_send(), Host("10.9.8.7:1"))
    for host in ("somewhere:1", "10.1.1.1", "[::1]"):
        got = c_broker.send_processor.serve_lane(_send(), Host(host))
        want = py_broker.send_processor.lane(_send(), Host(host))
        assert want is not None and want.code == ResponseCode.MESSAGE_ILLEGAL
        assert isinstance(got, RemotingCommand) and got.encode() == want.encode()


def test_a_store_without_generated_ids_gets_none(tmp_path: Path) -> None:
    """auto_create_uniq_key off: a send without UNIQ_KEY is stored without one, by both lanes."""
    from rmq_eventstore.store import MessageStore

    stores = []
    for name in ("c", "py"):
        s = MessageStore.open(tmp_path / name, store_host="127.0.0.1:10911", auto_create_uniq_key=False,
                              **SMALL_GEOMETRY)
        b = Broker(s)
        b.start()
        b.create_topic(TOPIC, 4, 4)
        stores.append((s, b))
    try:
        (_, cb), (_, pb) = stores
        for _ in range(2):
            got = cb.send_processor.serve_lane(_send(i="TAGS\x01t\x02"), Host("10.9.8.7:1"))
            want = pb.send_processor.lane(_send(i="TAGS\x01t\x02"), Host("10.9.8.7:1"))
            assert want is not None and _frame(got) == want.encode()
        for s, _ in stores:
            s.reput_message_service.wait_for()
        assert _records(cb) == _records(pb)
        assert all("UNIQ_KEY" not in r[6] for r in _records(cb))
    finally:
        for s, b in stores:
            b.shutdown()
            s.shutdown()


def test_the_c_lane_is_used_with_the_native_core() -> None:
    assert (NATIVE_LANE is not None) == (codec.batch_native is not None)


# -- the lane straight from the frame's bytes (`_native.send_frame`, the server's data_received) ------------------

def _frame_bytes(header: str, body: bytes = b"hello") -> bytes:
    h = header.encode("utf-8", "surrogatepass")
    return struct.pack(">ii", 4 + len(h) + len(body), len(h)) + h + body


def _header(ext: dict[str, str] | str, code: int = 310, flag: int = 0, extra: str = "") -> str:
    ext_text = ext if isinstance(ext, str) else json.dumps(ext, ensure_ascii=False, separators=(",", ":"))
    return (f'{{"code":{code},"language":"JAVA","version":435,"opaque":99,"flag":{flag}{extra},'
            f'"extFields":{ext_text},"serializeTypeCurrentRPC":"JSON"}}')


def _frame_lane(b: Broker, data: bytes, host: str = "10.1.2.3:4") -> tuple[Any, int]:
    holds = []
    got = NATIVE_FRAME_LANE(data, host, (b.send_processor.lane_context(), lambda: holds.append(1),
                                         DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE, bytearray()))
    return got, len(holds)


def _ext(**fields: Any) -> dict[str, str]:
    return _send(**fields).ext_fields


FRAMES = {
    "plain": _header(_ext()),
    "no properties": _header(_ext(i="")),
    "wide properties": _header(_ext(i="KEYS\x01\u6d88\u606f\x02")),
    "escaped topic text": _header(_ext()).replace('"b":"LaneTopic"', '"b":"Lane\\u0054opic"'),
    "spaces around": _header(_ext()).replace('"e":"1"', '"e" :  "1" ').replace("{", "{ ", 1),
    "duplicate field: the last": _header('{"e":"0","b":"LaneTopic","e":"3","f":"0","g":"5","h":"0","j":"0",'
                                         '"i":"UNIQ_KEY\\u0001X\\u0002"}'),
    "two extFields: the last": _header('{"e":"9"}').replace(
        '"extFields":{"e":"9"}', '"extFields":{"e":"9"},"extFields":' + json.dumps(_ext(), separators=(",", ":"))),
    "remark and other fields": _header(_ext(), extra=',"remark":"r\\n","x":null,"y":true,"z":-3,"w":"s"'),
    "unknown ext fields": _header(_ext(k="false", n="broker-a", zz="\u00e9")),
    "every escape in the properties": _header(_ext()).replace(
        '"i":"', '"i":"KEYS\\u0001a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u007F\\u0041\\u0002'),
    "a non-ASCII escape in the properties": _header(_ext()).replace('"i":"', '"i":"KEYS\\u0001\\u00e9\\u0002'),
    "a surrogate pair in the properties": _header(_ext()).replace('"i":"', '"i":"KEYS\\u0001\\ud83d\\ude00\\u0002'),
    "raw UTF-8 in the properties": _header(_ext(i="KEYS\x01caf\u00e9 \u6d88\x02" + UNIQ)),
    "an escaped topic ending": _header(_ext()).replace('"b":"LaneTopic"', '"b":"LaneTopi\\u0063"'),
}


@pytest.mark.parametrize("header", FRAMES.values(), ids=FRAMES.keys())
def test_the_frame_lane_answers_what_the_python_lane_answers_for_the_decoded_frame(
        c_broker: Broker, py_broker: Broker, header: str) -> None:
    for b in (c_broker, py_broker):
        assert b.send_processor.lane(_send(), Host("10.9.8.7:1")) is not None
    data = _frame_bytes(header)
    (cmd,) = FrameDecoder().feed(data)
    want = py_broker.send_processor.lane(cmd, Host("10.1.2.3:4"))
    assert want is not None and want.code == ResponseCode.SUCCESS
    if NATIVE_FRAME_LANE is None:
        return
    got, holds = _frame_lane(c_broker, data)
    assert isinstance(got, bytes) and got == want.encode()
    assert holds == 1
    for b in (c_broker, py_broker):
        b.store.reput_message_service.wait_for()
    generated = "UNIQ_KEY\x01" not in (cmd.ext_fields.get("i") or "")
    assert _records(c_broker, generated) == _records(py_broker, generated)


NOT_FRAMES = {
    "a response": _frame_bytes(_header(_ext(), flag=1)),
    "one-way": _frame_bytes(_header(_ext(), flag=2)),
    "another request": _frame_bytes(_header(_ext(), code=10)),
    "an int field escaped": _frame_bytes(_header(_ext()).replace('"e":"1"', '"e":"\\u0031"')),
    "a number in extFields": _frame_bytes(_header(_ext()).replace('"e":"1"', '"e":1')),
    "a key escaped": _frame_bytes(_header(_ext()).replace('"e":"1"', '"\\u0065":"1"')),
    "a non-ASCII key": _frame_bytes(_header(_ext(**{"\u00e9": "x"}))),
    "a stream append": _frame_bytes(_header(_ext(streamId="s-1"))),
    "a V1 name": _frame_bytes(_header(_ext(batch="false"))),
    "a batch": _frame_bytes(_header(_ext(m="true"))),
    "a delay": _frame_bytes(_header(_ext(i="DELAY\x013\x02"))),
    "a random queue": _frame_bytes(_header(_ext(e="-1"))),
    "two frames": _frame_bytes(_header(_ext())) * 2,
    "a frame and a half": _frame_bytes(_header(_ext())) + b"\x00\x00",
    "half a frame": _frame_bytes(_header(_ext()))[:-1],
    "a binary header": struct.pack(">ii", 4 + 20, 0x01000014) + bytes(20),
    "a float": _frame_bytes(_header(_ext(), extra=',"q":1.5')),
    "remark null": _frame_bytes(_header(_ext(), extra=',"remark":null')),
    "no code": _frame_bytes(_header(_ext()).replace('"code":310,', "")),
    "trailing text": _frame_bytes(_header(_ext()) + "x"),
    "an unknown topic": _frame_bytes(_header(_ext(b="NotCreatedYet"))),
}


@pytest.mark.parametrize("data", NOT_FRAMES.values(), ids=NOT_FRAMES.keys())
def test_the_frame_lane_declines_anything_else_before_any_change(c_broker: Broker, data: bytes) -> None:
    c_broker.send_processor.lane(_send(), Host("10.9.8.7:1"))
    end = c_broker.store.get_max_phy_offset()
    if NATIVE_FRAME_LANE is not None:
        assert _frame_lane(c_broker, data) == (None, 0)
    assert c_broker.store.get_max_phy_offset() == end


def test_the_frame_lane_leaves_a_read_to_a_decoder_holding_part_of_a_frame(c_broker: Broker) -> None:
    c_broker.send_processor.lane(_send(), Host("10.9.8.7:1"))
    end = c_broker.store.get_max_phy_offset()
    if NATIVE_FRAME_LANE is not None:
        fctx = (c_broker.send_processor.lane_context(), lambda: None, DEFAULT_MAX_FRAME_SIZE,
                DEFAULT_MAX_HEADER_SIZE, bytearray(b"\x00\x00"))
        assert NATIVE_FRAME_LANE(_frame_bytes(_header(_ext())), "10.1.2.3:4", fctx) is None
    assert c_broker.store.get_max_phy_offset() == end


def test_the_frame_lane_answers_a_refused_put_with_the_decoded_command(c_broker: Broker) -> None:
    c_broker.send_processor.lane(_send(), Host("10.9.8.7:1"))
    data = _frame_bytes(_header(_ext()))
    if NATIVE_FRAME_LANE is None:
        return
    got, holds = _frame_lane(c_broker, data, host="nowhere:1")  # not an address: MESSAGE_ILLEGAL
    assert isinstance(got, tuple) and holds == 1
    cmd, res, queue_id = got
    assert cmd.encode() == FrameDecoder().feed(data)[0].encode() and queue_id == 1
    answer = c_broker.send_processor.lane_answer(cmd, res, queue_id)
    assert answer.code == ResponseCode.MESSAGE_ILLEGAL and answer.opaque == 99


def test_a_broker_serves_sends_from_their_frames(tmp_path: Path) -> None:
    """Over a real socket: our producer's sends, one at a time, are answered as before (offsets, ids)."""
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic(TOPIC, 4, 4)
        served = []
        lane = running.server._frame_lane
        if lane is not None:
            def counted(*args: Any) -> Any:
                got = lane(*args)
                served.append(isinstance(got, bytes))
                return got
            running.server._frame_lane = counted
        with Producer(running.namesrv_address, "frame-producer") as p:
            results = [p.send(Message(TOPIC, b"m%d" % i, keys=[f"k{i}"]), queue_id=i % 4) for i in range(12)]
        assert [r.queue_offset for r in results] == [i // 4 for i in range(12)]
        if lane is not None:  # all but the first (whose route the Python lane makes) from their frames
            assert served.count(True) >= 11
        running.store.reput_message_service.wait_for()
        for r in results:
            m = running.store.look_message_by_offset(int(r.offset_msg_id[-16:], 16))
            assert m is not None and m.properties_string.count("UNIQ_KEY\x01" + r.msg_id) == 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.sampled_from("ab \x01\x02\"\\/\b\f\n\r\t\x7f\x80\u00e9\u6d88\U0001f600\ud800"), max_size=24),
       ascii_only=st.booleans())
def test_the_frame_lane_reads_any_properties_text_as_the_decoder_does(c_broker: Broker, py_broker: Broker,
                                                                      text: str, ascii_only: bool) -> None:
    for b in (c_broker, py_broker):
        b.send_processor.lane(_send(), Host("10.9.8.7:1"))
    props = "KEYS\x01" + text + "\x02" + UNIQ
    ext_text = json.dumps(_ext(i=props), ensure_ascii=ascii_only, separators=(",", ":"))
    data = _frame_bytes(_header(ext_text))
    (cmd,) = FrameDecoder().feed(data)
    want = py_broker.send_processor.lane(cmd, Host("10.1.2.3:4"))
    assert want is not None
    if NATIVE_FRAME_LANE is None:
        return
    got, _ = _frame_lane(c_broker, data)
    if isinstance(got, tuple):  # refused by the store (a lone surrogate): answered by the Python lane's code
        assert want.code != ResponseCode.SUCCESS
        assert c_broker.send_processor.lane_answer(*got).encode() == want.encode()
        return
    assert isinstance(got, bytes) and got == want.encode()
    for b in (c_broker, py_broker):
        b.store.reput_message_service.wait_for()
    last = [b.store.get_message("g", TOPIC, 1, b.store.get_max_offset_in_queue(TOPIC, 1) - 1, 1).messages[0]
            for b in (c_broker, py_broker)]
    assert last[0].properties_string == last[1].properties_string == cmd.ext_fields["i"] + "CLUSTER\x01DefaultCluster\x02"
