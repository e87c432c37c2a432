"""A lone caller's `PopConsumer.pop` and `ack_batch` in C (`_native.pop_request_frame`, `_native.pop_take`,
`_native.pop_ack_frame`) against the general path, which stays the definition: the POP_MESSAGE frame is byte for
byte the one `pop` builds and encodes in Python; the messages `pop_take` makes of a lone SUCCESS response have
every field (properties string with its POP_CK handle included) of those `_popped` makes of the decoded
response; the BATCH_ACK_MESSAGE frame is byte for byte `_ack_requests`' command encoded in Python. Where the C
functions decline (None) the general path decides, so each test also checks that the plain shapes are not
declined. Against a real broker: popped messages acked through the C frame are settled, a response the take
declines (no message, an error code, retry-topic messages) ends as the general path ends it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client import Message, MQBrokerError, PopConsumer, Producer
from rmq_eventstore.client import pop_consumer as pop_mod
from rmq_eventstore.client import remoting_client as rc_mod
from rmq_eventstore.client.remoting_client import RemotingClient
from rmq_eventstore.common import MessageExt
from rmq_eventstore.common.codec import encode_record
from rmq_eventstore.common.pop import ExtraInfo
from rmq_eventstore.remoting import FLAG_RESPONSE, FrameDecoder, RemotingCommand, ResponseCode, SerializeType
from tests.conftest import import_native

native = import_native()  # also under RMQ_EVENTSTORE_PURE=1 (make test's second pass): the fixture below turns it on
native.init(Message)  # what codec, remoting.command and the pull read do at import, unless RMQ_EVENTSTORE_PURE=1
native.remoting_init(RemotingCommand, SerializeType.JSON)
native.init_pull(MessageExt)

HOST = (b"\x7f\x00\x00\x01", 10911)


@pytest.fixture(params=["fast", "general"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths of PopConsumer against the same broker: the C one (turned on also under
    RMQ_EVENTSTORE_PURE=1) and the general one (turned off)."""
    fast = request.param == "fast"
    monkeypatch.setattr(pop_mod, "_pop_frame", native.pop_request_frame if fast else None)
    monkeypatch.setattr(pop_mod, "_pop_take", native.pop_take if fast else None)
    monkeypatch.setattr(pop_mod, "_ack_frame", native.pop_ack_frame if fast else None)
    monkeypatch.setattr(pop_mod, "_ack_take", native.pop_ack_take if fast else None)
    monkeypatch.setattr(pop_mod, "_pop_lone", native.pop_lone if fast else None)
    monkeypatch.setattr(pop_mod, "_ack_lone", native.ack_lone if fast else None)
    if fast:
        native.client_lone_init(rc_mod.__dict__)  # what remoting_client does at import, unless RMQ_EVENTSTORE_PURE=1
    return request.param


class _Capture:
    """A client base that records the requests PopConsumer makes and answers `answer` (NO_MESSAGE by default)."""

    timeout = 3.0

    def __init__(self, answer: RemotingCommand | None = None) -> None:
        self.sent: list[RemotingCommand] = []
        self.answer = answer

    def broker_for(self, topic: str) -> str:
        return "127.0.0.1:1"

    def route(self, topic: str, refresh: bool = False):  # noqa: ANN201
        return type("R", (), {"broker_addrs": {"broker-a": "127.0.0.1:1"}})()

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None, ok: tuple = (),
               while_waiting=None) -> RemotingCommand:  # noqa: ANN001
        self.sent.append(cmd)
        if self.answer is not None:
            return self.answer
        return RemotingCommand(ResponseCode.NO_MESSAGE, {}, b"", cmd.opaque, FLAG_RESPONSE)


def consumer(base: object, group: str = "g") -> PopConsumer:
    c = PopConsumer.__new__(PopConsumer)
    c.group = group
    c._base = base  # type: ignore[assignment]
    return c


# -- the POP_MESSAGE frame ------------------------------------------------------------------------------------
INTS = st.one_of(st.integers(-5, 2**40), st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**63, 2**70, True, False, 1.0]))
TEXTS = st.one_of(st.sampled_from(["*", "a || b", "t\u00e9", "\u4e2d", 'q"\\', "\x00\n\x1f", "\ud800", ""]),
                  st.text(max_size=8))


