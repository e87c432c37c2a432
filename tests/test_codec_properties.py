"""Property-based tests (hypothesis) of the record codec: encode → decode round trips over arbitrary
topics, bodies, properties, hosts, flags and offsets, with and without the `__CRC32#` trailer; the reader
on damaged input; and the helper codecs (Java hashes, properties, hosts, message ids, batch bodies)."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOPIC_CHARS = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
INT32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
INT64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
OFFSET = st.integers(0, 2 ** 63 - 1)

topics_v1 = st.text(alphabet=TOPIC_CHARS, min_size=1, max_size=127)
topics_long = st.text(alphabet=TOPIC_CHARS, min_size=128, max_size=400)
topics = st.one_of(topics_v1, topics_long)
bodies = st.one_of(st.binary(max_size=64), st.binary(min_size=64, max_size=5000))
# property names/values: non-empty, any unicode except the two separators (and lone surrogates)
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1,
    max_size=24)
prop_keys = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "__CRC32#"]), prop_text)
properties = st.dictionaries(prop_keys, prop_text, max_size=8)
ports = st.integers(0, 65535)
ipv4 = st.ip_addresses(v=4).map(lambda a: a.packed)
ipv6 = st.ip_addresses(v=6).map(lambda a: a.packed)
hosts = st.tuples(st.one_of(ipv4, ipv6), ports)
tx_bits = st.sampled_from([codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_PREPARED_TYPE,
                           codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE])
other_bits = st.sets(st.sampled_from([codec.COMPRESSED_FLAG, codec.MULTI_TAGS_FLAG, codec.NEED_UNWRAP_FLAG,
                                      codec.INNER_BATCH_FLAG, codec.COMPRESSION_LZ4_TYPE,
                                      codec.COMPRESSION_ZSTD_TYPE, codec.BORNHOST_V6_FLAG,
                                      codec.STOREHOSTADDRESS_V6_FLAG])).map(sum)
sys_flags = st.tuples(tx_bits, other_bits).map(lambda t: t[0] | t[1])


def _java_hash_reference(s: str) -> int:
    h = 0
    units = s.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _java_host_text(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.version == 4:
        return f"{ip}:{port}"
    return "[" + ":".join(f"{int(g, 16):x}" for g in ip.exploded.split(":")) + f"]:{port}"


@st.composite
def messages(draw):
    props = draw(properties)
    ps = codec.properties_to_string(props)
    if ps and draw(st.booleans()):
        ps = ps[:-1]  # the 5.1.x form: no trailing separator
    return dict(
        topic=draw(topics), body=draw(bodies), properties_string=ps, queue_id=draw(INT32),
        flag=draw(INT32), queue_offset=draw(OFFSET), physical_offset=draw(OFFSET), sys_flag=draw(sys_flags),
        born_timestamp=draw(INT64), born_host=draw(hosts), store_timestamp=draw(INT64),
        store_host=draw(hosts), reconsume_times=draw(INT32), prepared_transaction_offset=draw(OFFSET),
        force_v2=draw(st.booleans()), append_crc=draw(st.booleans()),
    )


def _expected_properties_string(kw: dict) -> str | None:
    """The stored properties without the trailer's 10 digits (None: can't predict, digits only)."""
    ps = kw["properties_string"]
    if not kw["append_crc"]:
        return ps
    ps = codec.delete_property(ps, codec.PROPERTY_CRC32)
    if ps and not ps.endswith("\x02"):
        ps += "\x02"
    return ps + codec.PROPERTY_CRC32 + "\x01"


@SETTINGS
@given(kw=messages(), prefix=st.binary(max_size=40), suffix=st.binary(max_size=40))
def test_encode_decode_round_trip(kw, prefix, suffix):
    rec = codec.encode_record(**kw)
    v2 = kw["force_v2"] or len(kw["topic"]) > 127
    born_v6, store_v6 = len(kw["born_host"][0]) == 16, len(kw["store_host"][0]) == 16
    flags = (kw["sys_flag"] & ~0x30) | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    want_ps = _expected_properties_string(kw)
    ps_len = len(want_ps.encode()) + (11 if kw["append_crc"] else 0)
    assert len(rec) == codec.cal_msg_length(len(kw["body"]), len(kw["topic"]), ps_len, flags, v2)

    buf = prefix + bytes(rec) + suffix
    pos = len(prefix)
    m = codec.decode_message(buf, pos, check_crc=True, limit=pos + len(rec))
    assert m.store_size == len(rec)
    assert m.magic_code == (codec.MESSAGE_MAGIC_CODE_V2 if v2 else codec.MESSAGE_MAGIC_CODE)
    assert m.body_crc == codec.body_crc(kw["body"])
    assert bytes(m.body) == kw["body"] and m.topic == kw["topic"]
    assert (m.queue_id, m.flag, m.queue_offset, m.commit_log_offset, m.sys_flag) == (
        kw["queue_id"], kw["flag"], kw["queue_offset"], kw["physical_offset"], flags)
    assert (m.born_timestamp, m.store_timestamp, m.reconsume_times, m.prepared_transaction_offset) == (
        kw["born_timestamp"], kw["store_timestamp"], kw["reconsume_times"], kw["prepared_transaction_offset"])
    assert (m.born_host_bytes, m.born_port) == kw["born_host"]
    assert (m.store_host_bytes, m.store_port) == kw["store_host"]
    assert m.born_host == _java_host_text(*kw["born_host"])
    assert m.store_host == _java_host_text(*kw["store_host"])
    assert m.msg_id == codec.create_message_id(*kw["store_host"], kw["physical_offset"])

    props = codec.string_to_properties(kw["properties_string"])
    if kw["append_crc"]:
        assert m.properties_string[:-11] == want_ps
        digits = m.properties_string[-11:-1]
        assert m.properties_string[-1] == "\x02" and digits.isdigit()
        assert codec.parse_crc32_property_value(digits) == codec.body_crc(rec[:-codec.CRC32_RESERVED_LEN])
        props.pop(codec.PROPERTY_CRC32, None)
        props[codec.PROPERTY_CRC32] = digits
    else:
        assert m.properties_string == want_ps
    assert m.properties == props

    for verify in (False, True) if kw["append_crc"] else (False,):
        r = codec.check_message_and_return_size(buf, pos, check_crc=True, limit=len(buf), verify_prop_crc=verify)
        assert r.success and r.size == len(rec), r
        req = r.request
        assert (req.topic, req.queue_id, req.commit_log_offset, req.msg_size, req.store_timestamp,
                req.consume_queue_offset, req.sys_flag, req.prepared_transaction_offset) == (
            kw["topic"], kw["queue_id"], kw["physical_offset"], len(rec), kw["store_timestamp"],
            kw["queue_offset"], flags, kw["prepared_transaction_offset"])
        assert req.tags_code == (codec.java_string_hash(props["TAGS"]) if "TAGS" in props else 0)
        assert req.keys == props.get("KEYS") and req.uniq_key == props.get("UNIQ_KEY")
        assert req.properties_string == m.properties_string


@SETTINGS
@given(kw=messages(), data=st.data())
def test_flipping_a_body_byte_fails_the_crc_check(kw, data):
    assume(kw["body"])
    rec = codec.encode_record(**kw)
    body_at = codec._HEADER_SIZES[(2 if len(kw["born_host"][0]) == 16 else 0)
                                  + (1 if len(kw["store_host"][0]) == 16 else 0)]
    assert bytes(rec[body_at:body_at + len(kw["body"])]) == kw["body"]
    i = data.draw(st.integers(0, len(kw["body"]) - 1))
    x = data.draw(st.integers(1, 255))
    rec[body_at + i] ^= x
    r = codec.check_message_and_return_size(rec, 0, check_crc=True)
    assert (r.size, r.success) == (-1, False)
    assert codec.check_message_and_return_size(rec, 0, check_crc=False).success
    if kw["append_crc"]:
        assert not codec.check_message_and_return_size(rec, 0, check_crc=True, verify_prop_crc=True).success


@FAST
@given(kw=messages(), data=st.data())
def test_damaged_records_never_raise(kw, data):
    rec = codec.encode_record(**kw)
    mode = data.draw(st.sampled_from(["truncate", "mutate", "both"]))
    bad = bytearray(rec)
    if mode in ("mutate", "both"):
        for _ in range(data.draw(st.integers(1, 4))):
            bad[data.draw(st.integers(0, len(bad) - 1))] = data.draw(st.integers(0, 255))
    if mode in ("truncate", "both"):
        bad = bad[:data.draw(st.integers(0, len(bad) - 1))]
    for verify in (False, True):
        r = codec.check_message_and_return_size(bytes(bad), 0, check_crc=True, verify_prop_crc=verify)
        assert r.size >= -1 and (r.request is None) == (not r.success or r.size == 0)
    try:
        codec.decode_message(bytes(bad), 0, check_crc=True, decompress=True)
    except codec.CorruptRecordError:
        pass
    if mode != "mutate":
        assert not codec.check_message_and_return_size(bytes(bad), 0).success


@FAST
@given(st.binary(max_size=400), st.sampled_from([None, codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2]))
def test_garbage_never_raises(data, magic):
    buf = bytearray(data)
    if magic is not None and len(buf) >= 8:
        struct.pack_into(">i", buf, 4, magic)
    r = codec.check_message_and_return_size(bytes(buf), 0, check_crc=True)
    assert isinstance(r, codec.CheckResult)
    try:
        codec.decode_message(bytes(buf), 0, check_crc=True, decompress=True)
    except codec.CorruptRecordError:
        pass
    list(codec.iter_records(bytes(buf), check_crc=True))


# -- the client encoder --------------------------------------------------------------------------------
@SETTINGS
@given(topic=topics_v1, body=bodies, tags=st.one_of(st.none(), prop_text), keys=st.lists(prop_text, max_size=3),
       extra=properties, born=hosts, store=hosts, flag=INT32)
def test_client_encoder_round_trip(topic, body, tags, keys, extra, born, store, flag):
    assume(all(" " not in k for k in keys))
    extra.pop("TAGS", None)
    extra.pop("KEYS", None)
    rec = codec.encode_client_message(topic=topic, body=body, tags=tags, keys=keys, properties=extra,
                                      born_host=born, store_host=store, flag=flag)
    m = codec.decode_message(rec, check_crc=True)
    assert m.version == "V1" and m.topic == topic and bytes(m.body) == body and m.flag == flag
    want = {}  # in the encoder's insertion order: TAGS, KEYS, then the rest
    if tags:
        want["TAGS"] = tags
    if keys:
        want["KEYS"] = " ".join(keys)
    want.update(extra)
    assert m.properties == want
    assert list(m.properties_string.split("\x02"))[:-1] == [
        f"{k}\x01{want[k]}" for k in codec.java_hashmap_order(list(want))]


class _JavaHashMap:
    """A literal model of java.util.HashMap's table (buckets as lists, resize by lo/hi split)."""

    def __init__(self, cap: int = 16) -> None:
        self.table: list[list[str]] = [[] for _ in range(cap)]
        self.size = 0

    @staticmethod
    def _hash(k: str) -> int:
        h = _java_hash_reference(k) & 0xFFFFFFFF
        return h ^ (h >> 16)

    def put(self, k: str) -> None:
        b = self.table[self._hash(k) & (len(self.table) - 1)]
        if k in b:
            return
        b.append(k)
        self.size += 1
        if self.size > len(self.table) * 3 // 4:
            old, n = self.table, len(self.table)
            self.table = [[] for _ in range(2 * n)]
            for i, bucket in enumerate(old):
                lo = [x for x in bucket if not self._hash(x) & n]
                hi = [x for x in bucket if self._hash(x) & n]
                self.table[i], self.table[i + n] = lo, hi

    def keys(self) -> list[str]:
        return [k for b in self.table for k in b]


