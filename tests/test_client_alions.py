"""The real pure-JavaScript RocketMQ client `ali-ons` 3.12.0 (npm) against our broker over loopback.

ali-ons speaks the remoting protocol and decodes the stored commitlog records itself
(`lib/message/message_decoder.js`), so a round trip through it checks the broker (name server route,
SEND_MESSAGE_V2, heartbeat, rebalance, offsets, long-polling pull) and the record format we hand out.
The client runs in Node subprocesses (`tests/clients/js/alions_client.js`); `make test` installs it
with `npm ci` from the committed lock file.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from realclients import (
    ClientProcess,
    assert_offsets_committed,
    assert_received,
    client_env,
    keys_of,
    send_ours_and_store,
)

from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import Producer
from rmq_eventstore.store import Message

JS_DIR = Path(__file__).resolve().parent / "clients" / "js"
SCRIPT = JS_DIR / "alions_client.js"
GEOMETRY = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js >= 16) is not on PATH: it is needed to run the ali-ons client tests")
    if not (JS_DIR / "node_modules" / "ali-ons" / "package.json").is_file():
        pytest.fail(f"ali-ons is not installed in {JS_DIR}/node_modules: run `make test` (or "
                    f"`npm ci --prefix {JS_DIR}`) to install it from package-lock.json")
    return node


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[object]:
    running = serve_in_thread(tmp_path / "store", **GEOMETRY)
    try:
        yield running
    finally:
        running.close()


def _run(tmp_path: Path, mode: str, *args: str, name: str) -> ClientProcess:
    return ClientProcess([_node(), str(SCRIPT), mode, *args], cwd=JS_DIR,
                         env=client_env(tmp_path / "home"), name=f"ali-ons {name}")


def test_alions_producer_and_push_consumer_round_trip(broker, tmp_path: Path) -> None:
    topic, group = "AliOnsOrders", "alions-consumer"
    ns = broker.namesrv_address
    specs = [
        {"tags": "TagA", "keys": ["order-1", "cust-7"], "body": "hello from ali-ons 1",
         "properties": {"shop": "north"}},
        {"tags": "TagB", "keys": ["order-2"], "body": "hello from ali-ons 2"},
        {"tags": "TagC", "keys": ["order-3"], "body": "filtered out by the consumer"},
        # >= 4 KiB: ali-ons deflates the body and sets sysFlag bit 0; it must inflate it when consuming.
        {"tags": "TagA", "keys": ["order-big"], "body": "0123456789abcdef", "bodyRepeat": 1024},
    ]
    # The consumer is started first: it parks long-polling pulls, the sends must wake them up.
    consumer = _run(tmp_path, "consume", "--namesrv", ns, "--topic", topic, "--group", group,
                    "--sub", "TagA || TagB", "--expect", "5", "--timeout", "60000", name="consumer")
    producer = None
    ours = None
    try:
        producer = _run(tmp_path, "produce", "--namesrv", ns, "--topic", topic, "--group", "alions-producer",
                        "--spec", json.dumps(specs), name="producer")
        producer.finish(timeout=60)
        sent = producer.of("sent")
        assert not producer.of("error"), producer.describe()
        assert [s["sendStatus"] for s in sent] == ["SEND_OK"] * 4, producer.describe()
        assert [s["tags"] for s in sent] == ["TagA", "TagB", "TagC", "TagA"]
        assert len({s["msgId"] for s in sent}) == 4

        # ali-ons' messages are queryable by key in our store, with what ali-ons sent.
        broker.store.wait_for_dispatch()  # the index is built by the reput thread, after the send's answer
        for spec, s in zip(specs, sent, strict=True):
            for key in spec["keys"]:
                found = broker.store.query_message(topic, key).messages
                assert len(found) == 1, (key, found)
                stored = found[0]
                assert stored.properties.get("TAGS") == spec["tags"]
                assert keys_of(stored) == spec["keys"]
                assert stored.queue_id == s["queueId"] and stored.queue_offset == s["queueOffset"]
                if spec.get("bodyRepeat"):
                    assert stored.sys_flag & 1, "ali-ons compresses bodies >= 4 KiB (sysFlag bit 0)"
                else:
                    assert stored.body == spec["body"].encode()
        assert broker.store.query_message(topic, "shop").messages == []
        assert broker.store.query_message(topic, "order-1").messages[0].properties["shop"] == "north"

        # Messages produced by our client and by the store itself, consumed by ali-ons.
        ours, r, put = send_ours_and_store(broker, topic)

        consumer.finish(timeout=60)

        # ali-ons committed its progress (UPDATE_CONSUMER_OFFSET, also past the TagC message it filtered out).
        assert_offsets_committed(broker, group, topic)
    finally:
        if ours is not None:
            ours.shutdown()
        for p in (producer, consumer):
            if p is not None:
                p.close()

    assert_received(consumer, topic, specs, sent,
                    ["order-1", "order-2", "order-big", "py-1", "store-1"], check_queue_id=True)
    by_key = {m["keys"][0]: m for m in consumer.of("received")}
    for spec, s in zip(specs, sent, strict=True):
        if spec["tags"] == "TagC":
            continue
        m = by_key[spec["keys"][0]]
        # Its msgId is computed from the record's store host + commitlog offset: the broker's answer must match.
        assert m["msgId"] == s["msgId"]
        assert m["properties"].get("shop") == spec.get("properties", {}).get("shop")
    assert by_key["order-big"]["bodyLength"] == 16 * 1024 and by_key["order-big"]["sysFlag"] & 1
    py = by_key["py-1"]
    assert (py["tags"], py["keys"], py["body"]) == ("TagB", ["py-1", "py-2"], "from our producer")
    assert py["properties"]["origin"] == "python"
    assert py["msgId"] == r.offset_msg_id and py["queueOffset"] == r.queue_offset
    st = by_key["store-1"]
    assert (st["tags"], st["body"], st["queueId"]) == ("TagA", "put into the store", 1)
    assert st["msgId"] == put.append_result.msg_id
    # IPv4 V1 records (ali-ons can only decode those): the hosts it decoded are real loopback/IPv4 addresses.
    assert all(m["storeHost"].count(".") == 3 and not m["storeHost"].startswith("0.")
               for m in consumer.of("received"))


def test_cpp_producer_to_alions_consumer(broker, tmp_path: Path) -> None:
    """Two unrelated clients meet only in our store: what the C++ client sent (SEND_MESSAGE 10, UNIQ_KEY and
    WAIT properties) is decoded by ali-ons from the records we hand out."""
    topic, ns = "CrossClients", broker.namesrv_address
    specs = [{"tags": "Cross", "keys": ["x-1"], "body": "c++ to js 1"},
             {"tags": "Cross", "keys": ["x-2", "x-3"], "body": "c++ to js 2"}]
    cpp = ClientProcess([sys.executable, str(JS_DIR.parent / "cpp_roundtrip.py"), "produce", "--namesrv", ns,
                         "--topic", topic, "--group", "cross-producer", "--spec", json.dumps(specs)],
                        env=client_env(tmp_path / "home"), name="rocketmq-cpp producer")
    consumer = None
    try:
        cpp.finish(timeout=60)
        sent = cpp.of("sent")
        assert [s["status"] for s in sent] == ["OK", "OK"], cpp.describe()
        consumer = _run(tmp_path, "consume", "--namesrv", ns, "--topic", topic, "--group", "cross-consumer",
                        "--expect", "2", "--timeout", "60000", name="consumer")
        consumer.finish(timeout=60)
    finally:
        cpp.close()
        if consumer is not None:
            consumer.close()
    got = sorted(consumer.of("received"), key=lambda m: m["keys"][0])
    assert [(m["tags"], m["keys"], m["body"]) for m in got] == [
        ("Cross", s["keys"], s["body"]) for s in specs], consumer.describe()
    assert [m["uniqKey"] for m in got] == [s["msgId"] for s in sent]
    assert all(m["properties"].get("WAIT") == "true" for m in consumer.of("received"))


def test_alions_consume_failure_is_redelivered_through_the_retry_topic(tmp_path: Path) -> None:
    """ali-ons answers ACTION_RETRY: it sends the message back (CONSUMER_SEND_MSG_BACK), the broker delays it
    (delay level 3, here 1 s) into `%RETRY%<group>`, which ali-ons subscribes to by itself, and the same
    message comes back with reconsumeTimes 1 and its original topic, tags, keys and body."""
    topic, group = "AliOnsRetry", "alions-retry"
    with serve_in_thread(tmp_path / "store", message_delay_level=" ".join(["1s"] * 18), **GEOMETRY) as broker:
        ns = broker.namesrv_address
        with Producer(ns, "py-producer") as ours:
            for key in ("r-1", "r-retry", "r-2"):
                r = ours.send(Message(topic=topic, body=f"body of {key}".encode(), tags="Retry", keys=[key]))
                assert r.status == "SEND_OK", r
        consumer = _run(tmp_path, "consume", "--namesrv", ns, "--topic", topic, "--group", group,
                        "--expect", "4", "--retry-key", "r-retry", "--timeout", "60000", name="consumer")
        try:
            consumer.finish(timeout=70)
        finally:
            consumer.close()
        assert not consumer.of("error"), consumer.describe()
        assert len(consumer.of("retried")) == 1, consumer.describe()
        got = consumer.of("received")
        again = [m for m in got if m["keys"] == ["r-retry"]]
        assert [m["reconsumeTimes"] for m in again] == [0, 1], consumer.describe()
        assert all(m["topic"] == topic and m["tags"] == "Retry" and m["body"] == "body of r-retry" for m in again)
        assert sorted(m["keys"][0] for m in got) == ["r-1", "r-2", "r-retry", "r-retry"]
        broker.store.wait_for_dispatch()
        retry_topic = f"%RETRY%{group}"
        assert broker.store.get_max_offset_in_queue(retry_topic, 0) == 1


def test_alions_prepared_message_is_a_half_message_until_its_end(broker, tmp_path: Path) -> None:
    """ali-ons sets the PREPARED sysFlag for a message with TRAN_MSG=true but has no END_TRANSACTION: its
    send is stored as a half message, invisible on the topic, and an end settles it."""
    from rmq_eventstore.common import codec
    from rmq_eventstore.common.topic import RMQ_SYS_TRANS_HALF_TOPIC
    from rmq_eventstore.remoting import RemotingCommand, RequestCode

    topic = "AliOnsTx"
    specs = [{"tags": "T", "keys": ["tx-1"], "body": "prepared by ali-ons",
              "properties": {"TRAN_MSG": "true", "PGROUP": "alions-tx"}}]
    producer = _run(tmp_path, "produce", "--namesrv", broker.namesrv_address, "--topic", topic, "--group",
                    "alions-tx", "--spec", json.dumps(specs), name="tx producer")
    producer.finish(timeout=60)
    assert [s["sendStatus"] for s in producer.of("sent")] == ["SEND_OK"], producer.describe()
    store = broker.store
    store.wait_for_dispatch()
    assert store.query_message(topic, "tx-1").messages == []
    assert all(store.get_max_offset_in_queue(topic, q) == 0 for q in range(8))
    (half,) = store.query_message(RMQ_SYS_TRANS_HALF_TOPIC, "tx-1").messages
    assert half.properties["REAL_TOPIC"] == topic and codec.transaction_value(half.sys_flag) == 0
    end = RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": "alions-tx", "tranStateTableOffset": half.queue_offset,
        "commitLogOffset": half.commit_log_offset, "commitOrRollback": codec.TRANSACTION_COMMIT_TYPE,
        "fromTransactionCheck": False})
    assert broker.broker.process(end, None).code == 0
    store.wait_for_dispatch()
    (committed,) = store.query_message(topic, "tx-1").messages
    assert committed.body == b"prepared by ali-ons" and committed.tags == "T"
