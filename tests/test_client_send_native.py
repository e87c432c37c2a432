"""A plain `Producer.send` in C (`_native.client_send_frame`, `_native.client_send_take`): the request frame is
byte for byte the one the general path (`_properties` + `_send`'s header + `RemotingCommand.encode_py`) writes,
the lone caller's read of a SUCCESS response gives the SendResult values the general decode gives, and a send
the fast path does not cover (or that fails on it) ends as the general path ends it, against a real broker."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.client import (
    Message,
    MQBrokerError,
    Producer,
    PullConsumer,
)
from rmq_eventstore.client import producer as producer_mod
from rmq_eventstore.remoting import (
    FrameDecoder,
    FrameError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from rmq_eventstore.remoting import command as command_mod
from tests.conftest import import_native

native = import_native()  # also under RMQ_EVENTSTORE_PURE=1 (make test's second pass): the fixture below turns it on
native.init(Message)  # what codec and remoting.command do at import, unless RMQ_EVENTSTORE_PURE=1
native.remoting_init(RemotingCommand, SerializeType.JSON)


class _Capture:
    """A client base that records the request `Producer._send` makes and answers SUCCESS."""

    timeout = 3.0

    def __init__(self) -> None:
        self.sent: list[RemotingCommand] = []

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float, ok: tuple = (), while_waiting=None):  # noqa: ANN001, ANN201
        self.sent.append(cmd)
        return RemotingCommand(ResponseCode.SUCCESS, {"msgId": "M", "queueId": "1", "queueOffset": "5"}, b"",
                               cmd.opaque, 1)


def reference_frame(msg: Message, uniq: str, group: str, q: int, opaque: int, born: int) -> bytes:
    """The frame the general path sends for `msg` (UNIQ_KEY `uniq`, queue `q`), with this opaque and born
    timestamp: `_properties`, then `_send`'s header, encoded by the Python codec."""
    p = Producer.__new__(Producer)
    p.group = group
    p._base = _Capture()  # type: ignore[assignment]
    p.retry_times_when_send_failed = 0
    props, u = p._properties(msg, msg.uniq_key or uniq, 0)
    p._send(msg.topic, None, RequestCode.SEND_MESSAGE_V2, bytes(msg.body), props, msg.flag, msg.sys_flag,
            msg.reconsume_times, u, False, None, picked=("127.0.0.1:1", q))
    (cmd,) = p._base.sent  # type: ignore[attr-defined]
    cmd.opaque = opaque
    cmd.ext_fields["g"] = str(born)
    return cmd.encode_py()


texts = st.text(max_size=12) | st.sampled_from(["", "a\"b\\c", "\x01\x02\x7f", "WAIT\x01", "é€😀", "\ud800x"])
ints = st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-3, 3) | st.booleans() | st.integers(1 << 63, 1 << 65)
messages = st.builds(
    Message,
    topic=st.sampled_from(["T", "Topic_1", "%RETRY%g"]),
    body=st.binary(max_size=40),
    tags=st.none() | texts | st.just(7),
    keys=st.none() | texts | st.lists(texts, max_size=3) | st.tuples(texts, texts) | st.just([1, "a"]),
    flag=ints,
    properties=st.none() | st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "a", "é"]) | texts,
                                           st.none() | texts, max_size=4),
    sys_flag=ints,
    reconsume_times=ints,
    uniq_key=st.none() | st.sampled_from(["", "AB12"]),
)


@settings(max_examples=400, deadline=None)
@given(msg=messages, uniq=st.sampled_from(["0A0B0C0D", "", "é"]), group=texts, q=st.integers(0, 1 << 40),
       opaque=st.integers(0, 0x7FFFFFFF), born=st.integers(0, 1 << 45))
def test_the_frame_is_the_general_paths_frame(msg: Message, uniq: str, group: str, q: int, opaque: int,
                                              born: int) -> None:
    got = native.client_send_frame(msg, msg.uniq_key or uniq, group, q, opaque, born)
    try:
        want = reference_frame(msg, uniq, group, q, opaque, born)
    except (TypeError, UnicodeEncodeError):  # the general path refuses it: C must have declined
        assert got is None
        return
    assert got is None or got == want


