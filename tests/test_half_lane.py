"""The half lane: the C send lane (`_native.send_lane` / `send_frame`, what the server calls first) serves the usual
half message of a transaction (TRAN_MSG=true) as the full path (`Broker.process` → `SendMessageProcessor._store` →
`TransactionalMessageService.prepare`) stores and answers it: the same response frame bytes (with its
`transactionId`), the same record in RMQ_SYS_TRANS_HALF_TOPIC queue 0 (REAL_TOPIC / REAL_QID appended, the
transaction bits cleared), and the same committed and op records once END_TRANSACTION ends it. Everything unusual
(another TRAN_MSG value, the COMMIT or ROLLBACK bits, REAL_* already there, a transaction id that needs an escape,
wide characters, a broker that rejects transaction messages, no UNIQ_KEY to be had...) is declined with nothing
stored. Twin brokers on real files; one real broker serving a TransactionProducer over a socket."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.processor.send import NATIVE_FRAME_LANE, NATIVE_LANE
from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import PullConsumer, TransactionProducer, TransactionState
from rmq_eventstore.common import Message, codec
from rmq_eventstore.common.rng import rng
from rmq_eventstore.common.topic import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC
from rmq_eventstore.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_SIZE,
    FrameDecoder,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from tests.conftest import SMALL_GEOMETRY
from tests.test_send_lane import TOPIC, _broker, _records, _send
from tests.test_send_lane_native import Host


@pytest.fixture
def c_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "c")


@pytest.fixture
def py_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "py")


UNIQ = "UNIQ_KEY\x01AC1100010000000000000000000001\x02"
TRAN = "TRAN_MSG\x01true\x02PGROUP\x01tx-group\x02"


def _half(props: str = UNIQ + TRAN, **fields: Any) -> RemotingCommand:
    """A half message as our TransactionProducer sends it (the PREPARED sysFlag unless `f` says otherwise)."""
    fields.setdefault("f", "4")
    return _send(props=props, **fields)


def _served(b: Broker, req: RemotingCommand, host: str) -> tuple[bytes, bool]:
    """What the server answers: the C lane's frame (True) when it serves the request, else the Python lane's
    answer or the full path's (False)."""
    sp = b.send_processor
    if NATIVE_LANE is not None:
        got = NATIVE_LANE(req, host, sp.lane_context())
        if got.__class__ is bytes:
            return got, True
        if got is not None:
            return sp.lane_answer(*got).encode(), False
    r = sp.lane(req, Host(host)) or b.process(req, Host(host))
    return r.encode(), False


def _half_records(b: Broker, generated: bool) -> list[tuple]:
    """Every record of the half topic's queue 0, all fields but the store timestamp; a UNIQ_KEY the broker made
    masked with `generated` (each broker makes its own)."""
    b.store.reput_message_service.wait_for()
    out = []
    for offset in range(b.store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)):
        for m in b.store.get_message("g", RMQ_SYS_TRANS_HALF_TOPIC, 0, offset, 1).messages:
            props = m.properties_string
            if generated:
                props = re.sub("UNIQ_KEY\x01[0-9A-F]{32}\x02", "UNIQ_KEY\x01*\x02", props)
            out.append((m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.store_size, bytes(m.body),
                        props, m.flag, m.sys_flag, m.born_timestamp, m.born_host, m.store_host,
                        m.reconsume_times, m.body_crc, m.prepared_transaction_offset))
    return out


def _masked(frame: bytes, generated: bool) -> bytes:
    return re.sub(rb'"transactionId":"[0-9A-F]{32}"', b'"transactionId":"*"', frame) if generated else frame


def _route(*brokers: Broker) -> None:
    for b in brokers:  # the topic's route is made by the Python lane (the C lane only reads it)
        assert b.send_processor.lane(_send(), Host("10.9.8.7:1")) is not None


