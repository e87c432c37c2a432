"""Unit tests for the record codec, mirroring RocketMQ's own tests (spec §1–§4, §15):
`MessageDecoderTest`, `MessageClientIDSetterTest`, `MessageExtBrokerInnerTest`, the size-limit cases of
`DefaultMessageStoreTest.testPutLongMessage`, and the reader's behaviour on corrupt data."""

from __future__ import annotations

import random
import struct
import time
import zlib

import numpy as np
import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message

V4_BORN = codec.parse_host("127.0.0.1:54321")
V4_STORE = codec.parse_host("192.168.0.1:10911")
V6_BORN = codec.parse_host("[2001:db8::1]:40001")
V6_STORE = codec.parse_host("[fe80::1]:10911")
BODY = 88  # first body byte of an IPv4/IPv4 record (BODYLEN is at 84)


def _record(topic="TopicTest", body=b"Hello", props="TAGS\x01TagA\x02", **kw) -> bytearray:
    kw.setdefault("born_host", V4_BORN)
    kw.setdefault("store_host", V4_STORE)
    return codec.encode_record(topic=topic, body=body, properties_string=props, **kw)


# -- Java String.hashCode (spec §4) -------------------------------------------------------------------
JAVA_HASHES = [
    ("TagA", 2598919), ("TagB", 2598920), ("*", 42), ("", 0), ("TopicTest#KEY1", -1656969516),
    ("polygenelubricants", -2147483648), ("\U0001F600", 1772899), ("ØµA", 213252), ("hello", 99162322),
    ("标签", 857175), ("TagC", 2598921),
]


@pytest.mark.parametrize("s, h", JAVA_HASHES)
def test_java_string_hash_vectors(s, h):
    assert codec.java_string_hash(s) == h
    assert codec.tags_string_to_tags_code(s) == h  # "" → 0 as well


def test_java_string_hashes_vectorised_vectors():
    strings = [s for s, _ in JAVA_HASHES]
    got = codec.java_string_hashes(strings)
    assert got.dtype == np.int32
    assert got.tolist() == [h for _, h in JAVA_HASHES]
    assert codec.java_string_hashes([]).tolist() == []
    assert codec.java_string_hashes(["", ""]).tolist() == [0, 0]


def test_java_string_hash_long_strings():
    """Beyond the 512-unit precomputed power table both paths fall back correctly."""
    for s in ("a" * 600, "é" * 513, "\U0001F600" * 300, "x" * 511 + "\U0001F680"):
        h = 0
        units = s.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
        want = h - (1 << 32) if h >= 1 << 31 else h
        assert codec.java_string_hash(s) == want
        assert codec.java_string_hashes([s, "TagA"]).tolist() == [want, 2598919]


def test_index_key_hash():
    assert codec.index_key_hash("TopicTest#KEY1") == 1656969516
    assert codec.index_key_hash("polygenelubricants") == 0  # abs(Integer.MIN_VALUE) < 0 → 0
    assert codec.index_key_hash("TagA") == 2598919
    assert codec.index_key_hash("") == 0


def test_tags_code_of_no_tags():
    assert codec.tags_string_to_tags_code(None) == 0
    assert codec.tags_string_to_tags_code("") == 0


# -- CRC (spec §1.4, §1.10) ------------------------------------------------------------------------
def test_body_crc_example():
    assert zlib.crc32(b"Hello") == 4157704578
    assert codec.body_crc(b"Hello") == 2010220930 == 0x77D18982
    assert codec.body_crc(b"") == 0


@pytest.mark.parametrize("crc, digits", [(2010220930, "0390220102"), (12345, "5432100000"), (0, "0000000000"),
                                         (0x7FFFFFFF, "7463847412"), (1, "1000000000")])
def test_crc32_property_digits(crc, digits):
    assert codec.crc32_property_value(crc) == digits
    assert codec.parse_crc32_property_value(digits) == crc


