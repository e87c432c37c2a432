"""The broker's short path for plain sends (`SendMessageProcessor.lane`, what the server calls for a
SEND_MESSAGE_V2) stores and answers exactly what the full path (`Broker.process`) does, and leaves every
request it is not made for to the full path: batches, streams, transactions, delays and timers, retry,
DLQ and system topics, unknown or read-only topics, bad header fields. Real stores on real files; one run
over a real broker socket checks the server uses it and that a topic made read-only is refused at once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import Message, MQBrokerError, Producer
from rmq_eventstore.client.admin import Admin
from rmq_eventstore.common.rng import rng
from rmq_eventstore.common.topic_config import PermName
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore
from tests.conftest import SMALL_GEOMETRY

TOPIC = "LaneTopic"
HOST = "127.0.0.1:10911"


class Channel:
    """What the server hands a processor: the peer's address."""

    remote_address = "10.1.2.3:45678"


def _broker(path: Path) -> Iterator[Broker]:
    with MessageStore.open(path, store_host=HOST, **SMALL_GEOMETRY) as store:
        b = Broker(store)
        b.start()
        b.create_topic(TOPIC, 4, 4)
        try:
            yield b
        finally:
            b.shutdown()


@pytest.fixture
def lane_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "lane")


@pytest.fixture
def full_broker(tmp_path: Path) -> Iterator[Broker]:
    yield from _broker(tmp_path / "full")


def _send(topic: str = TOPIC, props: str = "UNIQ_KEY\x01AC1100010000000000000000000001\x02", body: bytes = b"x",
          **fields: Any) -> RemotingCommand:
    """A SEND_MESSAGE_V2 as our Producer and the Java client send it (short field names, strings)."""
    ext = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000123", "h": "0",
           "i": props, "j": "0", "k": "false"}
    ext.update({k: v for k, v in fields.items() if v is not None})
    for k in [k for k, v in fields.items() if v is None]:
        ext.pop(k, None)
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext, body, opaque=77)


def _records(b: Broker, generated_uniq: bool = False) -> list[tuple]:
    """Every stored record of the test topic, all its fields but the store timestamp (the clock's); with
    `generated_uniq`, the value of a UNIQ_KEY the broker generated is masked (each broker makes its own)."""
    out = []
    for q in range(4):
        for offset in range(b.store.get_max_offset_in_queue(TOPIC, q)):
            r = b.store.get_message("g", TOPIC, q, offset, 1)
            for m in r.messages:
                props = m.properties_string
                if generated_uniq:
                    props = re.sub("UNIQ_KEY\x01[0-9A-F]{32}\x02", "UNIQ_KEY\x01*\x02", props)
                out.append((m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, m.store_size, bytes(m.body),
                            props, m.flag, m.sys_flag, m.born_timestamp, m.born_host, m.store_host,
                            m.reconsume_times, m.body_crc))
    return out


PLAIN = [
    {},
    {"e": "0"}, {"e": "3"}, {"e": "-1"},
    {"i": ""},  # no properties at all: UNIQ_KEY and CLUSTER added
    {"i": "TAGS\x01t\x02KEYS\x01a b"},  # no trailing separator, no UNIQ_KEY
    {"i": "TAGS\x01t\x02CLUSTER\x01other\x02UNIQ_KEY\x01AC11\x02"},  # CLUSTER kept as sent
    {"h": "7", "j": "2", "g": "1"},
    {"f": "1"},  # compressed flag: not a transaction bit
    {"m": "false"},  # what the Java client sends for a single message
    {"l": "16", "n": "broker-a"},
    {"e": " 2 ", "h": "+7", "j": "007", "d": "08", "l": "0_1"},  # not the small ints' canonical texts: int()
]


@pytest.mark.parametrize("fields", PLAIN, ids=[str(i) for i in range(len(PLAIN))])
def test_the_lane_stores_and_answers_what_the_full_path_does(lane_broker: Broker, full_broker: Broker,
                                                              fields: dict[str, str]) -> None:
    for body in (b"", b"hello", bytes(range(256)) * 8):
        req = _send(body=body, **fields)
        rng.seed(5)
        fast = lane_broker.send_processor.lane(req, Channel())
        rng.seed(5)
        full = full_broker.process(_send(body=body, **fields), Channel())
        assert fast is not None, "the lane declined a plain send"
        assert fast.code == ResponseCode.SUCCESS
        assert fast.encode() == full.encode()
    lane_broker.store.reput_message_service.wait_for()
    full_broker.store.reput_message_service.wait_for()
    generated = "UNIQ_KEY" not in _send(**fields).ext_fields["i"]
    assert _records(lane_broker, generated) == _records(full_broker, generated)
    assert len(_records(lane_broker)) == 3


