"""Our client against our broker over loopback: produce, long-poll consume, offsets across restarts,
retry and DLQ after failures, delay levels, admin look-ups."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.client import (
    FOUND,
    NO_MATCHED_MSG,
    NO_NEW_MSG,
    OFFSET_ILLEGAL,
    Admin,
    Message,
    MQBrokerError,
    Producer,
    PullConsumer,
    RemotingError,
)
from rmq_eventstore.common import codec
from rmq_eventstore.common.fastjson import fastjson_loads

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
FAST_LEVELS = "1s 1s 1s 1s 1s 2s"  # tests never wait for the default 10 s+ levels


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", message_delay_level=FAST_LEVELS, **SMALL)
    yield rb
    rb.close()


@pytest.fixture
def producer(broker: RunningBroker) -> Iterator[Producer]:
    p = Producer(broker.namesrv_address, "pg").start()
    yield p
    p.shutdown()


@pytest.fixture
def consumer(broker: RunningBroker) -> Iterator[PullConsumer]:
    c = PullConsumer(broker.namesrv_address, "cg").start()
    yield c
    c.shutdown()


def test_produce_and_consume(broker: RunningBroker, producer: Producer, consumer: PullConsumer) -> None:
    r = producer.send(Message("orders", b'{"n": 1}', tags="Placed", keys=["o-1", "c-9"],
                              properties={"source": "web"}), queue_id=0)
    assert r.status == "SEND_OK" and r.queue_id == 0 and r.queue_offset == 0
    assert len(r.msg_id) == 32 and r.offset_msg_id.startswith("7F000001")
    b = producer.send_batch([Message("orders", b"b%d" % i, keys=f"bk{i}") for i in range(3)], queue_id=0)
    assert b.queue_offset == 1 and len(b.msg_id.split(",")) == 3 and len(b.offset_msg_id.split(",")) == 3
    res = consumer.pull("orders", 0, 0)
    if res.status == NO_NEW_MSG:  # dispatch is asynchronous; the long poll above covers the usual case
        res = consumer.pull("orders", 0, 0)
    assert res.status == FOUND and res.next_begin_offset == 4 and res.max_offset == 4
    m = res.messages[0]
    assert m.body == b'{"n": 1}' and m.tags == "Placed" and m.keys_list() == ["o-1", "c-9"]
    assert m.get_property("source") == "web" and m.uniq_key == r.msg_id and m.msg_id == r.offset_msg_id
    assert [x.body for x in res.messages[1:]] == [b"b0", b"b1", b"b2"]
    assert [x.uniq_key for x in res.messages[1:]] == b.msg_id.split(",")
    assert consumer.queues("orders") == [0, 1, 2, 3]


def test_round_robin_and_tag_filter(broker: RunningBroker, producer: Producer, consumer: PullConsumer) -> None:
    queues = {producer.send(Message("events", b"x%d" % i, tags="A" if i % 2 else "B")).queue_id for i in range(8)}
    assert queues == {0, 1, 2, 3}
    broker.store.wait_for_dispatch()
    got = []
    for q in range(4):
        res = consumer.pull("events", q, 0, expression="A", suspend_timeout_ms=0)
        assert res.status in (FOUND, NO_MATCHED_MSG)
        got += [m.body for m in res.messages]
        assert all(m.tags == "A" for m in res.messages)
    assert sorted(got) == [b"x1", b"x3", b"x5", b"x7"]


def test_long_poll_returns_when_a_message_arrives(broker: RunningBroker, producer: Producer,
                                                  consumer: PullConsumer) -> None:
    producer.send(Message("orders", b"first"), queue_id=1)
    broker.store.wait_for_dispatch()
    timer = threading.Timer(0.3, lambda: producer.send(Message("orders", b"late"), queue_id=1))
    t0 = time.monotonic()
    timer.start()
    res = consumer.pull("orders", 1, 1, suspend_timeout_ms=15_000)
    elapsed = time.monotonic() - t0
    timer.join()
    assert res.status == FOUND and [m.body for m in res.messages] == [b"late"]
    assert 0.25 <= elapsed < 5.0  # held, then woken by the dispatcher long before the 15 s timeout
    t0 = time.monotonic()
    res = consumer.pull("orders", 1, 2, suspend_timeout_ms=300)
    assert res.status == NO_NEW_MSG and time.monotonic() - t0 >= 0.25
    assert consumer.pull("orders", 1, 99, suspend_timeout_ms=0).status == OFFSET_ILLEGAL


def test_send_while_a_pull_is_held_in_another_thread(broker: RunningBroker, producer: Producer) -> None:
    # producer and consumer share nothing but the broker; the send must not wait for the held pull
    c = PullConsumer(broker.namesrv_address, "cg2").start()
    try:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", c.pull("solo", 0, 0, suspend_timeout_ms=10_000)))
        producer.send(Message("solo", b"seed"), queue_id=1)  # creates the topic
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        producer.send(Message("solo", b"wake"), queue_id=0)
        assert time.monotonic() - t0 < 1.0
        t.join(10)
        assert result["r"].status == FOUND and result["r"].messages[0].body == b"wake"
    finally:
        c.shutdown()


def test_many_threads_share_one_producer(broker: RunningBroker, producer: Producer) -> None:
    errors: list[Exception] = []

    def work(n: int) -> None:
        try:
            for i in range(40):
                producer.send(Message("busy", b"%d:%d" % (n, i)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    broker.store.wait_for_dispatch()
    assert sum(broker.store.get_max_offset_in_queue("busy", q) for q in range(4)) == 240


def test_offsets_survive_a_broker_restart(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with serve_in_thread(path, **SMALL) as rb:
        with Producer(rb.namesrv_address, "pg") as p:
            for i in range(5):
                p.send(Message("orders", b"%d" % i), queue_id=2)
        with PullConsumer(rb.namesrv_address, "cg") as c:
            assert c.fetch_offset("orders", 2) == 0
            res = c.pull("orders", 2, 0, max_nums=3)
            assert res.status == FOUND
            c.commit_offset("orders", 2, res.next_begin_offset)
            committed = res.next_begin_offset
    with serve_in_thread(path, **SMALL) as rb:  # a new broker process would see the same files
        with PullConsumer(rb.namesrv_address, "cg") as c:
            off = c.fetch_offset("orders", 2)
            assert off == committed
            res = c.pull("orders", 2, off)
            assert [m.body for m in res.messages] == [b"%d" % i for i in range(committed, 5)]
            assert c.fetch_offset("nosuch", 0) == 0
    doc = fastjson_loads((path / "config" / "consumerOffset.json").read_text())
    assert doc["offsetTable"]["orders@cg"] == {2: committed}
    assert "cg" in fastjson_loads((path / "config" / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    assert "orders" in fastjson_loads((path / "config" / "topics.json").read_text())["topicConfigTable"]


def pull_until(c: PullConsumer, topic: str, queue_id: int, offset: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = c.pull(topic, queue_id, offset, suspend_timeout_ms=int(max(deadline - time.monotonic(), 0.1) * 1000))
        if res.status == FOUND:
            return res
        offset = res.next_begin_offset if res.status != NO_NEW_MSG else offset
    raise AssertionError(f"nothing arrived in {topic}/{queue_id} from {offset}")


def test_delayed_message_arrives_no_earlier_than_its_level(broker: RunningBroker, producer: Producer,
                                                           consumer: PullConsumer) -> None:
    t0 = time.time()
    r = producer.send(Message("later", b"tick"), queue_id=0, delay_level=1)
    assert r.status == "SEND_OK"
    res = pull_until(consumer, "later", 0, 0)
    received = time.time()
    m = res.messages[0]
    assert m.body == b"tick" and m.uniq_key == r.msg_id
    assert received - t0 >= 1.0
    assert m.store_timestamp - m.born_timestamp >= 1000  # re-put no earlier than born + 1 s
    assert m.get_property("REAL_TOPIC") == "later" and m.get_property("DELAY") is None
    assert m.get_property("WAIT") == "false"
    assert received - t0 < 6.0
    broker.close()
    doc = fastjson_loads(open(os.path.join(broker.store.config.config_path, "delayOffset.json")).read())
    assert doc["offsetTable"][1] == 1  # level 1 delivered up to offset 1


def test_retry_then_dead_letter_queue(broker: RunningBroker, producer: Producer, consumer: PullConsumer) -> None:
    producer.send(Message("jobs", b"fails", keys="job-1"), queue_id=0)
    res = pull_until(consumer, "jobs", 0, 0)
    msg = res.messages[0]
    retry = consumer.retry_topic
    offset = 0
    for attempt in range(1, 3):  # two failed attempts: back into %RETRY%cg after the delay level
        t0 = time.time()
        consumer.send_back(msg, delay_level=1, max_reconsume_times=2)
        res = pull_until(consumer, retry, 0, offset)
        msg = res.messages[0]
        offset = res.next_begin_offset
        assert time.time() - t0 >= 0.9
        assert msg.body == b"fails" and msg.reconsume_times == attempt
        assert msg.get_property("RETRY_TOPIC") == "jobs" and msg.get_property("ORIGIN_MESSAGE_ID")
    consumer.send_back(msg, delay_level=1, max_reconsume_times=2)  # the third failure: dead letter
    res = pull_until(consumer, "%DLQ%cg", 0, 0)
    dead = res.messages[0]
    assert dead.body == b"fails" and dead.reconsume_times == 3 and dead.keys == "job-1"
    assert dead.get_property("DELAY") is None
    # a default-level send-back (level 3 + reconsume times) lands in the schedule topic, not in retry yet
    producer.send(Message("jobs", b"again"), queue_id=0)
    m2 = pull_until(consumer, "jobs", 0, 1).messages[0]
    consumer.send_back(m2)
    broker.store.wait_for_dispatch()
    assert broker.store.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 2) == 1  # level 3 = queue 2


def test_retry_topic_send_over_the_limit_goes_to_dlq(broker: RunningBroker, producer: Producer) -> None:
    # what ali-ons does when send-back fails: it sends to %RETRY%group itself with reconsumeTimes
    msg = Message("%RETRY%cg", b"direct", reconsume_times=16)
    r = producer.send(msg, queue_id=0)
    assert r.status == "SEND_OK"
    broker.store.wait_for_dispatch()
    assert broker.store.get_max_offset_in_queue("%DLQ%cg", 0) == 1


def test_admin(broker: RunningBroker, producer: Producer) -> None:
    with Admin(broker.namesrv_address) as admin:
        admin.create_topic("audit", queue_nums=2)
        assert "audit" in admin.topic_list()
        assert len(admin.topic_route("audit").queues) == 2
        t0 = int(time.time() * 1000)
        r = producer.send(Message("audit", b"who", keys="user-7"), queue_id=1)
        broker.store.wait_for_dispatch()
        assert [m.body for m in admin.query_message("audit", "user-7")] == [b"who"]
        assert [m.body for m in admin.query_message("audit", r.msg_id)] == [b"who"]  # by UNIQ_KEY
        assert admin.query_message("audit", "nobody") == []
        assert admin.view_message(r.offset_msg_id).body == b"who"
        assert admin.max_offset("audit", 1) == 1 and admin.min_offset("audit", 1) == 0
        assert admin.search_offset("audit", 1, t0 - 1000) == 0
        assert admin.earliest_msg_store_time("audit", 1) >= t0 - 5
        assert admin.consumer_offset("nobody", "audit", 1) == 0
        assert admin.broker_addresses() == {"broker-a": broker.broker_address}
        with pytest.raises(MQBrokerError, match="SYSTEM_ERROR"):
            admin.create_topic("SCHEDULE_TOPIC_XXXX")


def test_errors_are_clear(broker: RunningBroker, producer: Producer) -> None:
    with pytest.raises(MQBrokerError, match="NO_PERMISSION"):
        producer.send(Message("SCHEDULE_TOPIC_XXXX", b"x"))  # the broker writes it, clients may not
    with pytest.raises(ValueError):
        producer.send(Message("bad/topic", b"x"))
    with pytest.raises(MQBrokerError, match="MESSAGE_ILLEGAL"):
        producer.send(Message("orders", b"x" * (4 * 1024 * 1024 + 1)), queue_id=0)
    with pytest.raises(ValueError, match="split it"):
        producer.send_batch([Message("orders", b"x" * 1024 * 1024) for _ in range(5)])
    with pytest.raises(ValueError, match="same topic"):
        producer.send_batch([Message("orders", b"x"), Message("other", b"y")])
    dead = Producer("127.0.0.1:1", "pg").start()
    with pytest.raises(RemotingError, match="no name server reachable"):
        dead.send(Message("orders", b"x"))
    dead.shutdown()


def test_route_bodies_from_a_java_name_server_parse() -> None:
    from rmq_eventstore.client.base import loads_body

    # fastjson writes integer map keys unquoted; a real RocketMQ name server's route looks like this
    body = b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.5:10911"},"brokerName":"b","cluster":"c"}],"queueDatas":[]}'
    assert loads_body(body)["brokerDatas"][0]["brokerAddrs"] == {0: "10.0.0.5:10911"}


def test_sync_flush_broker_serves_sends_off_the_event_loop(tmp_path: Path) -> None:
    # with SYNC_FLUSH a send is answered after its fsync; sends run in a thread pool, pulls stay prompt
    with serve_in_thread(tmp_path / "s", flush_disk_type="SYNC_FLUSH", **SMALL) as rb:
        with Producer(rb.namesrv_address, "pg") as p, PullConsumer(rb.namesrv_address, "cg") as c:
            results = [p.send(Message("durable", b"%d" % i), queue_id=0) for i in range(5)]
            assert all(r.status == "SEND_OK" for r in results)
            res = pull_until(c, "durable", 0, 0)
            assert [m.body for m in res.messages] == [b"%d" % i for i in range(len(res.messages))]
            # every answered send was flushed before its answer
            last_record = codec.decode_message_id(results[-1].offset_msg_id)[2]
            assert rb.store.commit_log.mapped_file_queue.flushed_where > last_record


def test_delayed_message_survives_a_restart_before_it_is_due(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with serve_in_thread(path, message_delay_level="2s", **SMALL) as rb:
        with Producer(rb.namesrv_address, "pg") as p:
            p.send(Message("later", b"after restart"), queue_id=0, delay_level=1)
        assert rb.store.get_max_offset_in_queue("later", 0) == 0  # not yet due
    with serve_in_thread(path, message_delay_level="2s", **SMALL) as rb:
        with PullConsumer(rb.namesrv_address, "cg") as c:
            res = pull_until(c, "later", 0, 0)
            assert [m.body for m in res.messages] == [b"after restart"]
            assert res.messages[0].store_timestamp - res.messages[0].born_timestamp >= 2000
        time.sleep(0.3)  # nothing is delivered twice
        assert rb.store.get_max_offset_in_queue("later", 0) == 1


def test_shutdown_does_not_wait_for_a_heartbeat_stuck_on_a_silent_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that accepts and never answers (a stalled network): the heartbeat thread is inside its request
    (up to the client's timeout) when the client shuts down. Shutdown closes the connections first, which ends
    that request at once, then joins the thread: it returns at once and leaves no thread behind (before, it
    waited 5 s for the thread and returned with it still blocked)."""
    from rmq_eventstore.client import base as client_base

    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True)
    acceptor.start()
    addr = f"127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setattr(client_base, "HEARTBEAT_INTERVAL_SECONDS", 0.05)
    c = client_base.ClientBase(addr, timeout=20.0)
    c._pinned.add(addr)  # heartbeated like a broker of a route
    try:
        c.start()
        acceptor.join(5)
        assert accepted, "the heartbeat did not connect"
        time.sleep(0.3)  # its request is written and waits for an answer that never comes
        thread = c._heartbeat_thread
        assert thread is not None and thread.is_alive()
        t0 = time.monotonic()
        c.shutdown()
        took = time.monotonic() - t0
        assert took < 1.0, f"shutdown took {took:.2f} s"
        assert not thread.is_alive()
    finally:
        for s in accepted:
            s.close()
        silent.close()