@FAST
@given(st.lists(st.one_of(prop_text, st.text(alphabet="ABab", min_size=1, max_size=3)), max_size=60))
def test_java_hashmap_order_matches_a_table_model(keys):
    model = _JavaHashMap()
    for k in keys:
        model.put(k)
    assert codec.java_hashmap_order(keys) == model.keys()


# -- helpers -------------------------------------------------------------------------------------------
unicode_strings = st.text(max_size=40) | st.text(alphabet=st.characters(min_codepoint=0x10000), max_size=10)


@FAST
@given(st.lists(unicode_strings | st.just(""), max_size=30))
def test_java_string_hashes_equals_scalar(strings):
    got = codec.java_string_hashes(strings).tolist()
    assert got == [codec.java_string_hash(s) for s in strings]
    assert got == [_java_hash_reference(s) for s in strings]


@FAST
@given(unicode_strings | st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x2FF), max_size=20))
def test_java_string_hash_native_equals_the_python_reference(s):
    """`_native.java_hash` (what `java_string_hash` uses when the native core is active) against the Python
    reference, over Latin-1, BMP and astral strings."""
    from rmq_eventstore.common import tags

    assert tags.java_string_hash(s) == tags.java_string_hash_py(s) == _java_hash_reference(s)
    if tags._java_hash is not None:
        assert tags._java_hash(s) == _java_hash_reference(s)