def test_crc_trailer_layout():
    rec = _record(props="TAGS\x01TagA", append_crc=True)  # no trailing 0x02: one is inserted
    tail = bytes(rec[-21:])
    assert tail[:1] == b"\x02" and tail[1:10] == b"__CRC32#\x01" and tail[-1:] == b"\x02"
    crc = codec.body_crc(bytes(rec[:-20]))
    assert tail[10:20].decode() == codec.crc32_property_value(crc)
    m = codec.decode_message(rec)
    assert m.properties == {"TAGS": "TagA", "__CRC32#": codec.crc32_property_value(crc)}
    assert codec.CRC32_RESERVED_LEN == 20


def test_crc_trailer_replaces_an_existing_one():
    props = "__CRC32#\x010000000000\x02TAGS\x01TagA\x02"
    rec = _record(props=props, append_crc=True)
    m = codec.decode_message(rec)
    assert m.properties_string.startswith("TAGS\x01TagA\x02__CRC32#\x01")
    assert m.properties_string.count("__CRC32#") == 1
    assert codec.check_message_and_return_size(rec, 0, check_crc=True, verify_prop_crc=True).success


def test_empty_properties_with_crc_trailer():
    rec = _record(props="", append_crc=True)
    assert codec.decode_message(rec).properties_string.startswith("__CRC32#\x01")
    assert len(rec) == codec.cal_msg_length(5, 9, 20)


def test_prop_crc_verification_detects_any_flipped_byte():
    rec = _record(props="TAGS\x01TagA\x02KEYS\x01a b\x02", append_crc=True)
    assert codec.check_message_and_return_size(rec, 0, check_crc=True, verify_prop_crc=True).success
    for i in range(len(rec) - codec.CRC32_RESERVED_LEN):
        if i < 4:
            continue  # flipping TOTALSIZE is caught by the size rules instead
        bad = bytearray(rec)
        bad[i] ^= 0x01
        r = codec.check_message_and_return_size(bad, 0, check_crc=True, verify_prop_crc=True)
        assert not r.success, i


def test_missing_prop_crc_fails_verification():
    rec = _record()
    assert not codec.check_message_and_return_size(rec, 0, check_crc=True, verify_prop_crc=True).success
    assert codec.check_message_and_return_size(rec, 0, check_crc=True).success


# -- worked example (spec §1.9) ----------------------------------------------------------------------
WORKED_PROPS = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02WAIT\x01true\x02UNIQ_KEY\x017F0000010F3C18B4AAC2000000000000"
WORKED_HEX = """
00 00 00 b1 da a3 20 a7 77 d1 89 82 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 01 8b cf e5 68 00
7f 00 00 01 00 00 d4 31 00 00 01 8b cf e5 68 7b
c0 a8 00 01 00 00 2a 9f 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 05 48 65 6c 6c 6f 09 54 6f
70 69 63 54 65 73 74 00 48
"""


def test_worked_example_bytes():
    assert len(WORKED_PROPS.encode()) == 72
    rec = codec.encode_record(
        topic="TopicTest", body=b"Hello", properties_string=WORKED_PROPS, born_timestamp=1700000000000,
        born_host=codec.parse_host("127.0.0.1:54321"), store_timestamp=1700000000123,
        store_host=codec.parse_host("192.168.0.1:10911"))
    want = bytes.fromhex(WORKED_HEX.replace("\n", " ")) + WORKED_PROPS.encode()
    assert len(rec) == 177 == codec.cal_msg_length(5, 9, 72)
    assert bytes(rec) == want
    m = codec.decode_message(rec, check_crc=True)
    assert m.tags == "TagA" and m.keys_list() == ["k1", "k2"] and m.uniq_key.startswith("7F000001")
    assert m.born_host == "127.0.0.1:54321" and m.store_host == "192.168.0.1:10911"


def test_cal_msg_length_and_header_sizes():
    assert codec.cal_msg_length(0, 0, 0) == 91
    assert codec.cal_msg_length(0, 0, 0, codec.BORNHOST_V6_FLAG) == 103
    assert codec.cal_msg_length(0, 0, 0, codec.STOREHOSTADDRESS_V6_FLAG) == 103
    assert codec.cal_msg_length(0, 0, 0, codec.BORNHOST_V6_FLAG | codec.STOREHOSTADDRESS_V6_FLAG) == 115
    assert codec.cal_msg_length(1, 2, 3, v2=True) == 98
    assert codec.store_timestamp_position(0) == 56
    assert codec.store_timestamp_position(codec.BORNHOST_V6_FLAG) == 68