def reference_pop_frame(group: str, topic: str, q: object, mx: object, it: object, pt: object, tags: object,
                        opaque: int) -> bytes | type:
    """The frame the general path of `pop` sends for these arguments, with this opaque (Python codec), or the
    exception it raises."""
    base = _Capture()
    try:
        consumer(base, group).pop(topic, max_nums=mx, invisible_time=it, poll_time=pt, tags=tags,  # type: ignore[arg-type]
                                  queue_id=q)  # type: ignore[arg-type]
        cmd = base.sent[0]
        cmd.opaque = opaque
        return cmd.encode_py()
    except Exception as e:
        return type(e)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["g", "group_1", "CID-x%y|z"]), st.sampled_from(["T", "tasks-1", "%RETRY%g_T"]), INTS, INTS,
       INTS, INTS, TEXTS, st.integers(0, 2**31 - 1))
def test_pop_frame_is_the_general_paths(group: str, topic: str, q: object, mx: object, it: object, pt: object,
                                        tags: object, opaque: int) -> None:
    got = native.pop_request_frame(group, topic, q, mx, it, pt, tags, opaque)
    want = reference_pop_frame(group, topic, q, mx, it, pt, tags, opaque)
    plain = (all(type(v) is int and -(2**63) <= v < 2**63 for v in (q, mx, it, pt)) and type(tags) is str
             and not re.search("[\ud800-\udfff]", tags))
    if plain:
        assert got is not None and got == want
    else:
        assert got is None


def test_pop_frame_again_with_the_same_arguments() -> None:
    """The text after the opaque is kept for the next call with the same argument objects: a frame is still the
    general path's whatever came before it (the same objects, equal ones, others, a declined call)."""
    group, topic, tags = "g", "T" + "x" * 3, "a || b"
    calls = [(group, topic, -1, 32, 60_000, 1000, tags), (group, topic, -1, 32, 60_000, 1000, tags),
             ("g", "Txxx", -1, 32, 60_000, 1000, "a || b"), (group, topic, 2, 32, 60_000, 1000, tags),
             (group, topic, -1, 32, 60_000, 1000, 7), (group, topic, -1, 32, 60_000, 1000, tags),
             (group, "U", -1, 2**40, 60_000, 0, tags), (group, topic, -1, 32, 60_000, 1000, tags)]
    for opaque, args in enumerate(calls):
        got = native.pop_request_frame(*args, opaque)
        want = reference_pop_frame(*args, opaque)
        assert (got == want) if type(args[6]) is str else got is None


def test_pop_frame_declines_other_types() -> None:
    assert native.pop_request_frame("g", "T", -1, 32, 60_000, 0, "*", "1") is None
    assert native.pop_request_frame(1, "T", -1, 32, 60_000, 0, "*", 1) is None
    with pytest.raises(TypeError):
        native.pop_request_frame("g", "T")


# -- the messages of a POP response ---------------------------------------------------------------------------
def record(topic: str, qid: int, off: int, props: str, body: bytes) -> bytes:
    return bytes(encode_record(topic=topic, body=body, properties_string=props, queue_id=qid, queue_offset=off,
                               born_host=HOST, store_host=HOST, born_timestamp=1_700_000_000_000 + off,
                               store_timestamp=1_700_000_000_001 + off, physical_offset=off * 300))


def response(ext: dict[str, str], body: bytes, opaque: int = 7, code: int = ResponseCode.SUCCESS,
             flag: int = FLAG_RESPONSE) -> bytes:
    return RemotingCommand(code, ext, body, opaque, flag, None, "JAVA").encode_py()


def state(msgs: list[MessageExt]) -> list[tuple]:
    return [(type(m).__name__, *(getattr(m, s) for s in MessageExt.__slots__)) for m in msgs]


def reference_take(frame: bytes, topic: str, broker_name: str) -> list[MessageExt] | type:
    """What the general path makes of this response: decoded by the FrameDecoder, then `_popped`."""
    (r,) = FrameDecoder().feed(frame)
    try:
        if r.code not in pop_mod._POP_OK:
            return MQBrokerError
        return consumer(None)._popped(r, topic, broker_name)
    except Exception as e:
        return type(e)


def take(frame: bytes, topic: str, broker_name: str, opaque: int = 7, n: int | None = None) -> list | None:
    buf = bytearray(frame + b"\xff" * 32)  # the connection's buffer is larger than the read
    return native.pop_take(topic, broker_name, buf, len(frame) if n is None else n, opaque)