DECLINED = {
    "batch": dict(m="true"),
    "batch upper case": dict(m=" TRUE "),
    "stream append": dict(streamId="order-1"),
    "expected version": dict(expectedVersion="3"),
    "multi-stream": dict(streams="{}"),
    "delay level": dict(i="DELAY\x013\x02"),
    "timer": dict(i="TIMER_DELIVER_MS\x0199999999999999\x02"),
    "half message property": dict(i="TRAN_MSG\x01true\x02"),
    "prepared sysFlag": dict(f=str(0x4)),
    "commit sysFlag": dict(f=str(0x8)),
    "rollback sysFlag": dict(f=str(0xC)),
    "queue out of range": dict(e="4"),
    "queueId missing": dict(e=None),
    "queueId not an int": dict(e="one"),
    "queueId a float": dict(e="1.0"),
    "flag not an int": dict(h="0x1"),
    "bornTimestamp missing": dict(g=None),
    "topic missing": dict(b=None),
    "batch by its V1 name": dict(batch="true"),
    "properties by their V1 name": dict(i=None, properties="DELAY\x013\x02"),
    "maxReconsumeTimes not an int": dict(l="many"),
    "maxReconsumeTimes by its V1 name": dict(maxReconsumeTimes="3"),
    "defaultTopicQueueNums not an int": dict(d="four"),
    "defaultTopicQueueNums by its V1 name": dict(defaultTopicQueueNums="8"),
}


@pytest.mark.parametrize("fields", DECLINED.values(), ids=DECLINED.keys())
def test_the_lane_leaves_other_sends_to_the_full_path(lane_broker: Broker, fields: dict[str, Any]) -> None:
    end = lane_broker.store.get_max_phy_offset()
    assert lane_broker.send_processor.lane(_send(**fields), Channel()) is None
    assert lane_broker.store.get_max_phy_offset() == end  # nothing stored


# topics a lane leaves to the full path: retry, DLQ and system topics, one not created, an illegal name
SPECIAL_TOPICS = ["%RETRY%g", "%DLQ%g", "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer",
                  "NotCreatedYet", "bad topic!", "TBW102"]


@pytest.mark.parametrize("topic", SPECIAL_TOPICS)
def test_the_lane_leaves_special_and_unknown_topics_to_the_full_path(lane_broker: Broker, topic: str) -> None:
    if topic.startswith("%RETRY%"):
        lane_broker.create_topic(topic, 1, 1)  # a retry topic that exists is still the full path's
    end = lane_broker.store.get_max_phy_offset()
    assert lane_broker.send_processor.lane(_send(topic=topic), Channel()) is None
    assert lane_broker.store.get_max_phy_offset() == end


def test_a_topic_changed_after_a_send_is_checked_again(lane_broker: Broker) -> None:
    sp = lane_broker.send_processor
    assert sp.lane(_send(), Channel()) is not None
    lane_broker.create_topic(TOPIC, 4, 4, perm=PermName.PERM_READ)  # read-only now
    assert sp.lane(_send(), Channel()) is None
    r = lane_broker.process(_send(), Channel())
    assert r.code == ResponseCode.NO_PERMISSION
    lane_broker.create_topic(TOPIC, 2, 2)  # writeable again, two queues
    assert sp.lane(_send(e="1"), Channel()) is not None
    assert sp.lane(_send(e="2"), Channel()) is None  # out of range now: the full path's refusal
    assert lane_broker.process(_send(e="2"), Channel()).code == ResponseCode.SYSTEM_ERROR


def test_a_failed_put_answers_its_status(lane_broker: Broker) -> None:
    lane_broker.store.shutdown()
    r = lane_broker.send_processor.lane(_send(), Channel())
    assert r is not None and r.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "not running" in (r.remark or "")


def test_the_server_serves_plain_sends_on_the_lane_and_refuses_at_once_after_a_change(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic(TOPIC, 4, 4)
        with Producer(running.namesrv_address, "lane-producer") as p:
            results = [p.send(Message(TOPIC, b"m%d" % i, keys=[f"k{i}"]), queue_id=i % 4) for i in range(8)]
            assert [r.queue_offset for r in results] == [0, 0, 0, 0, 1, 1, 1, 1]
            assert TOPIC in running.broker.send_processor._lane_routes  # served by the lane
            with Admin(running.namesrv_address) as admin:
                admin.create_topic(TOPIC, 4, perm=PermName.PERM_READ)
            with pytest.raises(MQBrokerError) as e:
                p.send(Message(TOPIC, b"refused"), queue_id=0)
            assert e.value.code == ResponseCode.NO_PERMISSION
        running.store.reput_message_service.wait_for()
        got = [bytes(m.body) for q in range(4) for m in running.store.get_message("g", TOPIC, q, 0, 10).messages]
        assert sorted(got) == sorted(b"m%d" % i for i in range(8))