SPREAD: list[tuple[str, dict[str, Any]]] = [
    ("our producer", {}),
    ("queue 0", {"e": "0"}),
    ("queue 3", {"e": "3"}),
    ("no sysFlag bit, TRAN_MSG only", {"f": "0"}),
    ("other sysFlag bits kept", {"f": str(0x4 | 0x1 | 0x10)}),
    ("UNIQ_KEY made by the broker", {"props": TRAN}),
    ("UNIQ_KEY made, no trailing separator", {"props": "TRAN_MSG\x01true"}),
    ("TRAN_MSG first, keys and tags", {"props": "TRAN_MSG\x01true\x02KEYS\x01k1 k2\x02TAGS\x01t\x02" + UNIQ}),
    ("CLUSTER sent, no trailing separator", {"props": UNIQ + "TRAN_MSG\x01true\x02CLUSTER\x01c"}),
    ("Latin-1 key", {"props": "KEYS\x01caf\xe9\x02" + UNIQ + TRAN}),
    ("a client's odd transaction id", {"props": "UNIQ_KEY\x01a b/c:d-1\x02" + TRAN}),
    ("two UNIQ_KEYs: the first is the id", {"props": "UNIQ_KEY\x01FIRST\x02" + TRAN + "UNIQ_KEY\x01SECOND\x02"}),
    ("flag, reconsume, timestamp", {"h": "7", "j": "2", "g": "1"}),
    ("batch false", {"m": "false"}),
]


@pytest.mark.parametrize("fields", [f for _, f in SPREAD], ids=[n for n, _ in SPREAD])
def test_the_lane_stores_and_answers_a_half_message_as_the_full_path(c_broker: Broker, py_broker: Broker,
                                                                    fields: dict[str, Any]) -> None:
    _route(c_broker, py_broker)
    generated = "UNIQ_KEY\x01" not in _half(**fields).ext_fields["i"]
    served = 0
    for i, host in enumerate(["10.1.2.3:45678", "[::1]:9876", "10.1.2.3:1"]):
        body = (b"", b"hello", bytes(range(256)) * 8)[i]
        rng.seed(5)
        got, by_c = _served(c_broker, _half(body=body, **fields), host)
        rng.seed(5)
        want = py_broker.process(_half(body=body, **fields), Host(host))
        assert want.code == ResponseCode.SUCCESS and "transactionId" in want.ext_fields
        assert _masked(got, generated) == _masked(want.encode(), generated)
        served += by_c
    got_records, want_records = _half_records(c_broker, generated), _half_records(py_broker, generated)
    assert got_records == want_records and len(got_records) == 3
    for r in got_records:
        assert "REAL_TOPIC\x01LaneTopic\x02REAL_QID\x01" in r[6] and r[8] & 0xC == 0
    assert sum(c_broker.store.get_max_offset_in_queue(TOPIC, q) for q in range(4)) == 1  # only the route's send
    if NATIVE_LANE is not None:
        assert served == 3, "the C lane declined a usual half message"


def test_the_transaction_id_answered_is_the_stored_uniq_key(c_broker: Broker) -> None:
    _route(c_broker)
    got, by_c = _served(c_broker, _half(props=TRAN), "10.1.2.3:4")
    cmd = FrameDecoder().feed(got)[0]
    stored = _half_records(c_broker, False)[-1][6]
    assert f"UNIQ_KEY\x01{cmd.ext_fields['transactionId']}\x02" in stored
    assert by_c == (NATIVE_LANE is not None)