PROPS = st.sampled_from(["", "TAGS\x01a\x02", "KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC", "\u00e9\x01\u4e2d\x02", "A\x01B",
                         "POP_CK\x01old\x02"])
MSGS = st.lists(st.tuples(st.sampled_from(["T", "T", "T", "%RETRY%g_T", "U"]), st.integers(0, 3),
                          st.integers(0, 2**40), PROPS, st.binary(max_size=20)), min_size=1, max_size=10)
NUM = st.one_of(st.integers(0, 2**40).map(str), st.sampled_from(["0012", "+5", " 7", "", "-1", "1_0", "\u0661", "x"]))
STARTS = st.lists(st.tuples(st.sampled_from(["0", "0", "1", "x"]), st.one_of(st.integers(0, 3).map(str), NUM),
                            NUM), max_size=6)


@settings(max_examples=400, deadline=None)
@given(MSGS, STARTS, st.booleans(), NUM, NUM, NUM, st.sampled_from(["broker-a", "b\u00e9", "", "\u4e2d x"]),
       st.sampled_from(["", ";", ";;"]), st.booleans())
def test_take_makes_the_messages_popped_makes(specs: list, starts: list, all_starts: bool, pt: str, it: str,
                                               rq: str, broker_name: str, sep: str, more_ext: bool) -> None:
    if all_starts:  # every queue of the messages has its start (the plain case), plus what was drawn
        starts = [("0", str(q), str(max(0, off - 3))) for _, q, off, _, _ in specs] + starts
    info = sep + ";".join(" ".join(s) for s in starts) + sep
    ext = {"popTime": pt, "invisibleTime": it, "reviveQid": rq, "startOffsetInfo": info}
    if more_ext:
        ext = {"restNum": "0", **ext, "msgOffsetInfo": "0 1 5", "orderCountInfo": ""}
    body = b"".join(record(*s) for s in specs)
    frame = response(ext, body)
    got = take(frame, "T", broker_name)
    want = reference_take(frame, "T", broker_name)
    if got is not None:
        assert isinstance(want, list) and state(got) == state(want)
        if " " not in broker_name:  # (a broker name with a space makes a handle nobody can split, either way)
            assert all(ExtraInfo.split(m.properties["POP_CK"]).queue_offset == m.queue_offset for m in got)
    plain_num = all(re.fullmatch("[0-9]{1,18}", v) for v in (pt, it, rq))
    plain_starts = all(re.fullmatch("[0-9]{1,18}", q) and re.fullmatch("[0-9]{1,18}", s) for _, q, s in starts)
    plain_msgs = all(t == "T" for t, *_ in specs)
    if all_starts and plain_num and plain_starts and plain_msgs:
        assert got is not None


def test_take_declines_what_is_not_its_lone_success_response() -> None:
    ext = {"popTime": "100", "invisibleTime": "60000", "reviveQid": "1", "startOffsetInfo": "0 0 5"}
    body = record("T", 0, 5, "TAGS\x01a\x02", b"x") + record("T", 0, 6, "", b"y")
    frame = response(ext, body)
    got = take(frame, "T", "broker-a")
    assert got is not None and state(got) == state(reference_take(frame, "T", "broker-a"))
    assert [m.properties_string for m in got] == [
        "TAGS\x01a\x02POP_CK\x015 100 60000 1 0 broker-a 0 5\x02", "POP_CK\x015 100 60000 1 0 broker-a 0 6\x02"]
    assert take(frame, "T", "broker-a", opaque=8) is None  # another request's response
    assert take(response(ext, body, flag=0), "T", "broker-a") is None  # not a response
    assert take(response(ext, body, code=ResponseCode.POLLING_TIMEOUT), "T", "broker-a") is None
    assert take(response(ext, body, code=ResponseCode.SYSTEM_ERROR), "T", "broker-a") is None
    assert take(response(ext, b""), "T", "broker-a") is None  # no body: `_popped` answers []
    assert take(frame + frame, "T", "broker-a") is None  # two frames in the read
    assert take(frame, "T", "broker-a", n=len(frame) - 1) is None  # a partial one
    assert take(frame, "U", "broker-a") is None  # messages of another topic (the retry topic's)
    assert take(response({**ext, "startOffsetInfo": "0 1 5"}, body), "T", "broker-a") is None  # no start of queue 0
    assert take(response({**ext, "startOffsetInfo": "0 0"}, body), "T", "broker-a") is None  # _parse_starts raises
    assert take(response({k: v for k, v in ext.items() if k != "popTime"}, body), "T", "broker-a") is None
    assert take(b"", "T", "broker-a") is None
    with pytest.raises(TypeError):
        native.pop_take("T", "broker-a", bytearray(frame))


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body