def test_java_string_hash_of_a_lone_surrogate_is_left_to_the_python_reference():
    """A str with a lone surrogate has no UTF-16 form: C declines (None) and the reference raises, as before."""
    from rmq_eventstore.common import tags

    if tags._java_hash is not None:
        assert tags._java_hash("a\ud800b") is None
        with pytest.raises(TypeError):
            tags._java_hash(b"bytes")
    with pytest.raises(UnicodeEncodeError):
        tags.java_string_hash("a\ud800b")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=500, max_size=700), min_size=1, max_size=3))
def test_java_string_hashes_long_strings(strings):
    assert codec.java_string_hashes(strings).tolist() == [_java_hash_reference(s) for s in strings]
    assert [codec.java_string_hash(s) for s in strings] == [_java_hash_reference(s) for s in strings]


@FAST
@given(properties)
def test_properties_round_trip(props):
    s = codec.properties_to_string(props)
    assert codec.string_to_properties(s) == props
    assert codec.string_to_properties(s[:-1] if s else s) == props  # 5.1.x form
    for k in props:
        rest = codec.delete_property(s, k)
        assert codec.string_to_properties(rest) == {x: v for x, v in props.items() if x != k}


@FAST
@given(st.lists(st.sampled_from(["A", "B", "AB", "C", "", "A\x01", "\x01x"]), max_size=8).map("\x02".join)
       | st.text(alphabet="AB\x01\x02x", max_size=24),
       st.lists(st.sampled_from(["A", "B", "AB", "C", "D"]), max_size=4))