DECLINED = {
    "TRAN_MSG TRUE": dict(props=UNIQ + "TRAN_MSG\x01TRUE\x02"),
    "TRAN_MSG false, PREPARED bit": dict(props=UNIQ + "TRAN_MSG\x01false\x02"),
    "first TRAN_MSG not true": dict(props=UNIQ + "TRAN_MSG\x01no\x02TRAN_MSG\x01true\x02"),
    "TRAN_MSG only inside a value": dict(props=UNIQ + "KEYS\x01xTRAN_MSG\x01true\x02", f="0"),
    "COMMIT bits": dict(f=str(0x8)),
    "ROLLBACK bits": dict(f=str(0xC)),
    "REAL_TOPIC already": dict(props=UNIQ + TRAN + "REAL_TOPIC\x01Other\x02"),
    "REAL_QID already": dict(props=UNIQ + TRAN + "REAL_QID\x013\x02"),
    "REAL_ as a substring": dict(props=UNIQ + TRAN + "KEYS\x01xREAL_TOPICx\x02"),
    "UNIQ_KEY only inside a value": dict(props="KEYS\x01aUNIQ_KEY\x01b\x02" + TRAN),
    "transaction id with a quote": dict(props='UNIQ_KEY\x01a"b\x02' + TRAN),
    "transaction id with a backslash": dict(props="UNIQ_KEY\x01a\\b\x02" + TRAN),
    "transaction id not ASCII": dict(props="UNIQ_KEY\x01caf\xe9\x02" + TRAN),
    "transaction id empty": dict(props="UNIQ_KEY\x01\x02" + TRAN),
    "transaction id too long": dict(props="UNIQ_KEY\x01" + "A" * 65 + "\x02" + TRAN),
    "wide characters": dict(props="KEYS\x01\u6d88\x02" + UNIQ + TRAN),
    "delayed": dict(props=UNIQ + TRAN + "DELAY\x013\x02"),
    "timer": dict(props=UNIQ + TRAN + "TIMER_DELIVER_MS\x0199\x02"),
    "stream append": dict(streamId="order-1"),
    "expected version": dict(expectedVersion="3"),
    "batch": dict(m="true"),
    "random queue": dict(e="-1"),
    "queue out of range": dict(e="4"),
    "queueId missing": dict(e=None),
    "topic not known yet": dict(topic="NotCreatedYet"),
    "retry topic": dict(topic="%RETRY%g"),
}


@pytest.mark.parametrize("fields", DECLINED.values(), ids=DECLINED.keys())
def test_the_lane_declines_unusual_half_messages(c_broker: Broker, fields: dict[str, Any]) -> None:
    _route(c_broker)
    end = c_broker.store.get_max_phy_offset()
    sp = c_broker.send_processor
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_half(**fields), "1.2.3.4:5", sp.lane_context()) is None
        got, _ = _frame_lane(c_broker, _half(**fields).encode())
        assert got is None
    assert sp.lane(_half(**fields), Host("1.2.3.4:5")) is None  # the Python lane leaves every half to the full path
    assert c_broker.store.get_max_phy_offset() == end  # nothing stored


def test_the_lane_declines_when_the_broker_rejects_transaction_messages(c_broker: Broker) -> None:
    _route(c_broker)
    c_broker.config.reject_transaction_message = True
    end = c_broker.store.get_max_phy_offset()
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_half(), "1.2.3.4:5", c_broker.send_processor.lane_context()) is None
    assert c_broker.store.get_max_phy_offset() == end
    assert c_broker.process(_half(), Host("1.2.3.4:5")).code == ResponseCode.NO_PERMISSION
    c_broker.config.reject_transaction_message = False
    assert _served(c_broker, _half(), "1.2.3.4:5")[1] == (NATIVE_LANE is not None)


def test_without_uniq_keys_made_a_half_without_one_is_the_full_paths(c_broker: Broker, py_broker: Broker) -> None:
    _route(c_broker, py_broker)
    for b in (c_broker, py_broker):
        b.store.config.auto_create_uniq_key = False
    end = c_broker.store.get_max_phy_offset()
    if NATIVE_LANE is not None:
        assert NATIVE_LANE(_half(props=TRAN), "1.2.3.4:5", c_broker.send_processor.lane_context()) is None
        assert c_broker.store.get_max_phy_offset() == end
    got, by_c = _served(c_broker, _half(), "1.2.3.4:5")  # one with its UNIQ_KEY is still the lane's
    assert got == py_broker.process(_half(), Host("1.2.3.4:5")).encode()
    assert by_c == (NATIVE_LANE is not None)
    assert _half_records(c_broker, False) == _half_records(py_broker, False)