def test_v6_flags_follow_address_family():
    for born, store, flags in ((V4_BORN, V4_STORE, 0), (V6_BORN, V4_STORE, 0x10),
                               (V4_BORN, V6_STORE, 0x20), (V6_BORN, V6_STORE, 0x30)):
        # V6 bits passed in are ignored: the addresses decide
        rec = _record(born_host=born, store_host=store, sys_flag=0x30 ^ flags)
        m = codec.decode_message(rec)
        assert m.sys_flag == flags
        assert (m.born_host_bytes, m.born_port) == born and (m.store_host_bytes, m.store_port) == store


def test_blank_record():
    assert codec.encode_blank(197) == bytes.fromhex("000000c5cbd43194")
    buf = codec.encode_blank(16) + bytes(8)
    assert codec.check_message_and_return_size(buf, 0) == (0, True, None, "")


def test_v2_magic_and_topic_length():
    rec = _record(topic="T" * 128)  # auto V2
    assert struct.unpack_from(">i", rec, 4)[0] == codec.MESSAGE_MAGIC_CODE_V2
    m = codec.decode_message(rec)
    assert m.version == "V2" and m.topic == "T" * 128
    rec = _record(topic="T" * 127)
    assert codec.decode_message(rec).version == "V1"
    rec = _record(topic="T", force_v2=True)
    assert codec.decode_message(rec).version == "V2"
    assert len(rec) == len(_record(topic="T")) + 1


def test_v2_selection_counts_utf16_units_like_java():
    """topic.length() > 127 in Java chars: 64 non-BMP characters are 128 UTF-16 units → V2."""
    topic = "\U0001F600" * 64
    m = codec.decode_message(_record(topic=topic))
    assert m.version == "V2" and m.topic == topic


# -- properties (MessageDecoderTest, MessageExtBrokerInnerTest) ----------------------------------------
@pytest.mark.parametrize("s", ["", " ", "aaa", "k1\x01", "\x01v1", None, "\x02", "\x01\x02", "k\x01\x02"])
def test_string_to_properties_edge_cases_empty(s):
    assert codec.string_to_properties(s) == {}


def test_string_to_properties_edge_cases():
    assert codec.string_to_properties("k1\x01v1\x02") == {"k1": "v1"}
    assert codec.string_to_properties("k1\x01v1") == {"k1": "v1"}
    assert codec.string_to_properties("k1\x01v1\x02k2\x01v2") == {"k1": "v1", "k2": "v2"}
    assert codec.string_to_properties("k\x01a\x01b\x02") == {"k": "a\x01b"}  # only the first 0x01 splits
    assert codec.string_to_properties("k\x01a\x02k\x01b\x02") == {"k": "b"}  # the last one wins
    assert codec.string_to_properties("bad\x02k\x01v\x02\x02") == {"k": "v"}


def test_properties_to_string():
    assert codec.properties_to_string({}) == ""
    assert codec.properties_to_string({"a": "1", "b": None, "c": "3"}) == "a\x011\x02c\x013\x02"