def test_delete_properties_is_delete_property_applied_in_turn(props, names):
    """One pass over the string gives exactly what cutting each name in turn gives (separators, duplicates,
    a missing trailing separator, segments without a value)."""
    from rmq_eventstore.common.properties import delete_properties

    expected = props
    for n in names:
        expected = codec.delete_property(expected, n)
    assert delete_properties(props, names) == expected


@FAST
@given(st.ip_addresses(), ports)
def test_parse_and_format_host(ip, port):
    text = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    addr, p = codec.parse_host(text)
    mapped = ip.version == 6 and ip.ipv4_mapped is not None
    assert p == port
    assert addr == (ip.ipv4_mapped.packed if mapped else ip.packed)
    shown = codec.format_host(ip.packed, port)
    assert shown == _java_host_text(ip.packed, port)
    assert codec.parse_host(shown) == (addr, port)


@FAST
@given(st.one_of(ipv4, ipv6), INT32, OFFSET)
def test_message_id_round_trip(addr, port, offset):
    mid = codec.create_message_id(addr, port, offset)
    assert len(mid) == (32 if len(addr) == 4 else 56) and mid == mid.upper()
    assert codec.decode_message_id(mid) == (addr, port, offset)
    assert codec.decode_message_id(mid.lower()) == (addr, port, offset)


