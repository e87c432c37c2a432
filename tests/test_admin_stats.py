"""The statistics requests a dashboard uses, through `Admin` against a real broker: RocketMQ's
GET_BROKER_RUNTIME_INFO, GET_TOPIC_STATS_INFO, GET_CONSUME_STATS, GET_ALL_SUBSCRIPTIONGROUP_CONFIG (with
RocketMQ's bodies: KVTable, and fastjson maps keyed by MessageQueue objects) and our
GET_BROKER_STATS_HISTORY (the broker's sampled ring buffer)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.broker.stats import BrokerStatsService
from rmq_eventstore.client import Admin, Message, MQBrokerError, Producer, PullConsumer
from rmq_eventstore.common.fastjson import ObjectKey, fastjson_loads
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", stats_sample_interval=100, stats_history_size=50, **SMALL)
    yield rb
    rb.close()


@pytest.fixture
def admin(broker: RunningBroker) -> Iterator[Admin]:
    a = Admin(broker.namesrv_address).start()
    yield a
    a.shutdown()


def _fill(broker: RunningBroker, per_queue: dict[int, int], topic: str = "orders") -> None:
    p = Producer(broker.namesrv_address, "pg").start()
    try:
        for q, n in per_queue.items():
            for i in range(n):
                assert p.send(Message(topic, b"x%d" % i, keys=[f"k-{q}-{i}"]), queue_id=q).status == "SEND_OK"
    finally:
        p.shutdown()
    broker.store.wait_for_dispatch(5)


def test_runtime_info_uses_rocketmqs_names_and_adds_the_checkpoint_and_watermarks(broker: RunningBroker,
                                                                                   admin: Admin) -> None:
    _fill(broker, {0: 3})
    info = admin.runtime_info()
    store = broker.store
    assert int(info["commitLogMaxOffset"]) == store.get_max_phy_offset() > 0
    assert int(info["commitLogMinOffset"]) == store.get_min_phy_offset() == 0
    assert int(info["dispatchBehindBytes"]) == 0
    assert 0 <= float(info["commitLogDiskRatio"]) <= 1
    assert int(info["earliestMessageTimeStamp"]) > 1_600_000_000_000
    assert int(info["msgPutTotalTodayNow"]) >= 3 and int(info["msgPutTotal"]) >= 3
    assert info["diskMaxUsedSpaceRatio"] == "75" and info["diskSpaceWarningLevelRatio"] == "90"
    assert info["diskSpaceCleanForciblyRatio"] == "85"
    assert info["storePathRootDir"] == store.config.store_path_root_dir
    for name in ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"):
        assert int(info[name]) >= 0
    assert len(info["putTps"].split(" ")) == 3  # 10 s, 60 s, 600 s, as RocketMQ writes it
    # by broker name or address, the same broker
    assert admin.runtime_info("broker-a")["storePathRootDir"] == admin.runtime_info(broker.broker_address)[
        "storePathRootDir"]


def test_topic_stats_are_rocketmqs_topic_stats_table(broker: RunningBroker, admin: Admin) -> None:
    _fill(broker, {0: 3, 2: 5})
    queues = admin.topic_stats("orders")
    assert [(q.queue_id, q.min_offset, q.max_offset, q.count) for q in queues] == [
        (0, 0, 3, 3), (1, 0, 0, 0), (2, 0, 5, 5), (3, 0, 0, 0)]
    assert all(q.broker_name == "broker-a" and q.topic == "orders" for q in queues)
    assert queues[0].last_update_timestamp == broker.store.get_message_store_timestamp("orders", 0, 2)
    assert queues[1].last_update_timestamp == 0
    # the wire body: fastjson's map keyed by MessageQueue objects, as a Java client decodes it
    r = broker.broker.process(RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "orders"}), None)
    assert r.body.startswith(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"orders"}:'
                             b'{"lastUpdateTimestamp":')
    doc = fastjson_loads(r.body)
    assert isinstance(next(iter(doc["offsetTable"])), ObjectKey) and doc["topicPutTps"] == 0.0
    with pytest.raises(MQBrokerError) as e:
        admin.topic_stats("nosuchtopic")
    assert e.value.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SYSTEM_ERROR)


def test_consume_stats_give_the_lag_per_queue(broker: RunningBroker, admin: Admin) -> None:
    _fill(broker, {0: 4, 1: 2})
    c = PullConsumer(broker.namesrv_address, "billing").start()
    try:
        c.commit_offset("orders", 0, 1)
        c.commit_offset("orders", 1, 2)
    finally:
        c.shutdown()
    stats = admin.consume_stats("billing")
    rows = [(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag) for q in stats.queues]
    assert rows == [("orders", 0, 4, 1, 3), ("orders", 1, 2, 2, 0), ("orders", 2, 0, 0, 0), ("orders", 3, 0, 0, 0)]
    assert stats.lag == 3
    assert stats.queues[0].last_timestamp == broker.store.get_message_store_timestamp("orders", 0, 0)
    assert stats.queues[2].last_timestamp == 0
    assert admin.consume_stats("billing", "orders").lag == 3
    assert admin.consume_stats("nobody").queues == []  # a group without offsets: no topics
    groups = admin.consumer_groups()
    assert groups["billing"] == ["orders"]


def test_the_history_samples_puts_and_group_lag(broker: RunningBroker, admin: Admin) -> None:
    assert admin.supports(broker.broker_address, "statsHistory")
    _fill(broker, {0: 5})
    c = PullConsumer(broker.namesrv_address, "billing").start()
    try:
        c.commit_offset("orders", 0, 2)
    finally:
        c.shutdown()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        h = admin.stats_history()
        last = h["samples"][-1]
        if last["groupLag"].get("billing") == 3 and last["msgPutTotal"] >= 5:
            break
        time.sleep(0.05)
    assert h["intervalMillis"] == 100 and h["brokerName"] == "broker-a"
    ts = [s["t"] for s in h["samples"]]
    assert ts == sorted(ts) and len(ts) >= 2
    assert last["commitLogMaxOffset"] == broker.store.get_max_phy_offset()
    assert last["dispatchBehindBytes"] == 0
    totals = [s["msgPutTotal"] for s in h["samples"]]
    assert totals == sorted(totals) and totals[0] < totals[-1]  # the first sample is from before the puts
    assert admin.stats_history(since_ms=ts[-1])["samples"] == []
    time.sleep(0.3)
    assert len(admin.stats_history()["samples"]) <= 50  # the ring buffer is bounded


def test_the_ring_buffer_keeps_the_newest_samples(broker: RunningBroker) -> None:
    svc = BrokerStatsService(broker.broker, interval_ms=60_000, capacity=3)
    for _ in range(5):
        svc.sample()
        time.sleep(0.002)
    h = svc.history()
    assert len(h) == 3 and h[0]["t"] <= h[-1]["t"]
    assert svc.put_tps(10) == 0.0