def test_the_frame_covers_the_plain_shapes() -> None:
    """The decline of the test above is not what it mostly sees: the common shapes are all taken."""
    cases = [Message("T", b"x"), Message("T", b"", tags="t", keys="k1 k2"), Message("T", b"b", keys=["a", "", "b"]),
             Message("T", b"b", keys=("a",), properties={"p": "v", "TAGS": "x", "n": None}, flag=-5, sys_flag=1 << 40,
                     reconsume_times=3, tags="é\"\\\n"),
             Message("T", b"b", properties={"WAIT": "false"}, uniq_key="U1"), Message("T", b"b", keys=[])]
    for m in cases:
        uniq = m.uniq_key or "0A0B"
        got = native.client_send_frame(m, uniq, "grp", 2, 99, 1700000000123)
        assert got == reference_frame(m, uniq, "grp", 2, 99, 1700000000123), m
    for odd in (Message("T", bytearray(b"x")), Message("T", b"x", tags=1), Message("T", b"x", flag=True),
                Message("T", b"x", keys={"a"}), Message("T", b"x", properties_string="a\x01b\x02"),
                Message("T", b"x", tags="\ud800"), Message("T", b"x", flag=1 << 64)):
        assert native.client_send_frame(odd, "0A0B", "grp", 2, 99, 1) is None, odd


def test_the_born_timestamp_is_time_times_milliseconds() -> None:
    for _ in range(200):
        t0 = int(time.time() * 1000)
        frame = native.client_send_frame(Message("T", b"x"), "U", "g", 0, 1, None)
        t1 = int(time.time() * 1000)
        (cmd,) = FrameDecoder().feed(frame)
        assert t0 <= int(cmd.ext_fields["g"]) <= t1


def reference_take(data: bytes, opaque: int) -> tuple[str, int | None, int] | None:
    """What `_send_plain` makes of a read holding `data` through the general decode (None: not the
    lone SUCCESS response to `opaque` the fast read covers, or int() refuses a value)."""
    dec = FrameDecoder(1 << 29, 1 << 29)
    try:
        cmds = dec.feed(data)
    except FrameError:
        return None
    if len(cmds) != 1 or dec.buffered:
        return None
    r = cmds[0]
    x = r.ext_fields
    if r.code != 0 or r.opaque != opaque or not r.flag & 1 or "streamVersion" in x:
        return None
    try:
        qid = x.get("queueId")
        return x.get("msgId", ""), (int(qid) if qid is not None else None), int(x.get("queueOffset", -1))
    except ValueError:
        return None


numbers = st.sampled_from(["0", "7", "-1", "123456789012", " 12 ", "1_000", "+3", "٣", "x", "", "1e3", "9" * 30])
ext_fields = st.fixed_dictionaries({}, optional={
    "msgId": texts, "queueId": numbers, "queueOffset": numbers, "streamVersion": numbers,
    "MSG_REGION": st.just("DefaultRegion"), "TRACE_ON": st.just("true"), "other": texts})


@settings(max_examples=400, deadline=None)
@given(code=st.sampled_from([0, 0, 0, 1, 10, 12]), flag=st.sampled_from([1, 1, 0, 3]),
       opaque=st.integers(0, 0x7FFFFFFF), other=st.booleans(), ext=ext_fields, remark=st.none() | texts,
       tail=st.sampled_from([b"", b"", b"\x00\x00", b"xyz"]), body=st.sampled_from([b"", b"", b"b"]))
def test_the_take_is_the_general_decode(code: int, flag: int, opaque: int, other: bool, ext: dict[str, str],
                                        remark: str | None, tail: bytes, body: bytes) -> None:
    cmd = RemotingCommand(code, ext, body, opaque + 1 if other else opaque, flag, remark, "JAVA")
    try:
        data = cmd.encode_py() + tail
    except UnicodeEncodeError:
        return
    buf = bytearray(data) + bytearray(b"\xff" * 5)  # the connection's buffer is longer than the read
    got = native.client_send_take(buf, len(data), opaque)
    want = reference_take(data, opaque)
    if all(re.fullmatch(r"-?[0-9]{1,18}", ext[k]) for k in ("queueId", "queueOffset") if k in ext):
        assert got == want
    else:  # a text int() reads but the C does not (spaces, '+', '_', other digits): declined, Python decides
        assert got is None


