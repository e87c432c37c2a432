"""The kombu transport's publish path (`Channel._put` and `Producer.send`'s C frame for an explicit queue):
the same kombu messages published through it and through the reference (the transport's `_put` as it was,
`json.dumps` and `topic_name` per message, with the producer's general Python path) are stored as the same
records (bodies, lanes, queue offsets, flags, properties) and reach a consumer as the same kombu messages
(body, headers, properties, delivery info), across plain, priority, direct, topic and fanout routing,
expiration and a Celery eta (a timer message)."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Producer, Queue

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.client import Message, PullConsumer
from rmq_eventstore.client import Producer as MQProducer
from rmq_eventstore.client import producer as producer_mod
from rmq_eventstore.kombu import transport as transport_mod
from rmq_eventstore.kombu.names import topic_name
from rmq_eventstore.kombu.transport import PROPERTY_DUE_AT, PROPERTY_EXPIRE_AT, Channel
from rmq_eventstore.remoting import RemotingCommand, SerializeType
from tests.conftest import import_native

native = import_native()  # also under RMQ_EVENTSTORE_PURE=1 (make test's second pass): the fixture turns it on
native.init(Message)  # what codec and remoting.command do at import, unless RMQ_EVENTSTORE_PURE=1
native.remoting_init(RemotingCommand, SerializeType.JSON)


def reference_put(self: Channel, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
    """`Channel._put` before the fast path, verbatim: the reference of what a publish stores."""
    c = self.clients
    topic = topic_name(queue, self.clients.namespace)
    args = self._queue_args(queue)
    if not args and c.shared.queue(queue, refresh=False) is None:
        args = self._queue_args(queue, refresh=True)
    lanes = transport_mod.LANES if args.get("x-max-priority") else 1
    c.ensure_topic(topic, 1)
    props: dict[str, str] = {}
    expiration = (message.get("properties") or {}).get("expiration")
    if expiration not in (None, ""):
        try:
            props[PROPERTY_EXPIRE_AT] = str(int(time.time() * 1000) + int(float(expiration)))
        except ValueError:
            pass
    due_at = self._due_at(message)
    if due_at is not None:
        props[PROPERTY_DUE_AT] = str(int(due_at * 1000))
    body = json.dumps(message, separators=(",", ":")).encode()
    lane = transport_mod._clamp_priority(message) if lanes > 1 else 0
    if not self._send(topic, body, props, lane, due_at):
        self.connection.expect(queue, float(self.publish_wait))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path_factory.mktemp("kombu-fast") / "store", mapped_file_size_commit_log=1 << 22)
    yield rb
    rb.close()


@pytest.fixture
def fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The producer's C frame on, whichever pass of the suite this is (RMQ_EVENTSTORE_PURE=1 leaves it off)."""
    monkeypatch.setattr(producer_mod, "_send_frame", native.client_send_frame)
    monkeypatch.setattr(producer_mod, "_send_take", native.client_send_take)
    monkeypatch.setattr(transport_mod, "_message_json_bytes", native.kombu_json)


