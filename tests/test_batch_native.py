"""The batch send in C (issue 16, branch send-batch) against its pure-Python references, in one process,
whatever `RMQ_EVENTSTORE_PURE` says (PURE_TESTS runs it in both passes of `make test`):

* `_native.decode_batch_messages` (the broker's decode of a SEND_BATCH_MESSAGE body into Messages) must
  give what `codec.decode_batch_messages_py` gives, field for field, and the same ValueError text on a
  malformed body (truncated, bad sizes, bad property lengths, bad UTF-8 in properties);
* `_native.join_message_ids` (the response's msgId list) must give `message_id.join_message_ids_py`'s text,
  or None where the reference raises;
* `_native.encode_batch_body` (the client's body) must give `codec.encode_batch_body_py`'s bytes, or None
  where the reference raises.

The tests skip when the extension is not built, unless `RMQ_EVENTSTORE_REQUIRE_NATIVE=1`.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import Broker
from rmq_eventstore.client.producer import Producer
from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from rmq_eventstore.common.message_id import join_message_ids_py
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore
from tests.conftest import SMALL_GEOMETRY, import_native

_native = import_native()
_native.init(Message)

HEADER = ("Topic", 3, 0, 1700000000000, "10.0.0.1:5555", 2)
props_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
parts = st.lists(st.tuples(st.binary(max_size=64), st.integers(-2**31, 2**31 - 1), props_text), max_size=12)


def _fields(m: Message) -> dict:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(Message)}


def _decode_both(data: bytes, header: tuple = HEADER) -> tuple[object, object]:
    def run(fn):  # noqa: ANN001, ANN202
        try:
            return [_fields(m) for m in fn(data, *header)]
        except ValueError as e:
            return ("ValueError", str(e))
    return run(_native.decode_batch_messages), run(codec.decode_batch_messages_py)


def test_message_field_count_is_the_dataclass() -> None:
    assert _native.MESSAGE_FIELD_COUNT == len(dataclasses.fields(Message)) == len(Message.__slots__)
    assert codec.batch_native is (_native if codec.NATIVE else None)


@settings(max_examples=300, deadline=None)
@given(parts)
def test_decode_good_bodies(ps: list) -> None:
    data = codec.encode_batch_body_py(ps)
    c, py = _decode_both(data)
    assert c == py
    assert [(m["body"], m["flag"], m["properties_string"]) for m in c] == ps
    for m in _native.decode_batch_messages(data, *HEADER):
        assert type(m) is Message and type(m.body) is bytes and m.tags is None and m.force_v2 is False


@settings(max_examples=600, deadline=None)
@given(parts, st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4), st.integers(0, 400))
def test_decode_damaged_bodies(ps: list, flips: list, cut: int) -> None:
    data = bytearray(codec.encode_batch_body_py(ps))
    for i, v in flips:
        if i < len(data):
            data[i] = v
    data = bytes(data[:len(data) - cut % (len(data) + 1)]) if data else bytes(data)
    c, py = _decode_both(data)
    assert c == py


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_decode_random_bytes(data: bytes) -> None:
    c, py = _decode_both(data)
    assert c == py


def _inner(size: int, blen: int, plen: int, body: bytes = b"", props: bytes = b"", flag: int = 0) -> bytes:
    return struct.pack(">iiiii", size, 0, 0, flag, blen) + body + struct.pack(">h", plen) + props


@pytest.mark.parametrize(("data", "error"), [
    (b"\x00" * 21, "batch body truncated at 0"),
    (_inner(21, 0, 0), "bad inner message size at 0"),
    (_inner(10**6, 0, 0), "bad inner message size at 0"),
    (_inner(22, -1, 0), "bad inner message size at 0"),
    (_inner(24, 3, 0, b"abc"), "bad inner message size at 0"),
    (_inner(25, 3, -1, b"abc"), "bad inner properties length at 0"),
    (_inner(26, 3, 1, b"abc", b"p") + b"x" * 5, "batch body truncated at 26"),
    (_inner(26, 3, 0, b"abc", b"x"), "bad inner properties length at 0"),
    (_inner(22, 0, 0) + _inner(40, 0, 0) + b"\x00" * 10, "bad inner message size at 22"),
])
def test_decode_errors_name_the_position(data: bytes, error: str) -> None:
    c, py = _decode_both(data)
    assert c == py == ("ValueError", error)


def test_decode_bad_utf8_is_replaced_and_header_objects_kept() -> None:
    data = _inner(22 + 2 + 3, 2, 3, b"hi", b"\xff\xfeA", flag=-7)
    born = "[::1]:9"
    c, py = _decode_both(data, ("T", -1, 4, 0, born, 0))
    assert c == py and c[0]["properties_string"] == "\ufffd\ufffdA" and c[0]["flag"] == -7
    assert _native.decode_batch_messages(data, "T", -1, 4, 0, born, 0)[0].born_host is born
    assert _native.decode_batch_messages(data, "T", -1, 4, 0, None, 0)[0].born_host is None
    assert _native.decode_batch_messages(b"", *HEADER) == codec.decode_batch_messages_py(b"", *HEADER) == []
    assert _native.decode_batch_messages(bytearray(data), *HEADER) is None  # the reference decides


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"\x7f\x00\x00\x01", b"\x0a\x00\x00\x02", bytes(range(16)), b""]),
       st.integers(-2**31, 2**31 - 1), st.lists(st.integers(-2**63, 2**63 - 1), max_size=20))
def test_join_message_ids(host: bytes, port: int, offsets: list) -> None:
    assert _native.join_message_ids(host, port, offsets) == join_message_ids_py(host, port, offsets)
    assert codec.join_message_ids(host, port, offsets) == join_message_ids_py(host, port, offsets)


@pytest.mark.parametrize(("port", "offsets"), [(2**31, [1]), (-2**31 - 1, [1]), (1, [2**63]), (1, [-2**63 - 1]),
                                               (1, [1, "2"]), (1, [1.0])])
def test_join_message_ids_out_of_range_falls_back(port: int, offsets: list) -> None:
    assert _native.join_message_ids(b"\x7f\x00\x00\x01", port, offsets) is None
    with pytest.raises((struct.error, TypeError)):
        join_message_ids_py(b"\x7f\x00\x00\x01", port, offsets)
    with pytest.raises((struct.error, TypeError)):
        codec.join_message_ids(b"\x7f\x00\x00\x01", port, offsets)


@settings(max_examples=300, deadline=None)
@given(parts)
def test_encode_batch_body(ps: list) -> None:
    assert _native.encode_batch_body(ps) == codec.encode_batch_body_py(ps) == codec.encode_batch_body(ps)


@pytest.mark.parametrize("bad", [
    [(b"x", 2**31, "")], [(b"x", -2**31 - 1, "")], [(b"x", 0, "a" * 32768)], [(b"x", 0, "\ud800")],
    [(bytearray(b"x"), 0, "")], [(b"x", 0, b"p")], [(b"x", 0)], [(b"x", 1.5, "")],
])
def test_encode_batch_body_leaves_the_bad_to_the_reference(bad: list) -> None:
    assert _native.encode_batch_body(bad) is None
    try:
        expected = codec.encode_batch_body_py(bad)
    except (struct.error, UnicodeEncodeError, TypeError, ValueError, AttributeError) as e:
        with pytest.raises(type(e)):
            codec.encode_batch_body(bad)
    else:
        assert codec.encode_batch_body(bad) == expected


def test_encode_batch_body_utf8_and_limits() -> None:
    ok = [(b"", 0, "é" * 16383), (b"b" * 1000, -1, "TAGS\x01日本\x02"), (b"", 2**31 - 1, "a" * 32767)]
    assert _native.encode_batch_body(ok) == codec.encode_batch_body_py(ok)
    assert _native.encode_batch_body([]) == b""
    assert _native.encode_batch_body((ok[0],)) is None  # not a list: the reference decides


# -- the producer's loop: properties + body of Messages (Producer._batch_body_py is the reference) -----------
_PRODUCER = Producer.__new__(Producer)  # _batch_body_py reads no instance state
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
covered_msgs = st.builds(
    Message, topic=st.just("T"), body=st.binary(max_size=40), tags=st.none() | words,
    keys=st.none() | words | st.lists(words, max_size=3) | st.lists(words, max_size=3).map(tuple),
    flag=st.integers(-2**31, 2**31 - 1), uniq_key=st.none() | words,
    properties=st.none() | st.dictionaries(st.sampled_from(["a", "WAIT", "TAGS", "KEYS", "UNIQ_KEY", "é", "DELAY"]),
                                           st.none() | words, max_size=4))
other_msgs = st.one_of(
    st.builds(Message, topic=st.just("T"), body=st.binary(max_size=8), properties_string=words),
    st.builds(Message, topic=st.just("T"), body=st.binary(max_size=8).map(bytearray)),
    st.builds(Message, topic=st.just("T"), tags=st.just("\ud800")),
    st.builds(Message, topic=st.just("T"), keys=st.just(["a", 1])),
    st.builds(Message, topic=st.just("T"), properties=st.just({"a": 1})),
    st.builds(Message, topic=st.just("T"), flag=st.just(True)),
)


def _uniqs(n: int) -> list[str]:
    return [f"7F00000100002A9F0000000000{i:06X}" for i in range(n)]


@settings(max_examples=400, deadline=None)
@given(st.lists(covered_msgs, min_size=1, max_size=8))
def test_encode_batch_messages_covered(msgs: list) -> None:
    uniqs = _uniqs(len(msgs))
    c = _native.encode_batch_messages(msgs, uniqs)
    assert c is not None
    assert c == _PRODUCER._batch_body_py(msgs, uniqs)
    assert _native.encode_batch_messages(tuple(msgs), uniqs) == c


@settings(max_examples=300, deadline=None)
@given(st.lists(covered_msgs | other_msgs, min_size=1, max_size=6))
def test_encode_batch_messages_leaves_the_rest_to_the_reference(msgs: list) -> None:
    uniqs = _uniqs(len(msgs))
    c = _native.encode_batch_messages(msgs, uniqs)
    try:
        py = _PRODUCER._batch_body_py(msgs, uniqs)
    except (UnicodeEncodeError, TypeError, struct.error) as e:
        assert c is None, e
        return
    assert c is None or c == py


def test_encode_batch_messages_wait_and_limits() -> None:
    one = Message(topic="T", body=b"x", tags="WAIT\x01x")  # WAIT already in the properties: not added
    assert _native.encode_batch_messages([one], _uniqs(1)) == _PRODUCER._batch_body_py([one], _uniqs(1))
    assert b"WAIT\x01true" not in _native.encode_batch_messages([one], _uniqs(1))[0]
    big = Message(topic="T", tags="t" * 40000)
    assert _native.encode_batch_messages([big], _uniqs(1)) is None
    with pytest.raises(struct.error):
        _PRODUCER._batch_body_py([big], _uniqs(1))
    assert _native.encode_batch_messages([one], _uniqs(2)) is None  # lengths differ
    assert _native.encode_batch_messages([object()], _uniqs(1)) is None


# -- the broker's end to end: a SEND_BATCH_MESSAGE stored through the C path and through the Python one ---------
def _send_batch(broker: Broker, body: bytes, queue_id: int = 1) -> tuple[int, str | None, list[tuple]]:
    req = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {"b": "BatchTopic", "e": queue_id, "g": 1234,
                                                                     "a": "g", "c": "TBW102", "d": 4, "f": 0}, body)
    res = broker.processor_for(RequestCode.SEND_BATCH_MESSAGE).process(req, _Channel())
    stored = []
    if res.code == ResponseCode.SUCCESS:
        for mid in res.ext_fields["msgId"].split(","):
            m = broker.store.look_message_by_offset(codec.decode_message_id(mid)[2])
            uniq = m.properties.get("UNIQ_KEY", "")
            stored.append((m.topic, m.queue_id, bytes(m.body), m.flag,
                           m.properties_string.replace(uniq, "<uniq>") if uniq else m.properties_string))
        stored.append(("ext", res.ext_fields["queueId"], res.ext_fields["queueOffset"]))
    return res.code, res.remark, stored


class _Channel:
    remote_address = "10.1.2.3:4567"


U = "UNIQ_KEY\x017F0000010000000000000000000001\x02"
BATCHES = [
    [(b"a", 0, U), (b"b", 5, "TAGS\x01t\x02" + U + "x\x01y")],  # one without a trailing separator
    [(b"a", 0, U + "CLUSTER\x01Other\x02"), (b"", -1, U + "KEYS\x01k1 k2\x02")],  # CLUSTER kept
    [(b"a", 0, "TAGS\x01t\x02")],  # no UNIQ_KEY: the broker creates one (the Python loop)
    [(b"a", 0, U), (b"b", 0, U + "DELAY\x013\x02")],  # a delayed message in a batch: refused
    [(b"a", 0, U + "TIMER_DELIVER_MS\x0199\x02")],  # a timer message in a batch
    [(b"a", 0, U + "DELAYX\x01no\x02")],  # DELAY in a name that is not a level: the Python loop decides
    [(b"a", 0, ""), (b"x" * 300, 2, U)],  # empty properties: UNIQ_KEY created
    [(b"\x00\xff", 2**31 - 1, U + "é\x01日本\x02")],
]


def test_broker_batch_c_and_python_paths_store_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for mode in ("c", "py"):  # the C loops on or off, whatever RMQ_EVENTSTORE_PURE says
        monkeypatch.setattr(codec, "batch_native", _native if mode == "c" else None)
        with MessageStore.open(tmp_path / mode, **SMALL_GEOMETRY) as store:
            b = Broker(store)
            b.start()
            try:
                results.append([_send_batch(b, codec.encode_batch_body_py(parts)) for parts in BATCHES]
                               + [_send_batch(b, b"\x00\x00\x00\x05" + b"\x00" * 30)])
            finally:
                b.shutdown()
    c, py = results
    assert c == py
    assert c[0][0] == ResponseCode.SUCCESS and "CLUSTER\x01DefaultCluster\x02" in c[0][2][0][4]
    assert c[0][2][1][4].endswith("x\x01y\x02CLUSTER\x01DefaultCluster\x02")
    assert c[3][0] == ResponseCode.MESSAGE_ILLEGAL and c[-1][0] == ResponseCode.MESSAGE_ILLEGAL


def test_decorate_batch_changes_nothing_when_it_declines() -> None:
    msgs = [Message(topic="A", properties_string=U), Message(topic="A", properties_string="DELAY\x011\x02" + U)]
    before = [dataclasses.replace(m) for m in msgs]
    assert _native.decorate_batch(msgs, "B", 3, "UNIQ_KEY\x01", "CLUSTER\x01", "CLUSTER\x01c\x02") is False
    assert msgs == before
    assert _native.decorate_batch(msgs[:1], "B", 3, "UNIQ_KEY\x01", "CLUSTER\x01", "CLUSTER\x01c\x02") is True
    assert (msgs[0].topic, msgs[0].queue_id, msgs[0].properties_string) == ("B", 3, U + "CLUSTER\x01c\x02")
    # a cluster name holding DELAY makes every message look delayed, as in the Python loop
    assert _native.decorate_batch([Message(topic="A", properties_string=U)], "B", 3, "UNIQ_KEY\x01", "CLUSTER\x01",
                                  "CLUSTER\x01DELAY\x02") is False
    assert _native.decorate_batch([Message(topic="A", properties_string="")], "B", 3, None, "CLUSTER\x01",
                                  "CLUSTER\x01c\x02") is True