@pytest.mark.parametrize("header", [
    '{"code":0,"flag":1,"opaque":5,"extFields":{"msgId":"A","queueId":"2","queueOffset":"9"}}',
    '{ "code" : 0 , "flag" : 1 , "opaque" : 5 , "language" : "JAVA" , "remark" : "r" , "n" : null , "x" : true , "y" : -3 ,'
    ' "extFields" : { "msgId" : "A\\u00e9\\"" , "queueOffset" : "-0" } } ',
    '{"code":0,"flag":3,"opaque":5,"extFields":{"queueId":"1"},"extFields":{"queueId":"2","queueId":"3"}}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"queue\\u0049d":"2"}}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"queueId":"2\\u0030"}}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"msgId":1}}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"queueId":"007"},"z":{"nested":1}}',
    '{"code":0,"flag":1,"opaque":5,"code":1}',
    '{"code":0,"flag":1,"opaque":5,"remark":"\\ud800"}',
    '{"code":0.0,"flag":1,"opaque":5}',
    '{"flag":1,"opaque":5}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"queueOffset":"1234567890123456789"}}',
    '{"code":0,"flag":1,"opaque":5,"extFields":{"msgId":"\u00e9"}}',
])
def test_the_take_reads_odd_headers_as_the_decoder_or_declines(header: str) -> None:
    h = header.encode("utf-8")
    data = len(h).to_bytes(4, "big")
    data = (len(h) + 4).to_bytes(4, "big") + data + h
    got = native.client_send_take(bytearray(data), len(data), 5)
    assert got is None or got == reference_take(data, 5)
    taken_by_the_c_decoder = native.remoting_decode(data, 0, 1 << 29, 1 << 29)[1] == len(data)
    if taken_by_the_c_decoder and not any(odd in header for odd in ("\\u0049", '"2\\u0030"', "4567890123456789")):
        assert got == reference_take(data, 5)  # an escaped key or digit, 19 digits: declined, Python decides


def test_the_take_declines_what_is_not_exactly_one_frame() -> None:
    ok = RemotingCommand(0, {"msgId": "M", "queueId": "1", "queueOffset": "9"}, b"", 5, 1).encode_py()
    assert native.client_send_take(bytearray(ok), len(ok), 5) == ("M", 1, 9)
    assert native.client_send_take(bytearray(ok), len(ok) - 1, 5) is None
    assert native.client_send_take(bytearray(ok + ok), 2 * len(ok), 5) is None
    assert native.client_send_take(bytes(ok), len(ok), 5) is None
    assert native.client_send_take(bytearray(ok), len(ok) + 1, 5) is None
    broken = bytearray(ok)
    broken[8] = ord("[")
    assert native.client_send_take(broken, len(ok), 5) is None


# -- against a real broker ------------------------------------------------------------------------------------
@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", mapped_file_size_commit_log=1 << 20, max_message_size=64 * 1024)
    yield rb
    rb.close()


def _read_all(broker: RunningBroker, topic: str, expect: int = 0) -> dict[str, dict[str, str]]:
    """UNIQ_KEY -> the stored properties of every message of `topic`, once `expect` of them are readable (a
    stored record is readable once dispatched, which may lag the SEND's answer: up to 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        out: dict[str, dict[str, str]] = {}
        with PullConsumer(broker.namesrv_address, "cg-native") as c:
            for q in range(4):
                r = c.pull(topic, q, 0, max_nums=64, suspend_timeout_ms=0)
                for m in r.messages:
                    out[m.properties["UNIQ_KEY"]] = m.properties
        if len(out) >= expect or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer's fast path on, whichever pass of the suite this is (RMQ_EVENTSTORE_PURE=1 leaves it off)."""
    monkeypatch.setattr(producer_mod, "_send_frame", native.client_send_frame)
    monkeypatch.setattr(producer_mod, "_send_take", native.client_send_take)