BODY = record("T", 0, 5, "", b"x")
HEADERS = [  # hand-made headers: (JSON text, whether the take may read it itself)
    (b'{"code":0,"flag":1,"opaque":7,"extFields":{"popTime":"100","invisibleTime":"60000","reviveQid":"1",'
     b'"startOffsetInfo":"0 0 5"}}', True),
    (b'{ "code" : 0 , "language":"JAVA","version":435,"remark":"ok", "flag":1,"opaque":7,"extFields":'
     b'{"popTime":"9","popTime":"100","invisibleTime":"60000","reviveQid":"1","startOffsetInfo":"0 0 5",'
     b'"restNum":"\\u0031"},"serializeTypeCurrentRPC":"JSON"} ', True),  # the last popTime counts
    (b'{"code":0,"flag":1,"opaque":7,"extFields":{"popTime":"1"},"extFields":{"popTime":"100",'
     b'"invisibleTime":"60000","reviveQid":"1","startOffsetInfo":"0 0 5"}}', True),  # the last extFields counts
    (b'{"code":0,"flag":1,"opaque":7,"extFields":{"popTime":"\\u0031","invisibleTime":"60000","reviveQid":"1",'
     b'"startOffsetInfo":"0 0 5"}}', False),  # an escape in a value the take reads
    (b'{"code":0,"flag":1,"opaque":7,"extFields":{"popTime":100,"invisibleTime":"60000","reviveQid":"1",'
     b'"startOffsetInfo":"0 0 5"}}', False),  # a number
    (b'{"code":0,"flag":1,"opaque":7,"remark":null,"extFields":{"popTime":"100","invisibleTime":"60000",'
     b'"reviveQid":"1","startOffsetInfo":"0 0 5"}}', False),
    (b'{"code":0,"flag":3,"opaque":7,"extFields":{"popTime":"100","invisibleTime":"60000","reviveQid":"1",'
     b'"startOffsetInfo":"0 0 5"}}', True),  # any flag with the response bit
    (b'{"code":0,"flag":1,"opaque":7,"extFields":{"popTime":"100","invisibleTime":"60000","reviveQid":"1",'
     b'"startOffsetInfo":"0 0 5"}', False),  # cut short
]


@pytest.mark.parametrize(("header", "read"), HEADERS)
def test_take_reads_headers_as_the_decoder(header: bytes, read: bool) -> None:
    frame = raw_frame(header, BODY)
    got = take(frame, "T", "broker-a")
    try:
        want = reference_take(frame, "T", "broker-a")
    except Exception:  # the FrameDecoder refuses it
        want = None
    if got is not None:
        assert isinstance(want, list) and state(got) == state(want)
    assert (got is not None) == read


ACK_HEADERS = [(b'{"code":0,"flag":1,"opaque":7}', True),
               (b'{"code":0,"language":"JAVA","version":435,"opaque":7,"flag":1,"remark":"x","extFields":{"a":"b"},'
                b'"serializeTypeCurrentRPC":"JSON"}', True),
               (b'{"code":0,"flag":1,"opaque":8}', False), (b'{"code":1,"flag":1,"opaque":7}', False),
               (b'{"code":0,"flag":0,"opaque":7}', False), (b'{"flag":1,"opaque":7}', False),
               (b'{"code":0,"flag":1,"opaque":7,"remark":null}', False), (b'{"code":0,"flag":1,"opaque":7', False),
               (b'{"code":0,"flag":1,"opaque":7,"extFields":{"a":1}}', False)]