@FAST
@given(st.lists(st.tuples(st.binary(max_size=300), INT32, st.text(max_size=50)), max_size=10))
def test_batch_body_round_trip(msgs):
    data = codec.encode_batch_body(msgs)
    assert codec.decode_batch_body(data) == msgs
    if data:
        try:
            codec.decode_batch_body(data[:-1])
        except ValueError:
            pass
        else:
            raise AssertionError("a truncated batch body must not decode")


# -- the batch put's fast path writes exactly what prepare + emit write --------------------------------------
_plain_messages = st.lists(
    st.builds(
        Message,
        topic=st.sampled_from(["TopicA", "%RETRY%g", "t-1"]),
        body=st.binary(max_size=300),
        tags=st.none() | st.text(alphabet="abcXYZ_|é", min_size=1, max_size=8),
        keys=st.none() | st.lists(st.text(alphabet="k0123-", min_size=1, max_size=6), max_size=3),
        queue_id=st.integers(0, 3),
        flag=st.integers(-(2**31), 2**31 - 1),
        uniq_key=st.none() | st.just("0A0B0C0D0E0F00000000000000000001"),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(msgs=_plain_messages, store_host=st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]),
       base=st.integers(0, 2**40), append_crc=st.booleans())
def test_encode_plain_batch_equals_prepare_and_emit(msgs, store_host, base, append_crc):
    """Also with the `__CRC32#` trailer (`enabled_append_prop_crc`): the general path is `encode_record`'s."""
    enc = codec.RecordEncoder(store_host, append_crc=append_crc)
    for t in ("TopicA", "%RETRY%g", "t-1"):
        enc._topic_part(t, False)  # topics are cached once validated by the put path
    now = 1_700_000_000_123
    uniq = [f"{i:032X}" for i in range(len(msgs))]
    table = {"TopicA-1": 7}
    batch = enc.encode_plain_batch(msgs, uniq, table, base, now)
    assert batch is not None and table == {"TopicA-1": 7}  # the caller applies the new offsets
    parts: list = []
    queue = dict(table)
    phys = base
    for m, u in zip(msgs, uniq, strict=True):
        rec = enc.prepare(m, u, now)
        key = f"{m.topic}-{m.queue_id}"
        q = queue.get(key, 0)
        queue[key] = q + 1
        codec.RecordEncoder.emit(rec, q, phys, codec.encode_store_timestamp(now), parts)
        phys += rec.total
    assert batch.data == b"".join(bytes(p) for p in parts)
    assert {k: v for k, v in queue.items() if k in batch.queue_offsets} == batch.queue_offsets
    # and the dispatch requests are what the reput would parse back from those bytes (the trailer aside)
    pos = 0
    for req in batch.requests:
        r = codec.check_message_and_return_size(batch.data, pos, True, verify_prop_crc=append_crc)
        got = r.request
        if append_crc:
            got = got._replace(properties_string=codec.delete_property(got.properties_string, codec.PROPERTY_CRC32))
        assert r.success and got == req
        pos += r.size


def test_encode_plain_batch_declines_what_is_not_plain():
    enc = codec.RecordEncoder()
    enc._topic_part("T", False)
    for m in (Message(topic="T", body=b"x", properties={"a": "b"}), Message(topic="T", body=b"x", born_host="1.2.3.4:5"),
              Message(topic="T", body=b"x", sys_flag=8), Message(topic="new", body=b"x"),
              Message(topic="T", body=b"x", properties_string="a\x01b"), Message(topic="T", body=b"x" * (4 * 2**20 + 1))):
        table: dict[str, int] = {}
        assert enc.encode_plain_batch([Message(topic="T", body=b"ok"), m], None, table, 0, 1) is None
        assert table == {}


# -- the network put's fast path (messages with a properties string) writes what prepare + emit write --------
_props_strings = st.tuples(
    st.lists(st.tuples(prop_keys, prop_text), max_size=8), st.booleans(),
).map(lambda t: "".join(f"{k}\x01{v}\x02" for k, v in t[0])[: None if t[1] else -1])
_network_messages = st.lists(
    st.builds(
        Message,
        topic=st.sampled_from(["TopicA", "%RETRY%g", "t-1", "L" * 200]),
        body=st.binary(max_size=300),
        queue_id=st.integers(0, 3),
        flag=INT32,
        properties_string=_props_strings,
        sys_flag=st.tuples(st.sampled_from([codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_COMMIT_TYPE]),
                           other_bits, st.sampled_from([0, codec.BORNHOST_V6_FLAG, codec.STOREHOSTADDRESS_V6_FLAG]))
        .map(sum),
        born_timestamp=st.just(0) | st.integers(1, 2**62),
        born_host=st.none() | hosts.map(lambda h: codec.format_host(*h)),
        reconsume_times=INT32,
        prepared_transaction_offset=INT64,
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=_network_messages, store_host=st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]),
       base=st.integers(0, 2**40), append_crc=st.booleans())