@pytest.mark.parametrize("before, after", [
    ("", ""),
    ("KeyA\x01ValueA", ""),
    ("KeyA\x01ValueA\x02", ""),
    ("KeyA\x01ValueA\x02KeyA\x01ValueA", ""),
    ("KeyA\x01ValueA\x02KeyA\x01ValueA\x02", ""),
    ("KeyB\x01ValueB\x02KeyA\x01ValueA", "KeyB\x01ValueB\x02"),
    ("KeyB\x01ValueB\x02KeyA\x01ValueA\x02", "KeyB\x01ValueB\x02"),
    ("KeyB\x01ValueB\x02KeyA\x01ValueA\x02KeyB\x01ValueB\x02", "KeyB\x01ValueB\x02KeyB\x01ValueB\x02"),
    ("KeyA\x01ValueA\x02KeyB\x01ValueB\x02", "KeyB\x01ValueB\x02"),
    ("KeyA\x01ValueA\x02KeyB\x01ValueB", "KeyB\x01ValueB"),
    ("KeyA\x01ValueA\x02KeyB\x01ValueBKeyA\x01ValueA\x02", "KeyB\x01ValueBKeyA\x01ValueA\x02"),
    ("KeyA\x01ValueA\x02KeyB\x01ValueBKeyA\x01", "KeyB\x01ValueBKeyA\x01"),
    ("KeyAA\x01ValueAA\x02KeyAAA\x01ValueAAA\x02KeyA\x01ValueA\x02", "KeyAA\x01ValueAA\x02KeyAAA\x01ValueAAA\x02"),
    ("KeyA\x01\x02KeyB\x01ValueB", "KeyB\x01ValueB"),
    ("XKeyA\x01v\x02", "XKeyA\x01v\x02"),
])
def test_delete_property_like_message_utils(before, after):
    """`MessageUtils.deleteProperty` cuts the string in place, keeping everything else verbatim."""
    assert codec.delete_property(before, "KeyA") == after


def test_build_properties_string():
    m = Message(topic="T", tags="TagA", keys=["k1", "k2"], properties={"a": "1", "TAGS": "ignored"})
    assert codec.build_properties_string(m, "UNIQ") == "TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01UNIQ\x02a\x011\x02"
    assert codec.build_properties_string(Message(topic="T")) == ""
    assert codec.build_properties_string(Message(topic="T", properties_string="x\x01y")) == "x\x01y"


def test_java_hashmap_order_resize():
    keys = [f"k{i}" for i in range(13)]  # 13 > 12 = 0.75 * 16: the table doubles to 32
    order = codec.java_hashmap_order(keys)

    def bucket(k, cap):
        h = codec.java_string_hash(k) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (cap - 1)

    assert sorted(order) == sorted(keys)
    assert [bucket(k, 32) for k in order] == sorted(bucket(k, 32) for k in keys)
    assert codec.java_hashmap_order(["a", "b", "a"]) == ["a", "b"]
    assert codec.java_hashmap_order([]) == []


def test_encode_client_message_is_v1_only():
    rec = codec.encode_client_message(topic="T" * 127, body=b"x", born_host=V4_BORN, store_host=V4_STORE)
    assert codec.decode_message(rec).version == "V1"
    with pytest.raises(codec.EncodeError):
        codec.encode_client_message(topic="T" * 128, body=b"x", born_host=V4_BORN, store_host=V4_STORE)


# -- hosts ---------------------------------------------------------------------------------------------
def test_parse_and_format_host():
    assert codec.parse_host("192.168.1.10:10911") == (bytes([192, 168, 1, 10]), 10911)
    addr, port = codec.parse_host("[2001:db8::1]:40001")
    assert len(addr) == 16 and port == 40001
    assert codec.format_host(addr, port) == "[2001:db8:0:0:0:0:0:1]:40001"
    assert codec.format_host(*codec.parse_host("[::1]:10911")) == "[0:0:0:0:0:0:0:1]:10911"
    assert codec.parse_host("[::ffff:10.1.2.3]:5") == (bytes([10, 1, 2, 3]), 5)  # IPv4-mapped → IPv4


def test_format_host_of_ipv4_mapped_16_bytes_is_ipv4_text():
    """Java's InetAddress.getByAddress turns a 16-byte IPv4-mapped address into an Inet4Address."""
    assert codec.format_host(bytes(10) + b"\xff\xff" + bytes([1, 2, 3, 4]), 7) == "1.2.3.4:7"


@pytest.mark.parametrize("bad", ["nohost", "1.2.3.4", "[::1]", "[::1]x:1", "1.2.3.4:x", "300.1.1.1:1", "1.2.3.4:-1", "1.2.3.4:4294967296"])
def test_parse_host_rejects(bad):
    with pytest.raises(ValueError):
        codec.parse_host(bad)


