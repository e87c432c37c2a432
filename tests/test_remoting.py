"""The remoting frame codec: RocketMQ's framing, JSON and binary headers, extFields types, limits."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.remoting import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    FrameError,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode_frame,
    send_header_v1,
    send_header_v2,
)


def frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def test_encode_layout_is_length_then_json_header_then_body() -> None:
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g", "e": 3}, b"body")
    data = cmd.encode()
    length, word = struct.unpack_from(">ii", data)
    assert length == len(data) - 4
    assert word >> 24 == SerializeType.JSON
    header = json.loads(data[8:8 + (word & 0xFFFFFF)])
    assert header["code"] == 310 and header["opaque"] == cmd.opaque and header["flag"] == 0
    assert header["extFields"] == {"a": "g", "e": "3"}
    assert data.endswith(b"body")


def test_decoder_splits_partial_and_coalesced_frames() -> None:
    cmds = [RemotingCommand.request(RequestCode.HEART_BEAT, {"x": str(i)}, bytes([i]) * i) for i in range(5)]
    stream = b"".join(c.encode() for c in cmds)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):  # byte by byte
        got += dec.feed(stream[i:i + 1])
    assert [(c.opaque, c.ext_fields, c.body) for c in got] == [(c.opaque, c.ext_fields, c.body) for c in cmds]
    assert dec.buffered == 0
    assert len(FrameDecoder().feed(stream)) == 5  # all at once


def test_ext_fields_accept_strings_numbers_and_booleans() -> None:
    # What ali-ons sends: JSON numbers and booleans as they are in JavaScript; null values are absent.
    header = json.dumps({"code": 310, "language": "JAVA", "opaque": 7, "flag": 0, "version": 121,
                         "extFields": {"e": 0, "k": False, "l": True, "g": 1700000000000, "b": "t",
                                       "x": None, "f": 2.0}}).encode()
    cmd = FrameDecoder().feed(frame(header, b"hi"))[0]
    assert cmd.ext_fields == {"e": "0", "k": "false", "l": "true", "g": "1700000000000", "b": "t", "f": "2"}
    assert cmd.get_int("e") == 0 and cmd.get_bool("k") is False and cmd.get_bool("l") is True
    assert cmd.body == b"hi" and cmd.language == "JAVA" and cmd.version == 121


def test_integer_language_and_missing_optional_fields() -> None:
    cmd = FrameDecoder().feed(frame(b'{"code":34,"language":1,"opaque":1}'))[0]
    assert cmd.language == "CPP" and cmd.flag == 0 and cmd.ext_fields == {}


def test_response_keeps_opaque_sets_flag_and_writes_strings() -> None:
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"queueId": 1})
    resp = req.response(ResponseCode.PULL_NOT_FOUND, "none", {"nextBeginOffset": 5, "minOffset": 0})
    back = FrameDecoder().feed(resp.encode())[0]
    assert back.opaque == req.opaque and back.flag & FLAG_RESPONSE and back.is_response
    assert back.code == 19 and back.remark == "none"
    raw = json.loads(resp.header_json())
    assert raw["extFields"] == {"nextBeginOffset": "5", "minOffset": "0"}  # strings, as Java writes


def test_oneway_flag() -> None:
    cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {}, oneway=True)
    assert cmd.flag == FLAG_ONEWAY and cmd.is_oneway and not cmd.is_response


def test_binary_rocketmq_header_is_decoded() -> None:
    ext = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
                   for k, v in ((b"topic", b"orders"), (b"queueId", b"2")))
    remark = b"hello"
    header = struct.pack(">hbhii", 105, 0, 399, 42, 0) + struct.pack(">i", len(remark)) + remark + \
        struct.pack(">i", len(ext)) + ext
    cmd = FrameDecoder().feed(frame(header, b"", SerializeType.ROCKETMQ))[0]
    assert (cmd.code, cmd.opaque, cmd.version, cmd.remark) == (105, 42, 399, "hello")
    assert cmd.ext_fields == {"topic": "orders", "queueId": "2"}
    assert cmd.serialize_type == SerializeType.ROCKETMQ


@pytest.mark.parametrize("data, why", [
    (struct.pack(">ii", -5, 10), "frame length"),
    (struct.pack(">ii", 2, 10), "frame length"),
    (struct.pack(">ii", 1 << 30, 10), "frame length"),
    (struct.pack(">ii", 10, 100), "header length"),
    (struct.pack(">ii", 10, 0), "header length"),
    (frame(b"{not json"), "not JSON"),
    (frame(b"[1,2]"), "not a JSON object"),
    (frame(b'{"code":"x"}'), "32-bit integer"),
    (frame(b'{"code":1,"opaque":99999999999}'), "32-bit integer"),
    (frame(b'{"code":1,"extFields":{"a":{"b":1}}}'), "string, number or boolean"),
    (frame(b'{"code":1,"extFields":[1]}'), "must be an object"),
    (frame(b'{"code":1,"remark":5}'), "remark"),
    (frame(b'{"code":1}', stype=7), "serialization type"),
    (frame(b"\x00\x01", stype=1), "binary header"),
    (frame(b"\xff\xfe{}"), "not JSON"),
])
def test_malformed_frames_raise_frame_error(data: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        FrameDecoder().feed(data)


def test_header_size_limit() -> None:
    dec = FrameDecoder(max_frame_size=1 << 20, max_header_size=1024)
    big = json.dumps({"code": 1, "extFields": {"k": "v" * 2000}}).encode()
    with pytest.raises(FrameError, match="header length"):
        dec.feed(frame(big))


def test_typed_getters_name_the_missing_or_bad_field() -> None:
    cmd = RemotingCommand(11, {"queueId": "x"})
    with pytest.raises(HeaderError, match="<topic> is null"):
        cmd.get_str("topic")
    with pytest.raises(HeaderError, match="<queueId> is not an integer"):
        cmd.get_int("queueId")
    assert cmd.get_int("maxMsgNums", 32) == 32


def test_send_header_short_names_round_trip() -> None:
    v1 = {"producerGroup": "g", "topic": "t", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
          "queueId": "1", "sysFlag": "0", "bornTimestamp": "5", "flag": "0", "properties": "", "reconsumeTimes": "0",
          "unitMode": "false", "maxReconsumeTimes": "16", "batch": "false", "brokerName": "b"}
    v2 = send_header_v2(v1)
    assert sorted(v2) == list("abcdefghijklmn")
    assert send_header_v1(v2) == v1


def test_decode_frame_without_length_word() -> None:
    data = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "t"}, b"x").encode()
    cmd = decode_frame(data[4:])
    assert cmd.code == 30 and cmd.body == b"x"


_ext_values = st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.booleans())


@settings(max_examples=150, deadline=None)
@given(code=st.integers(-(2**31), 2**31 - 1), ext=st.dictionaries(st.text(max_size=10), _ext_values, max_size=6),
       body=st.binary(max_size=200), remark=st.one_of(st.none(), st.text(max_size=30)))
def test_round_trip_property(code: int, ext: dict, body: bytes, remark: str | None) -> None:
    cmd = RemotingCommand.request(code, ext, body)
    cmd.remark = remark
    back = FrameDecoder().feed(cmd.encode())[0]
    assert (back.code, back.opaque, back.body, back.remark) == (code, cmd.opaque, body, remark)
    assert back.ext_fields == cmd.ext_fields
    assert all(isinstance(v, str) for v in back.ext_fields.values())