def test_an_eight_tuple_context_leaves_half_messages_to_the_full_path(c_broker: Broker) -> None:
    _route(c_broker)
    if NATIVE_LANE is not None:
        ctx = c_broker.send_processor.lane_context()
        assert NATIVE_LANE(_half(), "1.2.3.4:5", ctx[:8]) is None
        assert NATIVE_LANE(_half(), "1.2.3.4:5", (*ctx[:8], None)) is None
        assert isinstance(NATIVE_LANE(_send(), "1.2.3.4:5", ctx[:8]), bytes)  # plain sends as before


def _frame_lane(b: Broker, data: bytes, host: str = "10.1.2.3:4") -> tuple[Any, int]:
    holds: list[int] = []
    got = NATIVE_FRAME_LANE(data, host, (b.send_processor.lane_context(), lambda: holds.append(1),
                                         DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE, bytearray()))
    return got, len(holds)


def test_the_frame_lane_serves_a_half_message_from_its_bytes(c_broker: Broker, py_broker: Broker) -> None:
    _route(c_broker, py_broker)
    for fields in ({}, {"props": TRAN}, {"e": "2", "f": "0"}):
        generated = "UNIQ_KEY\x01" not in _half(**fields).ext_fields["i"]
        if NATIVE_FRAME_LANE is None:  # pure Python: the server decodes the frame and takes the full path
            got, holds = c_broker.process(_half(**fields), Host("10.1.2.3:4")).encode(), 1
        else:
            got, holds = _frame_lane(c_broker, _half(**fields).encode())
        want = py_broker.process(_half(**fields), Host("10.1.2.3:4"))
        assert isinstance(got, bytes) and holds == 1
        assert _masked(got, generated) == _masked(want.encode(), generated)
    assert _half_records(c_broker, True) == _half_records(py_broker, True)


def test_a_put_answered_in_python_carries_the_transaction_id(c_broker: Broker, py_broker: Broker) -> None:
    # the C lane hands (request, result, queue id, transaction id) back when it does not write the frame itself;
    # lane_answer must then answer as the full path: the same fields, transactionId last
    want = py_broker.process(_half(), Host("1.2.3.4:5"))
    half = py_broker.store.look_message_by_offset(codec.decode_message_id(want.ext_fields["msgId"])[2])
    msg = Message(RMQ_SYS_TRANS_HALF_TOPIC, bytes(half.body), queue_id=0, properties_string=half.properties_string,
                  born_timestamp=half.born_timestamp, born_host=half.born_host)
    res = c_broker.store.put_message(msg)
    got = c_broker.send_processor.lane_answer(_half(), res, 1, "AC1100010000000000000000000001")
    assert got.encode() == want.encode()
    c_broker.store.shutdown()  # a refused put: the status, no transaction id (as `_store` answers it)
    py_broker.store.shutdown()
    refused = c_broker.store.put_message(msg)
    assert (c_broker.send_processor.lane_answer(_half(), refused, 1, "X").encode()
            == py_broker.process(_half(), Host("1.2.3.4:5")).encode())


def _end(b: Broker, sent: bytes, commit: bool) -> None:
    ext = FrameDecoder().feed(sent)[0].ext_fields
    header = {"topic": TOPIC, "producerGroup": "tx-group", "tranStateTableOffset": ext["queueOffset"],
              "commitLogOffset": codec.decode_message_id(ext["msgId"])[2],
              "commitOrRollback": 8 if commit else 12, "fromTransactionCheck": False,
              "msgId": ext["transactionId"], "transactionId": ext["transactionId"]}
    r = b.process(RemotingCommand.request(RequestCode.END_TRANSACTION, header), Host("1.2.3.4:5"))
    assert r.code == ResponseCode.SUCCESS


def _topic_records(b: Broker, topic: str, queues: int) -> list[tuple]:
    b.store.reput_message_service.wait_for()
    return [(m.topic, m.queue_id, m.queue_offset, bytes(m.body), m.properties_string, m.sys_flag,
             m.prepared_transaction_offset)
            for q in range(queues) for offset in range(b.store.get_max_offset_in_queue(topic, q))
            for m in b.store.get_message("g", topic, q, offset, 1).messages]