@pytest.mark.parametrize(("header", "ok"), ACK_HEADERS)
def test_ack_take_is_true_only_for_a_lone_success(header: bytes, ok: bool) -> None:
    frame = raw_frame(header)
    buf = bytearray(frame + b"\xff" * 8)
    got = native.pop_ack_take(buf, len(frame), 7)
    assert got is (True if ok else None)
    if got:  # what the connection's general read makes of it: SUCCESS to this request
        r = native.client_take_response(buf, len(frame), 7)
        assert r.code == ResponseCode.SUCCESS and r.opaque == 7 and r.flag & 1
    assert native.pop_ack_take(bytearray(frame + frame), 2 * len(frame), 7) is None
    assert native.pop_ack_take(buf, len(frame) - 1, 7) is None
    assert native.pop_ack_take(bytes(buf), len(frame), 7) is None


# -- the BATCH_ACK_MESSAGE frame ------------------------------------------------------------------------------
def popped(topic: str, handle: str, props: str = "", parsed: bool = False, cls: type = MessageExt) -> MessageExt:
    glue = "\x02" if props and not props.endswith("\x02") else ""  # as _set_handle appends it
    m = cls(0, 0, 0, 0, 0, 0, 0, 0, 0, b"\0\0\0\0", 0, 0, b"\0\0\0\0", 0, 0, 0, b"", topic,
            f"{props}{glue}POP_CK\x01{handle}\x02" if handle is not None else props)
    if parsed:
        m.properties  # noqa: B018  # parsed now
    return m


class Other(MessageExt):
    __slots__ = ()


def reference_ack_frame(msgs: list[MessageExt], group: str, opaque: int) -> bytes | None | type:
    """The frame the general path of `ack_batch` sends (Python codec, this opaque); None when it sends more or
    less than one; the exception it raises."""
    try:
        reqs = consumer(_Capture(), group)._ack_requests(msgs)
    except Exception as e:
        return type(e)
    if len(reqs) != 1:
        return None
    (cmd,) = reqs.values()
    cmd.opaque = opaque
    return cmd.encode_py()


HANDLE = st.tuples(st.sampled_from([0, 5, 2**40]), st.sampled_from([1_700_000_000_000, 7]), st.sampled_from([60_000, 1]),
                   st.integers(0, 3), st.sampled_from(["0", "0", "0", "1"]), st.sampled_from(["broker-a", "b", "b\u00e9"]),
                   st.integers(0, 3), st.integers(0, 2**40))
ODD = st.sampled_from([None, "", "0012", "+5", "x", "9 fields"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "T", "T", "U"]), HANDLE, ODD, PROPS, st.booleans(),
                          st.sampled_from([MessageExt, MessageExt, MessageExt, Other])), max_size=12),
       st.sampled_from(["g", "CID_x-y", 'g"\\', "g\u00e9"]), st.integers(0, 2**31 - 1))
def test_ack_frame_is_the_general_paths(specs: list, group: str, opaque: int) -> None:
    msgs = []
    for topic, (so, pt, it, rq, retry, bn, q, off), odd, props, parsed, cls in specs:
        handle = f"{so} {pt} {it} {rq} {retry} {bn} {q} {off}"
        if odd is not None:
            handle = {"": "", "0012": handle.replace(f" {q} ", f" 00{q} ", 1), "+5": "+" + handle,
                      "x": handle + "x", "9 fields": handle + " 1"}[odd]
        msgs.append(popped(topic, handle, props.replace("POP_CK", "PCK"), parsed and odd is None, cls))
    got = native.pop_ack_frame(msgs, MessageExt, msgs[0].topic if msgs else "T", group, opaque)
    want = reference_ack_frame(msgs, group, opaque)
    if got is not None:
        assert got == want
    plain = (msgs and all(t == "T" and retry == "0" and "\u00e9" not in bn and odd is None and cls is MessageExt
                          for t, (_, _, _, _, retry, bn, _, _), odd, _, _, cls in specs)
             and re.fullmatch("[A-Za-z0-9_-]+", group))
    if plain:
        assert got is not None