def _tags(monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's delivery tags (a uuid per publish, inside the stored body) from a counter, so that two runs
    write the same bytes."""
    counter = itertools.count()
    monkeypatch.setattr(Channel, "_next_delivery_tag", lambda self: f"tag-{next(counter)}")


QUEUES = ["plain", "prio", "direct", "topic", "fan.a", "fan.b", "ttl", "eta", "odd.é€"]


DX, TX, FX = Exchange("dx", "direct"), Exchange("tx", "topic"), Exchange("fx", "fanout")


def _queues() -> list[Queue]:
    """QUEUES as declared (a consumer declares them the same way: a priority queue keeps its lanes)."""
    return [Queue("plain", Exchange("plain"), "plain"), Queue("prio", Exchange("prio"), "prio", max_priority=9),
            Queue("direct", DX, "rk"), Queue("topic", TX, "a.*"), Queue("fan.a", FX), Queue("fan.b", FX),
            Queue("ttl", Exchange("ttl"), "ttl"), Queue("eta", Exchange("eta"), "eta"),
            Queue("odd.é€", Exchange("odd"), "odd")]


def _publish_all(namesrv: str, ns: str, eta: datetime) -> None:
    """The same publishes in every run: every routing kind, priorities, expiration, an eta, odd texts."""
    dx, tx, fx = DX, TX, FX
    with Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns}) as c:
        ch = c.channel()
        for q in _queues():
            q(ch).declare()
        p = Producer(ch)
        for i in range(3):
            p.publish({"i": i, "s": "plain"}, exchange="", routing_key="plain", headers={"h": i}, delivery_mode=2)
        for pr in (0, 5, 9, 12, -1, None):
            p.publish({"pr": pr}, exchange="", routing_key="prio", priority=pr)
        p.publish({"to": "direct"}, exchange=dx, routing_key="rk", correlation_id="c-1", reply_to="r")
        p.publish({"to": "direct", "miss": True}, exchange=dx, routing_key="other")  # no queue bound: dropped
        p.publish({"to": "topic"}, exchange=tx, routing_key="a.b")
        p.publish({"to": "fan"}, exchange=fx, routing_key="")
        p.publish({"ttl": 1}, exchange="", routing_key="ttl", expiration=60)
        p.publish(b"\x00\xffraw", exchange="", routing_key="plain", content_type="application/data",
                  content_encoding="binary")
        p.publish({"é": "€😀\u2028", "n": [1.5, None, True]}, exchange="", routing_key="odd.é€",
                  headers={"x-é": "ü", "nested": {"a": [1, 2]}})
        # a Celery task message (protocol 2) with an eta a few seconds ahead: a timer message
        p.publish([[1], {}, {}], exchange="", routing_key="eta", serializer="json",
                  headers={"lang": "py", "task": "t.eta", "id": "id-1", "eta": eta.isoformat(), "retries": 0})


def _stored(broker: RunningBroker, ns: str) -> dict[str, list[tuple[Any, ...]]]:
    """queue -> its topic's records (every lane, in lane and offset order), the time-made values left out."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    timey = {"UNIQ_KEY", PROPERTY_EXPIRE_AT, "__CRC32#", "TIMER_DELIVER_MS", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS",
             "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "REAL_QID", "MSG_REGION", "TRACE_ON", "CLUSTER"}
    assert broker.store.wait_for_dispatch(10)
    with PullConsumer(broker.namesrv_address, f"cmp-{ns}") as pc:
        for queue in QUEUES:
            topic = topic_name(queue, ns)
            recs = []
            for lane in range(transport_mod.LANES if queue == "prio" else 1):
                r = pc.pull(topic, lane, 0, max_nums=64, suspend_timeout_ms=0)
                for m in r.messages:
                    props = m.properties
                    recs.append((lane, m.queue_offset, bytes(m.body), m.flag, m.sys_flag, m.reconsume_times,
                                 sorted((k, v) for k, v in props.items() if k not in timey),
                                 sorted(k for k in props if k in timey)))
            out[queue] = recs
    return out


def _received(namesrv: str, ns: str) -> dict[str, list[tuple[Any, ...]]]:
    """queue -> what a kombu consumer gets from it (the transport's own delivery tag left out)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns}) as c:
        for queue in _queues():
            sq = c.SimpleQueue(queue)
            got = []
            while True:
                try:
                    m = sq.get(timeout=0.5 if got or queue.name != "eta" else 15)
                except sq.Empty:
                    break
                props = {k: v for k, v in m.properties.items() if k != "delivery_tag"}
                got.append((m.body, m.content_type, m.content_encoding, json.dumps(m.headers, sort_keys=True),
                            json.dumps(props, sort_keys=True, default=str),
                            json.dumps(m.delivery_info, sort_keys=True, default=str)))
                m.ack()
            sq.close()
            out[queue.name] = got
    return out


def test_the_fast_publish_stores_and_delivers_what_the_reference_does(
        broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, fast_path: None) -> None:
    namesrv = broker.namesrv_address
    eta = datetime.fromtimestamp(time.time() + 5.0, UTC)  # one eta for both runs: the same bytes
    fast_ns, ref_ns = "f" + uuid.uuid4().hex[:10], "r" + uuid.uuid4().hex[:10]
    frames: list[object] = []
    real_frame = native.client_send_frame

    def counting_frame(*args: object) -> object:
        got = real_frame(*args)
        frames.append(got)
        return got

    bodies: list[object] = []

    def counting_json(message: object) -> object:
        got = native.kombu_json(message)
        bodies.append(got)
        return got

    _tags(monkeypatch)
    monkeypatch.setattr(producer_mod, "_send_frame", counting_frame)
    monkeypatch.setattr(transport_mod, "_message_json_bytes", counting_json)
    _publish_all(namesrv, fast_ns, eta)
    fast_frames = len([f for f in frames if f is not None])
    assert fast_frames >= 18  # every publish but the timer one went through the C frame
    assert len(bodies) == 17 and all(b is not None for b in bodies)  # every body written by kombu_json

    _tags(monkeypatch)  # the same tags again
    with monkeypatch.context() as m:
        m.setattr(Channel, "_put", reference_put)
        m.setattr(producer_mod, "_send_frame", None)
        _publish_all(namesrv, ref_ns, eta)
    assert len([f for f in frames if f is not None]) == fast_frames  # the reference made no C frame

    time.sleep(max(eta.timestamp() - transport_mod.DEFAULT_ETA_LEAD - time.time(), 0) + 1.5)
    fast, ref = _stored(broker, fast_ns), _stored(broker, ref_ns)
    assert fast == ref
    assert [len(fast[q]) for q in QUEUES] == [4, 6, 1, 1, 1, 1, 1, 1, 1]
    assert sorted(lane for lane, *_ in fast["prio"]) == [0, 0, 0, 5, 9, 9]  # priorities 0/None/-1, 5, 9/12
    assert any(k == PROPERTY_EXPIRE_AT for k in fast["ttl"][0][7])
    assert any(k == PROPERTY_DUE_AT for k, _ in fast["eta"][0][6])
    got_fast, got_ref = _received(namesrv, fast_ns), _received(namesrv, ref_ns)
    assert got_fast == got_ref
    assert [len(got_fast[q]) for q in QUEUES] == [4, 6, 1, 1, 1, 1, 1, 1, 1]
    assert json.loads(got_fast["eta"][0][3])["eta"] == eta.isoformat()


# -- the pieces ----------------------------------------------------------------------------------------------
kombu_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(message=st.dictionaries(st.text(max_size=10), kombu_values, max_size=6))
def test_the_shared_encoder_writes_json_dumps_text(message: dict[str, Any]) -> None:
    assert transport_mod._MESSAGE_JSON(message) == json.dumps(message, separators=(",", ":"))


# what kombu_json must write as json does: every escape ascii_escape_unichar makes (control characters, '"',
# '\\', DEL, Latin-1, BMP, astral: a surrogate pair, lone surrogates), runs of 8 around them, long strings
odd_text = (st.text() | st.text(alphabet='ab"\\\x7f\x1f \x00\x80~\xff\u2028\ud800\udfff\U0001f600', max_size=40)
            | st.text(alphabet=st.characters(max_codepoint=0x17f), min_size=7, max_size=70))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**70, max_value=2**70)
    | st.sampled_from([2**63 - 1, -2**63, 2**63, -2**63 - 1, 10**30]) | st.floats(allow_nan=True) | odd_text,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(odd_text, inner, max_size=4)),
    max_leaves=30)


@settings(max_examples=1000, deadline=None)
@given(message=st.dictionaries(odd_text, json_values, max_size=8))
def test_kombu_json_writes_the_shared_encoders_bytes(message: dict[str, Any]) -> None:
    assert native.kombu_json(message) == transport_mod._MESSAGE_JSON(message).encode()


def test_kombu_json_writes_every_character_as_json_does() -> None:
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000 and c % 61:
            continue
        for s in (chr(c), chr(c) * 9 + "abcdefghij" + chr(c), "abcdefgh" + chr(c) + "ijklmno"):
            assert native.kombu_json({s: [s]}) == transport_mod._MESSAGE_JSON({s: [s]}).encode(), hex(c)
    big = {"body": "x" * 100_000 + "\u00e9" * 5000 + "\U0001f600" * 5000, "n": [10**400, -(10**400)]}
    assert native.kombu_json(big) == transport_mod._MESSAGE_JSON(big).encode()


class _Str(str):
    pass


class _Int(int):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


def test_kombu_json_declines_what_it_leaves_to_json() -> None:
    """None (json's encoder decides: its key conversions, subclasses, its errors) for anything but exact JSON
    types with str keys, nested at most KJ_DEPTH deep."""
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep: Any = "x"
    for _ in range(60):
        deep = [deep]
    for message in ({1: "a"}, {"a": {None: 1}}, {"a": _Str("s")}, {"a": _Int(1)}, {"a": 1.5j},
                    {"a": _Dict()}, {"a": object()}, {"a": b"bytes"}, {"a": {"b": cyclic}}, {"a": deep},
                    {"a": 10**5000}, _Dict(a=1), ["list"], "text", None):
        assert native.kombu_json(message) is None, message
    with pytest.raises(ValueError):  # what json makes of the int kombu_json left to it
        transport_mod._MESSAGE_JSON({"a": 10**5000})
    shallow: Any = "x"
    for _ in range(23):  # 46 deep
        shallow = {"k": [shallow]}
    assert native.kombu_json(shallow) == transport_mod._MESSAGE_JSON(shallow).encode()


def _clients_stub(namespace: str) -> transport_mod._Clients:
    c = transport_mod._Clients.__new__(transport_mod._Clients)
    c.namespace = namespace
    c._queue_topics = {}
    return c


@settings(max_examples=300, deadline=None)
@given(queue=st.text(max_size=40) | st.sampled_from(["", "celery", "a" * 300, "\ud800"]),
       namespace=st.sampled_from(["", "ns1", "x-y_z"]))
def test_the_remembered_topic_is_topic_names(queue: str, namespace: str) -> None:
    c = _clients_stub(namespace)
    for _ in range(2):  # computed, then remembered
        try:
            want: object = topic_name(queue, namespace)
        except ValueError as e:
            want = ("ValueError", str(e))
        try:
            got: object = c.queue_topic(queue)
        except ValueError as e:
            got = ("ValueError", str(e))
        assert got == want
    assert (queue in c._queue_topics) == isinstance(want, str)


def test_the_remembered_topics_are_bounded_and_refuse_what_topic_name_refuses() -> None:
    c = _clients_stub("")
    for i in range(transport_mod._QUEUE_TOPICS_MAX + 10):
        assert c.queue_topic(f"q{i}") == topic_name(f"q{i}")
    assert len(c._queue_topics) <= transport_mod._QUEUE_TOPICS_MAX
    for bad in (None, 7, ["x"]):
        with pytest.raises(ValueError):
            c.queue_topic(bad)  # type: ignore[arg-type]


# -- the producer's C frame for an explicit queue --------------------------------------------------------------
@pytest.fixture
def send_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", mapped_file_size_commit_log=1 << 20)
    yield rb
    rb.close()


def _frames(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    made: list[object] = []
    real = native.client_send_frame

    def frame(*args: object) -> object:
        got = real(*args)
        made.append((args[3], got))
        return got

    monkeypatch.setattr(producer_mod, "_send_frame", frame)
    return made


def test_an_explicit_queue_takes_the_c_frame_and_lands_where_the_general_path_puts_it(
        send_broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, fast_path: None) -> None:
    made = _frames(monkeypatch)
    with MQProducer(send_broker.namesrv_address, "pq") as p:
        p.send(Message("Q", b"warm"))  # the route, fetched by the general path
        rr = repr(p._rr)  # the round-robin counter: an explicit queue does not move it
        fast = [p.send(Message("Q", f"b{i}".encode(), tags="t", properties={"k": "v"}), queue_id=i % 4)
                for i in range(8)]
        assert repr(p._rr) == rr
        with pytest.raises(ValueError, match="no writeable queue 9"):
            p.send(Message("Q", b"nope"), queue_id=9)
        n_made = len(made)
        assert [q for q, _ in made[-8:]] == [i % 4 for i in range(8)] and all(f is not None for _, f in made[-8:])
        monkeypatch.setattr(producer_mod, "_send_frame", None)
        slow = [p.send(Message("Q", f"b{i}".encode(), tags="t", properties={"k": "v"}), queue_id=i % 4)
                for i in range(8)]
        assert len(made) == n_made
    assert [(r.status, r.queue_id, r.topic) for r in fast] == [(r.status, r.queue_id, r.topic) for r in slow]
    assert [r.queue_offset + 2 for r in fast] == [r.queue_offset for r in slow]  # queue i: fast twice, slow twice
    strip = {"UNIQ_KEY", "__CRC32#"}
    assert send_broker.store.wait_for_dispatch(10)  # stored is not yet pullable: the reput may lag under load
    with PullConsumer(send_broker.namesrv_address, "pq-read") as pc:
        for q in range(4):
            ms = pc.pull("Q", q, 0, max_nums=64, suspend_timeout_ms=0).messages
            bodies = [bytes(m.body) for m in ms if m.body != b"warm"]
            assert bodies == [f"b{q}".encode(), f"b{q + 4}".encode()] * 2
            props = [sorted((k, v) for k, v in m.properties.items() if k not in strip) for m in ms
                     if m.body != b"warm"]
            assert props[:2] == props[2:]


def test_the_frame_for_an_explicit_queue_is_the_general_paths() -> None:
    """Producer.send hands the C frame the queue `_pick` picks; the frame for that queue is the general
    path's (the frame itself is compared field by field in test_client_send_native.py)."""
    from tests.test_client_send_native import reference_frame

    msg = Message("T", b"body", tags="a", keys=["k1", "k2"], properties={"KOMBU_EXPIRE_AT": "123", "é": "ü"})
    for q in (0, 3, 9):
        assert native.client_send_frame(msg, "UNIQ1", "g", q, 77, 1_700_000_000_000) == \
            reference_frame(msg, "UNIQ1", "g", q, 77, 1_700_000_000_000)


def test_a_lost_connection_retries_an_explicit_queue_on_that_queue(
        send_broker: RunningBroker, fast_path: None) -> None:
    with MQProducer(send_broker.namesrv_address, "pq") as p:
        first = p.send(Message("L", b"warm"), queue_id=2)
        conn = p._base.remoting._conns[first.broker_address]
        conn.sock.shutdown(2)  # the next write or read on it fails: the retry, as `_send` makes it
        again = p.send(Message("L", b"x"), queue_id=2)
        assert again.status == "SEND_OK" and again.queue_id == 2
        assert p._base.remoting._conns[first.broker_address] is not conn


@pytest.mark.parametrize("reference", [False, True])
def test_a_route_that_predates_the_lanes_is_asked_again(
        broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, fast_path: None, reference: bool) -> None:
    """A queue made a priority queue (by another process) after this connection cached its one-queue route:
    the publish to lane 5 finds no such queue in the route, asks the name server again and lands on lane 5."""
    if reference:
        monkeypatch.setattr(Channel, "_put", reference_put)
    ns = "p" + uuid.uuid4().hex[:10]
    with Connection(f"rocketmq://{broker.namesrv_address}//", transport_options={"namespace": ns}) as c:
        ch = c.channel()
        Queue("late", Exchange("late"), "late")(ch).declare()
        Producer(ch).publish({"n": 0}, exchange="", routing_key="late", priority=5)  # one lane: queue 0
        topic = topic_name("late", ns)
        ch.clients.admin.create_topic(topic, transport_mod.LANES)  # what another process's declare does
        ch.clients.shared.declare_queue("late", {"x-max-priority": 9})
        Producer(ch).publish({"n": 1}, exchange="", routing_key="late", priority=5)
    assert broker.store.wait_for_dispatch(10)
    with PullConsumer(broker.namesrv_address, f"late-{ns}") as pc:
        lanes = {q: [json.loads(bytes(m.body))["body"] for m in
                     pc.pull(topic, q, 0, max_nums=8, suspend_timeout_ms=0).messages] for q in (0, 5)}
    assert len(lanes[0]) == 1 and len(lanes[5]) == 1