# -- message ids (MessageDecoderTest.testMessageId) ----------------------------------------------------
def test_message_id_ipv4():
    host, port = codec.parse_host("127.0.0.1:9103")
    mid = codec.create_message_id(host, port, 123456)
    assert mid == "7F0000010000238F000000000001E240"
    assert codec.decode_message_id(mid) == (host, 9103, 123456)
    assert codec.decode_message_id(mid.lower()) == (host, 9103, 123456)


def test_message_id_ipv6():
    host, port = codec.parse_host("[::1]:0")
    mid = codec.create_message_id(host, port, 123456)
    assert mid == "00000000000000000000000000000001" + "00000000" + "000000000001E240"
    assert len(mid) == 56
    assert codec.decode_message_id(mid) == (host, 0, 123456)


@pytest.mark.parametrize("bad", ["", "7F00", "Z" * 32, "7F0000010000238F000000000001E24", "0" * 40])
def test_decode_message_id_rejects(bad):
    with pytest.raises(codec.MessageIdError):
        codec.decode_message_id(bad)


def test_client_msg_id_prefers_uniq_key():
    m = codec.decode_message(_record(props="UNIQ_KEY\x01ABC\x02"))
    assert m.client_msg_id == "ABC" and m.msg_id == m.offset_msg_id != "ABC"
    m = codec.decode_message(_record(props=""))
    assert m.client_msg_id == m.msg_id


# -- UNIQ_KEY (MessageClientIDSetterTest) ------------------------------------------------------------
def test_uniq_id_layout():
    ip = bytes([10, 20, 30, 40])
    gen = codec.UniqueIdGenerator(ip=ip, pid=0x1234)
    uid = gen.create()
    assert len(uid) == 32 and uid == uid.upper() and bytes.fromhex(uid)
    assert codec.UniqueIdGenerator.get_ip_bytes(uid) == ip
    assert ".".join(map(str, codec.UniqueIdGenerator.get_ip_bytes(uid))) == "10.20.30.40"
    assert codec.UniqueIdGenerator.get_pid(uid) == 0x1234
    assert uid.startswith("0A141E28" + "1234")


def test_uniq_id_ipv6():
    ip = bytes(range(16))
    uid = codec.UniqueIdGenerator(ip=ip, pid=99).create()
    assert len(uid) == 56
    assert codec.UniqueIdGenerator.get_ip_bytes(uid) == ip
    assert codec.UniqueIdGenerator.get_pid(uid) == 99


def test_uniq_id_nearly_time():
    gen = codec.UniqueIdGenerator(ip=bytes([127, 0, 0, 1]), pid=1)
    before = int(time.time() * 1000)
    uid = gen.create()
    t = codec.UniqueIdGenerator.get_nearly_time_ms(uid)
    assert abs(t - before) < 5000


def test_uniq_id_counter_increments():
    gen = codec.UniqueIdGenerator(ip=bytes([127, 0, 0, 1]), pid=1)
    ids = [gen.create() for _ in range(5)] + gen.create_many(5) + [gen.create()]
    counters = [int(u[-4:], 16) for u in ids]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(counters, counters[1:], strict=False))
    prefixes = {u[:20] for u in ids}  # ip + pid + per-process random part
    assert len(prefixes) == 1


def test_uniq_id_counter_text_is_four_hex_digits():
    """`create`'s counter text (from a table of byte pairs) is `{counter:04X}` at every byte boundary."""
    gen = codec.UniqueIdGenerator(ip=bytes([127, 0, 0, 1]), pid=1)
    gen.create()  # the same millisecond from here on is the fast path; a later one re-claims
    for c in (0, 1, 0xF, 0x10, 0xFF, 0x100, 0x0A0B, 0xABCD, 0xFF00, 0xFFFF):
        gen._counter = c
        gen._time_used = 0
        uid = gen.create()
        assert uid[-4:] == f"{c:04X}" and len(uid) == 32