def test_encode_network_batch_equals_prepare_and_emit(msgs, store_host, base, append_crc):
    """Also with the `__CRC32#` trailer (`enabled_append_prop_crc`), properties without a final 0x02 included."""
    enc = codec.RecordEncoder(store_host, append_crc=append_crc)
    for t in ("TopicA", "%RETRY%g", "t-1", "L" * 200):
        enc._topic_part(t, False)  # topics are cached once validated by the put path
    now = 1_700_000_000_123
    table = {"TopicA-1": 7}
    framed = ["\x02" + m.properties_string for m in msgs]
    # an empty TAGS/KEYS/UNIQ_KEY value leaves it to the general parse (declined; tested below)
    assume(not any(f"\x02{k}\x01\x02" in f + "\x02" for f in framed for k in ("TAGS", "KEYS", "UNIQ_KEY")))
    # so does a __CRC32# sent by the producer when the trailer is on (declined; tested below)
    assume(not (append_crc and any(codec.PROPERTY_CRC32 in f for f in framed)))
    batch = enc.encode_network_batch(msgs, table, base, now)
    assert batch is not None and table == {"TopicA-1": 7}  # the caller applies the new offsets
    parts: list = []
    queue = dict(table)
    phys = base
    expected_requests = []
    for m in msgs:
        rec = enc.prepare(m, None, now)
        key = f"{m.topic}-{m.queue_id}"
        q = queue.get(key, 0)
        queue[key] = q + 1
        codec.RecordEncoder.emit(rec, q, phys, codec.encode_store_timestamp(now), parts)
        # what CommitLog._append dispatches for the prepared record
        expected_requests.append(codec.DispatchRequest(
            rec.topic, rec.queue_id, phys, rec.total, enc.dispatch_tags_code(rec, now), now, q, rec.keys,
            rec.uniq_key, rec.sys_flag, rec.prepared_transaction_offset, rec.properties_string))
        phys += rec.total
    assert batch.data == b"".join(bytes(p) for p in parts)
    assert batch.requests == expected_requests
    assert batch.uniq_keys == [r.uniq_key for r in expected_requests]
    assert batch.offsets == [r.commit_log_offset for r in expected_requests]
    assert batch.first_queue_offset == expected_requests[0].consume_queue_offset
    assert {k: v for k, v in queue.items() if k in batch.queue_offsets} == batch.queue_offsets
    pos = 0
    for req, m in zip(batch.requests, msgs, strict=True):  # and what the reput would parse back from those bytes
        r = codec.check_message_and_return_size(batch.data, pos, True, verify_prop_crc=append_crc)
        got = r.request
        if append_crc:  # on disk: the properties, a 0x02 if they lacked one, the trailer
            ps = m.properties_string
            assert got.properties_string == ps + ("\x02" if ps and not ps.endswith("\x02") else "") + \
                codec.crc_trailer(codec.body_crc(batch.data[pos:pos + r.size - 20])).decode()
            got = got._replace(properties_string=ps)
        assert r.success and got == req
        pos += r.size