def test_ack_frame_entries_and_declines() -> None:
    h = ExtraInfo(5, 100, 60000, 1, False, "broker-a", 0, 5).build()
    msgs = [popped("T", h), popped("T", h[:-1] + "7", "TAGS\x01a\x02"),
            popped("T", ExtraInfo(9, 100, 60000, 1, False, "broker-a", 2, 9).build()),
            popped("T", h[:-1] + "3")]  # an offset before the start: a negative bit, as Python writes it
    frame = native.pop_ack_frame(msgs, MessageExt, "T", "g", 42)
    assert frame == reference_ack_frame(msgs, "g", 42)
    assert frame.endswith(b'{"acks":[{"c":"g","t":"T","r":"0","so":5,"q":0,"rq":1,"pt":100,"it":60000,"b":[0,2,-2]},'
                          b'{"c":"g","t":"T","r":"0","so":9,"q":2,"rq":1,"pt":100,"it":60000,"b":[0]}]}')
    assert native.pop_ack_frame([], MessageExt, "T", "g", 1) is None
    assert native.pop_ack_frame(msgs, MessageExt, "U", "g", 1) is None  # not all of this topic
    assert native.pop_ack_frame([popped("T", h.replace(" 0 broker", " 1 broker"))], MessageExt, "T", "g", 1) is None
    parsed = [popped("T", h, "TAGS\x01a", parsed=True), popped("T", h[:-1] + "6")]  # the dict's POP_CK, then the string's
    assert native.pop_ack_frame(parsed, MessageExt, "T", "g", 1) == reference_ack_frame(parsed, "g", 1) is not None
    del parsed[0].properties["POP_CK"]  # _get_handle finds none: ValueError, from Python
    assert native.pop_ack_frame(parsed, MessageExt, "T", "g", 1) is None
    assert native.pop_ack_frame([popped("T", None, "TAGS\x01a\x02")], MessageExt, "T", "g", 1) is None
    last = [popped("T", h, "XPOP_CK\x01v\x02POP_CK\x01other\x02")]  # the last POP_CK counts
    assert native.pop_ack_frame(last, MessageExt, "T", "g", 1) == reference_ack_frame(last, "g", 1) is not None
    odd = popped("T", h)
    odd.properties_string = "A\x01BPOP_CK\x01" + h  # not at a property boundary: _get_handle parses
    assert native.pop_ack_frame([odd], MessageExt, "T", "g", 1) is None
    wide = [popped("T", h, "K\x01\u4e2d\x02"), popped("T", h[:-1] + "6", "K\x01\u00e9")]  # 2- and 1-byte kinds
    assert native.pop_ack_frame(wide, MessageExt, "T", "g", 1) == reference_ack_frame(wide, "g", 1) is not None
    many = [popped("T", ExtraInfo(i, 100, 60000, 1, False, "b", 0, i).build()) for i in range(65)]
    assert native.pop_ack_frame(many, MessageExt, "T", "g", 1) is None  # more entries than the C table holds
    assert native.pop_ack_frame(many[:64], MessageExt, "T", "g", 1) == reference_ack_frame(many[:64], "g", 1)


# -- against a broker -----------------------------------------------------------------------------------------
SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        yield rb


def test_pop_and_ack_batch_against_a_broker(broker: RunningBroker, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = broker.namesrv_address
    calls: list[str] = []
    if path == "fast":  # the C functions were used (and what they declined went the general way)
        for name in ("_pop_take", "_ack_frame", "_pop_lone", "_ack_lone"):
            f = getattr(pop_mod, name)
            def spy(*a: object, f=f, name: str = name) -> object:  # noqa: ANN001
                r = f(*a)
                calls.append(f"{name}:{type(r).__name__}")
                return r

            monkeypatch.setattr(pop_mod, name, spy)
    with Producer(ns, "p") as p:
        for i in range(40):
            p.send(Message("tasks", f"m{i}".encode(), tags="t", keys=f"k{i}"))
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        got: list[MessageExt] = []
        deadline = time.monotonic() + 10
        while len(got) < 40 and time.monotonic() < deadline:
            batch = c.pop("tasks", max_nums=16, invisible_time=1500, poll_time=200)
            for m in batch[::2]:  # half of them parsed (what reading tags or keys does), half not
                e = ExtraInfo.split(m.properties["POP_CK"])
                assert (m.topic, e.queue_id, e.queue_offset, e.retry) == ("tasks", m.queue_id, m.queue_offset, False)
                assert m.tags == "t" and m.keys == f"k{m.body.decode()[1:]}"
            c.ack_batch(batch)
            got += batch
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(40))
        time.sleep(1.8)  # past the invisible time: nothing comes back, all were acked
        assert c.pop("tasks", max_nums=32, invisible_time=1000, poll_time=300) == []
        assert c.pop("tasks", max_nums=32, invisible_time=1000) == []  # NO_MESSAGE at once
    if path == "fast":  # the broker's responses and the client's acks took the C paths, not only tried them
        assert "_pop_lone:list" in calls and "_ack_lone:bool" in calls