def test_uniq_ids_unique_in_bulk():
    gen = codec.UniqueIdGenerator(ip=bytes([127, 0, 0, 1]), pid=1)
    ids = gen.create_many(100_000) + [gen.create() for _ in range(1000)] + gen.create_many(70_000)
    assert len(set(ids)) == len(ids) == 171_000
    assert all(len(u) == 32 for u in ids[:: 997])
    now = int(time.time() * 1000)
    assert abs(codec.UniqueIdGenerator.get_nearly_time_ms(ids[0]) - now) < 5000
    assert gen.create_many(0) == []


# -- size limits (DefaultMessageStoreTest.testPutLongMessage) -----------------------------------------
MAX = 4 * 1024 * 1024


def test_put_long_message_limits():
    # exactly max body + 127-byte topic + 32767-byte properties: encodes
    rec = _record(topic="\x00" * 127, body=bytes(MAX), props="\x00" * 32767)
    assert len(rec) == codec.cal_msg_length(MAX, 127, 32767)
    with pytest.raises(codec.EncodeError) as e:
        _record(topic="\x00" * 127, body=bytes(MAX + 1), props="\x00" * 32767)
    assert e.value.status == "MESSAGE_ILLEGAL"
    with pytest.raises(codec.EncodeError) as e:
        _record(topic="\x00" * 127, body=bytes(MAX), props="\x00" * 32768)
    assert e.value.status == "PROPERTIES_SIZE_EXCEEDED"
    with pytest.raises(codec.EncodeError) as e:  # V2, but the record exceeds max body + 64 KiB
        _record(topic="\x00" * 32767, body=bytes(MAX), props="\x00" * 32767)
    assert e.value.status == "MESSAGE_ILLEGAL"


def test_size_limits():
    with pytest.raises(codec.EncodeError) as e:
        _record(body=bytes(101), max_message_size=100)
    assert e.value.status == "MESSAGE_ILLEGAL"
    assert len(_record(body=bytes(100), max_message_size=100)) == codec.cal_msg_length(100, 9, 10)
    with pytest.raises(codec.EncodeError) as e:
        _record(props="p" * 32768)
    assert e.value.status == "PROPERTIES_SIZE_EXCEEDED"
    assert len(_record(props="p" * 32767)) == codec.cal_msg_length(5, 9, 32767)
    with pytest.raises(codec.EncodeError) as e:  # the CRC trailer's 20 bytes count
        _record(props="p" * (32767 - 20), append_crc=True)  # + 0x02 inserted → 32768
    assert e.value.status == "PROPERTIES_SIZE_EXCEEDED"
    rec = _record(props="p" * (32767 - 21) + "\x02", append_crc=True)  # exactly 32767 with the trailer
    assert len(rec) == codec.cal_msg_length(5, 9, 32767)
    with pytest.raises(codec.EncodeError) as e:
        _record(topic="T" * 128, auto_v2=False)
    assert e.value.status == "MESSAGE_ILLEGAL"
    with pytest.raises(codec.EncodeError) as e:
        _record(topic="é" * 64)  # 64 Java chars → V1, but 128 UTF-8 bytes do not fit a V1 length byte
    assert e.value.status == "MESSAGE_ILLEGAL"
    with pytest.raises(codec.EncodeError) as e:
        _record(body=None)
    assert e.value.status == "MESSAGE_ILLEGAL"


def test_properties_checked_before_body_like_java():
    """MessageExtEncoder checks the properties length first."""
    with pytest.raises(codec.EncodeError) as e:
        _record(body=bytes(11), props="p" * 40000, max_message_size=10)
    assert e.value.status == "PROPERTIES_SIZE_EXCEEDED"


# -- corrupt input ---------------------------------------------------------------------------------
def _check_never_raises(buf, pos=0, **kw):
    r = codec.check_message_and_return_size(buf, pos, **kw)
    assert isinstance(r, codec.CheckResult)
    return r


def _decode_only_corrupt_error(buf, pos=0, **kw):
    try:
        return codec.decode_message(buf, pos, **kw)
    except codec.CorruptRecordError:
        return None