def _counting_take(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    taken: list[object] = []
    real = native.client_send_take

    def take(buf: bytearray, n: int, opaque: int) -> object:
        got = real(buf, n, opaque)
        taken.append(got)
        return got

    monkeypatch.setattr(producer_mod, "_send_take", take)
    return taken


def test_plain_sends_take_the_fast_path_and_store_what_the_general_path_stores(
        broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _counting_take(monkeypatch)
    lone: list[object] = []  # what the lone caller in C (client_lone) answered, when it is there
    real_lone = producer_mod._lone
    if real_lone is not None:
        def counting_lone(*args: object) -> object:
            got = real_lone(*args)
            lone.append(got)
            return got

        monkeypatch.setattr(producer_mod, "_lone", counting_lone)
    msgs = [Message("Fast", f"b{i}".encode(), tags="t", keys=[f"k{i}", "x"], properties={"p": f"v{i}"})
            for i in range(12)]
    with Producer(broker.namesrv_address, "pg") as p:
        p.send(Message("Fast", b"warm"))  # the route is fetched by the general path
        fast = [p.send(m) for m in msgs]
    assert len(taken) == 12 and all(t is not None for t in taken)
    if real_lone is not None:  # one thread: each round trip made by client_lone, none left to invoke_frame
        assert len(lone) == 12 and all(r is not None for r in lone)
    monkeypatch.setattr(producer_mod, "_send_frame", None)
    with Producer(broker.namesrv_address, "pg") as p:
        p.send(Message("Slow", b"warm"))
        slow = [p.send(Message("Slow", m.body, tags=m.tags, keys=m.keys, properties=m.properties)) for m in msgs]
    assert len(taken) == 12
    assert [(r.status, r.queue_id, r.topic) for r in fast] == [(r.status, r.queue_id, "Fast") for r in slow]
    assert [r.queue_offset for r in fast] == [r.queue_offset for r in slow]
    assert all(len(r.offset_msg_id) == 32 and r.broker_address for r in fast)
    stored_fast, stored_slow = _read_all(broker, "Fast", 13), _read_all(broker, "Slow", 13)
    for r in fast:
        props = stored_fast[r.msg_id]
        assert props["TAGS"] == "t" and props["p"].startswith("v") and props["WAIT"] == "true"
    strip = {"UNIQ_KEY", "CLUSTER", "MSG_REGION", "TRACE_ON", "__CRC32#"}  # the CRC covers other ids
    assert sorted(sorted((k, v) for k, v in p.items() if k not in strip) for p in stored_fast.values()) == \
        sorted(sorted((k, v) for k, v in p.items() if k not in strip) for p in stored_slow.values())


def test_a_message_the_frame_declines_is_sent_the_general_way_on_the_picked_queue(
        broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _counting_take(monkeypatch)
    with Producer(broker.namesrv_address, "pg") as p:
        first = p.send(Message("Odd", b"warm"))
        odd = p.send(Message("Odd", b"x", tags=123))  # type: ignore[arg-type]  # formatted by the general path
        after = p.send(Message("Odd", b"y"))
    n = 4  # the default queue count of an auto-created topic
    assert odd.queue_id == (first.queue_id + 1) % n and after.queue_id == (first.queue_id + 2) % n
    assert len(taken) == 1 and taken[0] is not None
    assert _read_all(broker, "Odd", 3)[odd.msg_id]["TAGS"] == "123"


def test_an_error_response_raises_as_before(broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _counting_take(monkeypatch)
    with Producer(broker.namesrv_address, "pg") as p:
        p.send(Message("Big", b"warm"))
        with pytest.raises(MQBrokerError) as e:
            p.send(Message("Big", b"z" * (100 * 1024)))
    assert e.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert taken == [None]  # read, declined, decoded by the general path


def test_a_lost_connection_is_retried_from_the_fast_path(broker: RunningBroker) -> None:
    with Producer(broker.namesrv_address, "pg") as p:
        first = p.send(Message("Lost", b"warm"))
        conn = p._base.remoting._conns[first.broker_address]
        conn.sock.shutdown(2)  # the next write or read on it fails
        again = p.send(Message("Lost", b"x"))
        assert again.status == "SEND_OK"
        assert p._base.remoting._conns[first.broker_address] is not conn
        assert p.send(Message("Lost", b"y")).status == "SEND_OK"


def test_the_fast_path_reads_only_bases_that_invoke_as_client_base() -> None:
    """The fast path reads the base's route cache: a stand-in base (tests) or an overriding one is not read."""
    assert producer_mod._fast_base(producer_mod._ProducerBase)
    assert not producer_mod._fast_base(_Capture)

    class Overriding(producer_mod._ProducerBase):
        def invoke(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            return super().invoke(*a, **k)

    assert not producer_mod._fast_base(Overriding)


def test_many_threads_mix_fast_sends_and_other_requests_on_one_connection(broker: RunningBroker) -> None:
    """Fast sends (their own first read, `take`) and ordinary invokes share one connection's read role."""
    errors: list[BaseException] = []
    results: list[object] = []
    with Producer(broker.namesrv_address, "pg") as p:
        first = p.send(Message("Mix", b"warm"))
        addr = first.broker_address

        def sends() -> None:
            try:
                for i in range(150):
                    results.append(p.send(Message("Mix", b"%d" % i, tags="t")))
            except BaseException as e:
                errors.append(e)

        def others() -> None:
            try:
                for _ in range(150):
                    r = p._base.remoting.invoke(addr, RemotingCommand.request(
                        RequestCode.GET_MAX_OFFSET, {"topic": "Mix", "queueId": 0}), 10)
                    assert r.code == ResponseCode.SUCCESS and int(r.ext_fields["offset"]) >= 0
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=f) for f in (sends, sends, sends, others, others)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len(results) == 450 and all(r.status == "SEND_OK" for r in results)  # type: ignore[attr-defined]
        offsets = sorted((r.queue_id, r.queue_offset) for r in results)  # type: ignore[attr-defined]
        assert len(set(offsets)) == 450
        assert not p._base.remoting._conns[addr]._pending


# -- the general request path's C pieces: RemotingCommand.request and a lone caller's response ----------------
_SLOTS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type")


def _fields(cmd: RemotingCommand) -> list[tuple[str, type, object]]:
    return [(name, type(getattr(cmd, name)), getattr(cmd, name)) for name in _SLOTS]


any_text = st.text(max_size=10)
ext_values = st.one_of(any_text, st.integers(-(1 << 70), 1 << 70), st.none(), st.booleans(), st.floats(allow_nan=False),
                       st.binary(max_size=3))


@settings(max_examples=400, deadline=None)
@given(code=st.integers(0, 400) | st.sampled_from(list(RequestCode)), oneway=st.booleans(),
       ext=st.none() | st.dictionaries(any_text, any_text | st.integers(-(1 << 70), 1 << 70) | st.none(), max_size=5)
       | st.dictionaries(any_text, ext_values, max_size=3),
       body=st.binary(max_size=8), opaque=st.integers(0, 0x7FFFFFFF))
def test_a_request_made_in_c_is_the_constructors(code: int, oneway: bool, ext: dict | None, body: bytes,
                                                 opaque: int) -> None:
    got = native.client_new_request(code, ext, body, opaque, 1 if oneway else 0)
    try:
        want = RemotingCommand(code, command_mod._ext_strings(ext) if ext else {}, body, opaque, 1 if oneway else 0)
    except FrameError:  # a value _ext_strings refuses: C must have left it to Python
        assert got is None
        return
    if got is None:  # declined: a value of another type than str, int or None
        assert ext and any(v is not None and type(v) not in (str, int) for v in ext.values())
        return
    assert _fields(got) == _fields(want)
    assert list(got.ext_fields) == list(want.ext_fields)
    assert got.encode_py() == want.encode_py()


def test_request_takes_the_c_constructor_when_it_can() -> None:
    a = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0, "n": None})
    b = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0, "flag": True})
    assert a.ext_fields == {"topic": "T", "queueId": "0"} and b.ext_fields["flag"] == "true"
    assert b.opaque > a.opaque > 0 and a.language == "PYTHON" and a.version == 435 and a.remark is None