def test_piped_pop_and_ack_against_a_broker(broker: RunningBroker, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pop(..., ack=prev)`: the BATCH_ACK and the POP in one write. On the C path both frames are made in C
    (`_pop_piped`, then `invoke_frames`); acks of another topic than the pop's go the general way. Either way
    every ack lands (nothing comes back past the invisible time) and every message is popped once."""
    ns = broker.namesrv_address
    piped: list[object] = []
    real = pop_mod.PopConsumer._pop_piped

    def spy(self: PopConsumer, *a: object) -> object:
        r = real(self, *a)
        piped.append(r is not None)
        return r

    monkeypatch.setattr(pop_mod.PopConsumer, "_pop_piped", spy)
    with Producer(ns, "p") as p:
        for i in range(30):
            p.send(Message("piped", f"m{i}".encode(), tags="t"))
        p.send(Message("other", b"o"))
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        other = c.pop("other", invisible_time=1500, poll_time=1000)
        assert [m.body for m in other] == [b"o"]
        got: list[MessageExt] = []
        prev: list[MessageExt] = []
        deadline = time.monotonic() + 10
        while len(got) < 30 and time.monotonic() < deadline:
            prev = c.pop("piped", max_nums=4, invisible_time=1500, poll_time=200, ack=prev or None)
            got += prev
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(30))
        # the last batch rides on a pop of another topic with the other topic's message: the general path
        assert c.pop("other", invisible_time=1500, poll_time=100, ack=prev + other) == []
        time.sleep(1.8)  # past the invisible time: nothing comes back, all were acked
        assert c.pop("piped", max_nums=32, invisible_time=1000, poll_time=300) == []
        assert c.pop("other", max_nums=32, invisible_time=1000, poll_time=300) == []
    fast = path == "fast"
    assert piped and all(piped) if fast else not piped  # the C frames on the C path, never declined here


def test_errors_and_retry_messages_end_as_the_general_path(broker: RunningBroker, path: str) -> None:
    ns = broker.namesrv_address
    with Producer(ns, "p") as p:
        for i in range(3):
            p.send(Message("tasks", f"m{i}".encode()))
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        with pytest.raises(MQBrokerError) as ei:
            c.pop("tasks", max_nums=4, invisible_time=1000, queue_id=99)  # no such queue
        assert ei.value.code != ResponseCode.SUCCESS
        first = []
        deadline = time.monotonic() + 10
        while len(first) < 3 and time.monotonic() < deadline:
            first += c.pop("tasks", max_nums=4, invisible_time=1000, poll_time=200)
        assert len(first) == 3
        time.sleep(1.3)  # not acked: they come back through the retry topic (the take declines those)
        back: list[MessageExt] = []
        deadline = time.monotonic() + 10
        while len(back) < 3 and time.monotonic() < deadline:
            back += c.pop("tasks", max_nums=4, invisible_time=60_000, poll_time=300)
        assert sorted(m.body for m in back) == [b"m0", b"m1", b"m2"]
        assert all(m.topic == "tasks" and ExtraInfo.split(m.properties["POP_CK"]).retry for m in back)
        c.ack_batch(back)  # retry handles: the general path's ack
        with pytest.raises(ValueError, match="no POP_CK"):
            c.ack_batch([MessageExt(0, 0, 0, 0, 0, 0, 0, 0, 0, b"\0\0\0\0", 0, 0, b"\0\0\0\0", 0, 0, 0, b"",
                                    "tasks", "")])


# -- the same handle prefix again: only the offset is read ----------------------------------------------------
TAILS = st.one_of(st.integers(0, 2**40).map(str), st.sampled_from(["", "07", "+7", "7 1", "7x", " 7", "\u0667", "7\x01"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(TAILS, min_size=1, max_size=8), st.integers(0, 3), st.booleans())
def test_ack_frame_reads_a_known_prefix_as_the_split(tails: list[str], at: int, other_first: bool) -> None:
    """Messages whose handles repeat the previous one's first seven fields (pop_ack_frame reads only the offset):
    the frame is the general path's, and every tail the split refuses is refused."""
    prefix = "5 100 60000 1 0 broker-a 1"
    msgs = [popped("T", f"{prefix} 5")]
    if other_first:
        msgs.insert(0, popped("T", "9 100 60000 1 0 broker-a 2 9"))
    msgs += [popped("T", f"{prefix} {t}") for t in tails]
    msgs.insert(min(at, len(msgs)), popped("T", f"{prefix}2 12"))  # queue 12: the same text up to a character more
    got = native.pop_ack_frame(msgs, MessageExt, "T", "g", 3)
    want = reference_ack_frame(msgs, "g", 3)
    if got is not None:
        assert got == want
    if all(re.fullmatch("0|[1-9][0-9]{0,17}", t) for t in tails):
        assert got is not None
    else:
        assert got is None


def test_decoded_fields_kept_between_calls_are_the_records() -> None:
    """decode_records keeps the last topic and the fields a batch shares from call to call: a later call with
    other values (a same-length ASCII topic, wide characters, other hosts and ports) gets its own."""
    other_host = (b"\x0a\x00\x00\x07", 4242)
    runs = [("AB", HOST), ("AC", HOST), ("AC", other_host), ("\u00e9C", other_host), ("AB", HOST)]
    for topic, host in runs:
        rec = bytes(encode_record(topic=topic, body=b"b", properties_string="K\x01v\x02", queue_id=1, queue_offset=3,
                                  born_host=host, store_host=host, born_timestamp=5, store_timestamp=6,
                                  physical_offset=7))
        out: list[MessageExt] = []
        assert native.decode_records(rec, 0, out, True) == len(rec)
        (m,) = out
        assert (m.topic, m.born_host_bytes, m.born_port, m.store_host_bytes, m.store_port) == (topic, *host, *host)


# -- pop_lone and ack_lone: opaque, frame and the lone caller's request in one call --------------------------
def test_pop_lone_and_ack_lone_send_the_frames_and_take_the_answers() -> None:
    import itertools

    from tests.lone_peer import Peer, reply

    ext = {"popTime": "100", "invisibleTime": "60000", "reviveQid": "1", "startOffsetInfo": "0 0 5"}
    body = record("T", 0, 5, "TAGS\x01a\x02", b"x") + record("T", 0, 6, "", b"y")
    answers: list[object] = []

    def answer(frame: bytes) -> bytes:
        (req,) = FrameDecoder().feed(frame)
        if req.code == 200050:
            return response(ext, body, opaque=req.opaque)
        return reply(frame, code=answers.pop(0) if answers else 0, ext={})

    peer = Peer(answer)
    try:
        with RemotingClient() as rc:
            conn = rc.connection(peer.address)
            opaques = itertools.count(2**31 + 40)  # & 0x7FFFFFFF: 40, 41, ...
            got = native.pop_lone(conn, opaques, "g", "T", -1, 2, 60_000, 1000, "*", 5.0, native.pop_take, "broker-a")
            assert state(got) == state(reference_take(response(ext, body, opaque=40), "T", "broker-a"))
            assert peer.frames == [native.pop_request_frame("g", "T", -1, 2, 60_000, 1000, "*", 40)]
            assert native.ack_lone(conn, opaques, got, MessageExt, "T", "g", 5.0, native.pop_ack_take) is True
            assert peer.frames[1] == native.pop_ack_frame(got, MessageExt, "T", "g", 41)
            answers.append(17)  # an error answer: the response, for ack_batch to raise
            r = native.ack_lone(conn, opaques, got, MessageExt, "T", "g", 5.0, native.pop_ack_take)
            assert isinstance(r, RemotingCommand) and r.code == 17 and r.opaque == 42
            # declines: nothing sent, an opaque taken
            assert native.pop_lone(conn, opaques, "g", "T", 1.5, 2, 60_000, 1000, "*", 5.0, native.pop_take, "b") is None
            assert native.ack_lone(conn, opaques, [], MessageExt, "T", "g", 5.0, native.pop_ack_take) is None
            conn._reader_busy = True
            assert native.pop_lone(conn, opaques, "g", "T", -1, 2, 60_000, 1000, "*", 5.0, native.pop_take, "b") is None
            conn._reader_busy = False
            assert len(peer.frames) == 3 and next(opaques) == 2**31 + 46 and not conn._pending
    finally:
        peer.close()