def test_ends_of_lane_stored_halves_write_what_they_write_after_the_full_path(c_broker: Broker,
                                                                              py_broker: Broker) -> None:
    _route(c_broker, py_broker)
    for i in range(4):
        props = f"UNIQ_KEY\x01AC11000100000000000000000000{i:02d}\x02" + TRAN
        got, _ = _served(c_broker, _half(props=props, e=str(i)), "1.2.3.4:5")
        want = py_broker.process(_half(props=props, e=str(i)), Host("1.2.3.4:5")).encode()
        assert got == want
        _end(c_broker, got, i != 2)
        _end(py_broker, want, i != 2)
    assert _topic_records(c_broker, TOPIC, 4) == _topic_records(py_broker, TOPIC, 4)
    assert len(_topic_records(c_broker, TOPIC, 4)) == 1 + 3  # the route's send and three commits
    assert _topic_records(c_broker, RMQ_SYS_TRANS_OP_HALF_TOPIC, 1) == _topic_records(
        py_broker, RMQ_SYS_TRANS_OP_HALF_TOPIC, 1)


SEGMENTS = st.sampled_from(["KEYS\x01k\x02", "TAGS\x01t", "UNIQ_KEY\x01ID1\x02", "UNIQ_KEY\x01", "CLUSTER\x01c\x02",
                            "TRAN_MSG\x01true\x02", "TRAN_MSG\x01", "true", "\x02", "\x01", "PGROUP\x01g\x02",
                            "REAL_QID", "caf\xe9", "x", "DELA", "TRAN_MS"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(SEGMENTS, max_size=7), prepared=st.booleans())
def test_any_properties_text_is_served_as_the_full_path_or_declined(c_broker: Broker, py_broker: Broker,
                                                                    parts: list[str], prepared: bool) -> None:
    _route(c_broker, py_broker)
    props = "".join(parts)
    req = _half(props=props, f="4" if prepared else "0")
    end = c_broker.store.get_max_phy_offset()
    got = NATIVE_LANE(req, "1.2.3.4:5", c_broker.send_processor.lane_context()) if NATIVE_LANE else None
    if got is None:
        assert c_broker.store.get_max_phy_offset() == end
        return
    rng.seed(3)
    want = py_broker.process(_half(props=props, f="4" if prepared else "0"), Host("1.2.3.4:5"))
    generated = "UNIQ_KEY\x01" not in props
    assert _masked(got, generated) == _masked(want.encode(), generated)
    assert _half_records(c_broker, True) == _half_records(py_broker, True)  # earlier examples made UNIQ_KEYs too
    assert _records(c_broker, True) == _records(py_broker, True)  # a plain send the lane served (and the routes')


def test_a_served_broker_takes_a_transaction_producers_halves_on_the_lane(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic(TOPIC, 4, 4)
        with TransactionProducer(running.namesrv_address, "tx-group", lambda half: TransactionState.COMMIT) as tp:
            tp.send_in_transaction(Message(TOPIC, b"route"), lambda m: TransactionState.ROLLBACK)
            sent = [tp.prepare(Message(TOPIC, b"m%d" % i, keys=[f"k{i}"])) for i in range(6)]
            for i, s in enumerate(sent):
                assert s.status == "SEND_OK" and s.transaction_id
                tp.end_transaction(s, TransactionState.COMMIT if i % 3 else TransactionState.ROLLBACK)
        bodies: list[bytes] = []
        with PullConsumer(running.namesrv_address, "half-lane-reader") as c:
            for _ in range(100):  # the ENDs are one-way: their commits are written a little later
                bodies = sorted(bytes(m.body) for q in range(4) for m in c.pull(TOPIC, q, 0, 32, 0).messages)
                if len(bodies) == 4:
                    break
                time.sleep(0.05)
        assert bodies == [b"m1", b"m2", b"m4", b"m5"]
        running.store.reput_message_service.wait_for()
        halves = running.store.get_message("g", RMQ_SYS_TRANS_HALF_TOPIC, 0, 0, 32).messages
        assert len(halves) == 7
        assert all(m.properties.get("REAL_TOPIC") == TOPIC for m in halves)
        assert [m.properties.get("UNIQ_KEY") for m in halves[1:]] == [s.transaction_id for s in sent]