def test_encode_network_batch_declines_what_it_does_not_cover():
    enc = codec.RecordEncoder()
    enc._topic_part("T", False)
    enc._topic_part(codec.SCHEDULE_TOPIC, False)
    ok = Message(topic="T", body=b"ok", properties_string="TAGS\x01a\x02")
    for m in (Message(topic="T", body=b"x"),  # no properties string: the plain path's
              Message(topic="T", body=b"x", properties_string="", sys_flag=codec.TRANSACTION_PREPARED_TYPE),
              Message(topic="T", body=b"x", properties_string="", sys_flag=codec.TRANSACTION_ROLLBACK_TYPE),
              Message(topic="new", body=b"x", properties_string=""),
              Message(topic="T", body=b"x", properties_string="", force_v2=True),
              Message(topic=codec.SCHEDULE_TOPIC, body=b"x", properties_string="DELAY\x011\x02"),
              Message(topic="T", body=b"x", properties_string="TAGS\x01a\x02TAGS\x01\x02"),
              Message(topic="T", body=b"x", properties_string="KEYS\x01\x02"),
              Message(topic="T", body=b"x", properties_string="UNIQ_KEY\x01"),
              Message(topic="T", body=bytearray(b"x"), properties_string=""),
              Message(topic="T", body=b"x", properties_string="p\x01" + "v" * 40000),
              Message(topic="T", body=b"x" * (4 * 2**20 + 1), properties_string=""),
              Message(topic="T", body=b"x", properties_string="", queue_id=-1)):
        table: dict[str, int] = {}
        assert enc.encode_network_batch([ok, m], table, 0, 1) is None, m
        assert table == {}
    crc = codec.RecordEncoder(append_crc=True)
    crc._topic_part("T", False)
    assert crc.encode_network_batch([ok], {}, 0, 1) is not None
    # a __CRC32# sent by the producer is deleted by the general path (`CommitLog.asyncPutMessage`)
    assert crc.encode_network_batch([ok, Message(topic="T", body=b"x", properties_string="__CRC32#\x011\x02")],
                                    {}, 0, 1) is None


# -- the client's batch decoder reads what decode_message reads, record by record ----------------------------
_EXT_FIELDS = ("store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
               "sys_flag", "born_timestamp", "born_host_bytes", "born_port", "store_timestamp", "store_host_bytes",
               "store_port", "reconsume_times", "prepared_transaction_offset", "body", "topic",
               "properties_string")


def _one_by_one(buf: bytes) -> list:
    out, pos = [], 0
    while pos < len(buf):
        m = codec.decode_message(buf, pos, decompress=True)
        out.append(m)
        pos += m.store_size
    return out


def _fields(m) -> tuple:
    return tuple(bytes(getattr(m, f)) if f == "body" else getattr(m, f) for f in _EXT_FIELDS)


@SETTINGS
@given(kws=st.lists(messages(), min_size=1, max_size=6), compress=st.lists(st.booleans(), min_size=6, max_size=6),
       cut=st.integers(0, 2**31))
def test_decode_records_equals_decode_message_one_by_one(kws, compress, cut):
    import zlib

    recs = []
    for kw, z in zip(kws, compress, strict=False):
        if z:  # a ZLIB body with the COMPRESSED bit: inflated by both
            kw = dict(kw, body=zlib.compress(kw["body"]), sys_flag=(kw["sys_flag"] | codec.COMPRESSED_FLAG) & ~0x700)
        recs.append(bytes(codec.encode_record(**kw)))
    buf = b"".join(recs)
    got = codec.decode_records(buf, decompress=True)
    assert [_fields(m) for m in got] == [_fields(m) for m in _one_by_one(buf)]
    assert all(type(m.body) is bytes for m in got)
    assert [_fields(m) for m in codec.decode_records(memoryview(buf), decompress=True)] == [_fields(m) for m in got]
    # a damaged body (cut short, or a byte flipped in a header) fails the same way in both
    bad = buf[:cut % len(buf)] if cut % 2 else bytearray(buf)
    if not cut % 2:
        bad[cut % len(buf)] ^= 0x5A
        bad = bytes(bad)
    try:
        want = [_fields(m) for m in _one_by_one(bad)]
    except codec.CorruptRecordError as e:
        try:
            codec.decode_records(bad, decompress=True)
        except codec.CorruptRecordError as e2:
            assert (e2.offset, e2.reason) == (e.offset, e.reason)
        else:
            raise AssertionError("decode_records accepted what decode_message refused") from None
    else:
        assert [_fields(m) for m in codec.decode_records(bad, decompress=True)] == want