SAMPLES = [
    _record(),
    _record(props="", body=b""),
    _record(born_host=V6_BORN, store_host=V6_STORE, props="TAGS\x01x\x02KEYS\x01a\x02UNIQ_KEY\x01u\x02"),
    _record(topic="T" * 200),
    _record(append_crc=True),
]


@pytest.mark.parametrize("rec", SAMPLES, ids=["v4", "empty", "v6", "v2", "crc"])
def test_truncated_records(rec):
    for n in range(len(rec)):
        prefix = bytes(rec[:n])
        r = _check_never_raises(prefix, check_crc=True)
        assert r.size == -1 and not r.success and r.request is None
        with pytest.raises(codec.CorruptRecordError):
            codec.decode_message(prefix)
        # the same record cut short by `limit` inside a larger buffer
        r = _check_never_raises(bytes(rec) + bytes(64), limit=n)
        assert not r.success
    assert _check_never_raises(rec, check_crc=True).success


def test_zeroed_space_and_illegal_magic():
    for n in (0, 1, 4, 7, 8, 100, 4096):
        r = _check_never_raises(bytes(n), check_crc=True)
        assert (r.size, r.success) == (-1, False)
        with pytest.raises(codec.CorruptRecordError):
            codec.decode_message(bytes(n))
    bad = bytearray(_record())
    bad[4:8] = b"\xde\xad\xbe\xef"
    assert _check_never_raises(bad).size == -1
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_message(bad)


def test_length_mismatch_is_a_half_message():
    rec = bytearray(_record()) + bytearray(4)
    struct.pack_into(">i", rec, 0, len(rec))  # TOTALSIZE says 4 more bytes than the fields need
    r = _check_never_raises(rec)
    assert (r.size, r.success) == (len(rec), False)
    with pytest.raises(codec.CorruptRecordError) as e:
        codec.decode_message(rec)
    assert e.value.size == len(rec)
    # a bad body CRC is reported first, as Java checks it right after reading the body
    rec[BODY] ^= 0xFF  # a byte of the body
    assert _check_never_raises(rec, check_crc=True).size == -1


def test_body_crc_mismatch():
    rec = bytearray(_record())
    rec[BODY] ^= 0x20  # first body byte ('H' → 'h')
    assert not _check_never_raises(rec, check_crc=True).success
    assert _check_never_raises(rec, check_crc=False).success
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_message(rec, check_crc=True)
    assert codec.decode_message(rec).body == b"hello"


def test_negative_and_oversized_lengths():
    rec = bytearray(_record())
    for pos, value in ((0, -5), (0, 10 ** 6), (BODY - 4, -1), (BODY - 4, 10 ** 6), (BODY - 4, 6)):
        bad = bytearray(rec)
        struct.pack_into(">i", bad, pos, value)
        assert not _check_never_raises(bad, check_crc=True).success
        assert _decode_only_corrupt_error(bad) is None
    bad = bytearray(rec)
    bad[BODY + 5] = 0xF0  # V1 topic length byte read as signed: -16
    assert not _check_never_raises(bad).success
    assert _decode_only_corrupt_error(bad) is None


def test_random_garbage_never_raises():
    rnd = random.Random(20240601)
    magics = [struct.pack(">i", m) for m in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2,
                                             codec.BLANK_MAGIC_CODE)]
    for _ in range(3000):
        n = rnd.randrange(0, 300)
        buf = bytearray(rnd.randbytes(n))
        if n >= 8 and rnd.random() < 0.7:  # make the magic legal so the deeper checks run
            buf[4:8] = rnd.choice(magics)
            if rnd.random() < 0.7:
                struct.pack_into(">i", buf, 0, rnd.randrange(0, n + 1))
        for kw in ({}, {"check_crc": True}, {"check_crc": True, "verify_prop_crc": True}):
            r = _check_never_raises(bytes(buf), **kw)
            assert r.size >= -1
        _decode_only_corrupt_error(bytes(buf), check_crc=True, decompress=True)
    list(codec.iter_records(bytes(rnd.randbytes(1000))))