responses = st.builds(
    RemotingCommand, code=st.integers(-5, 400), ext_fields=st.dictionaries(any_text, any_text, max_size=4),
    body=st.binary(max_size=16), opaque=st.integers(0, 0x7FFFFFFF), flag=st.sampled_from([0, 1, 1, 3]),
    remark=st.none() | any_text, language=st.sampled_from(["JAVA", "PYTHON", "X" * 20]),
    version=st.integers(-(1 << 31), (1 << 31) - 1))


@settings(max_examples=400, deadline=None)
@given(cmd=responses, other=st.booleans(), tail=st.sampled_from([b"", b"", b"\x00"]), cut=st.booleans())
def test_a_lone_callers_response_is_the_decoders(cmd: RemotingCommand, other: bool, tail: bytes, cut: bool) -> None:
    try:
        data = cmd.encode_py() + tail
    except UnicodeEncodeError:
        return
    if cut:
        data = data[:-1]
    opaque = cmd.opaque + 1 if other else cmd.opaque
    got = native.client_take_response(bytearray(data) + b"\xee" * 3, len(data), opaque)
    dec = FrameDecoder(1 << 29, 1 << 29)
    try:
        frames = dec.feed(data)
    except FrameError:
        frames = []
    ours = len(frames) == 1 and not dec.buffered and frames[0].opaque == opaque and frames[0].flag & 1
    if not ours:
        assert got is None
    else:
        assert got is not None and _fields(got) == _fields(frames[0])