def test_mutated_records_never_raise():
    rnd = random.Random(7)
    for rec in SAMPLES:
        for _ in range(500):
            bad = bytearray(rec)
            for _ in range(rnd.randrange(1, 4)):
                bad[rnd.randrange(len(bad))] = rnd.randrange(256)
            _check_never_raises(bad, check_crc=True)
            _check_never_raises(bad, check_crc=True, verify_prop_crc=True)
            _decode_only_corrupt_error(bad, decompress=True)


def test_iter_records_stops_at_damage():
    a, b = _record(), _record(topic="Other")
    buf = bytearray(a + b + bytes(16))
    got = list(codec.iter_records(buf, check_crc=True))
    assert [(p, r.success) for p, r in got] == [(0, True), (len(a), True), (len(a) + len(b), False)]
    buf[len(a) + BODY] ^= 1  # corrupt the second body
    got = list(codec.iter_records(buf, check_crc=True))
    assert [(p, r.success) for p, r in got] == [(0, True), (len(a), False)]


def test_decompress_zlib_body():
    raw = b"z" * 1200
    rec = _record(body=zlib.compress(raw), sys_flag=codec.COMPRESSED_FLAG)
    m = codec.decode_message(rec, decompress=True, check_crc=True)
    assert m.body == raw and m.sys_flag == 0
    m = codec.decode_message(rec)
    assert m.body == zlib.compress(raw) and m.sys_flag == codec.COMPRESSED_FLAG
    # a body flagged compressed that is not zlib is left as stored
    m = codec.decode_message(_record(body=b"plain", sys_flag=codec.COMPRESSED_FLAG), decompress=True)
    assert m.body == b"plain" and m.sys_flag & codec.COMPRESSED_FLAG


# -- batch body (MessageDecoder.encodeMessage) ------------------------------------------------------
def test_batch_body_layout():
    data = codec.encode_batch_body([(b"ab", 7, "k\x01v\x02")])
    assert data == struct.pack(">iiiii", 28, 0, 0, 7, 2) + b"ab" + struct.pack(">h", 4) + b"k\x01v\x02"
    assert codec.decode_batch_body(data) == [(b"ab", 7, "k\x01v\x02")]
    assert codec.decode_batch_body(b"") == []
    for bad in (data[:-1], data + b"\x00", struct.pack(">iiiii", 10, 0, 0, 0, 0) + bytes(5)):
        with pytest.raises(ValueError):
            codec.decode_batch_body(bad)


# -- the put path's split encoder (prepare outside the lock, emit inside) equals encode_record ----------
@pytest.mark.parametrize("born_host", [None, "10.1.2.3:4000", "[2001:db8::5]:4001"])
@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[::1]:10911"])
@pytest.mark.parametrize("append_crc", [False, True])
def test_prepare_emit_equals_encode_record(born_host: str | None, store_host: str, append_crc: bool) -> None:
    enc = codec.RecordEncoder(store_host, append_crc=append_crc)
    msg = Message(topic="TopicTest", body=b"payload" * 7, tags="TagA", keys=["k1", "k2"], queue_id=3, flag=-2,
                  born_host=born_host, born_timestamp=1700000000001, reconsume_times=2,
                  properties={"a": "b"})
    rec = enc.prepare(msg, "C0A8011400004E21000000000000000A")
    parts: list = []
    codec.RecordEncoder.emit(rec, 41, 123456, codec.encode_store_timestamp(1700000000999), parts)
    got = b"".join(parts)
    want = codec.encode_record(
        topic="TopicTest", body=b"payload" * 7, properties_string=rec.properties_string, queue_id=3, flag=-2,
        queue_offset=41, physical_offset=123456, born_timestamp=1700000000001,
        born_host=codec.parse_host(born_host) if born_host else codec.parse_host(store_host),
        store_timestamp=1700000000999, store_host=codec.parse_host(store_host), reconsume_times=2,
        append_crc=append_crc)
    assert got == bytes(want)
    assert rec.total == len(want)
    r = codec.check_message_and_return_size(got, 0, True)
    assert r.success and r.size == len(got)
    assert (r.request.keys, r.request.uniq_key, r.request.tags_code) == ("k1 k2", rec.uniq_key, codec.java_string_hash("TagA"))
