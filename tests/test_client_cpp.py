"""The Apache RocketMQ C++ client (PyPI wheel `rocketmq==0.4.4`, ctypes) against our broker over loopback.

It sends SEND_MESSAGE (10) with named header fields, integer enums in heartbeats, UNIQ_KEY properties
and always-present ACL fields, and it decodes the pulled commitlog records in C++, so it covers what
ali-ons does not. The library starts threads, logs under `$HOME/logs/rocketmq-cpp` and can hang at
shutdown: it runs in a bounded subprocess (`tests/clients/cpp_roundtrip.py`) with HOME in a temp dir.
"""

from __future__ import annotations

import json
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

SCRIPT = Path(__file__).resolve().parent / "clients" / "cpp_roundtrip.py"
GEOMETRY = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[object]:
    running = serve_in_thread(tmp_path / "store", **GEOMETRY)
    try:
        yield running
    finally:
        running.close()


def _run(tmp_path: Path, mode: str, *args: str, name: str) -> ClientProcess:
    return ClientProcess([sys.executable, str(SCRIPT), mode, *args], env=client_env(tmp_path / "home"),
                         name=f"rocketmq-cpp {name}")


def test_cpp_client_loads() -> None:
    from rocketmq import ffi

    assert Path(ffi.dll._name).name == "librocketmq.so"


def test_cpp_producer_and_push_consumer_round_trip(broker, tmp_path: Path) -> None:
    topic, group = "CppOrders", "cpp-consumer"
    ns = broker.namesrv_address
    specs = [
        {"tags": "TagA", "keys": ["c-order-1", "c-cust-9"], "body": "hello from C++ 1",
         "properties": {"shop": "south"}},
        {"tags": "TagB", "keys": ["c-order-2"], "body": "hello from C++ 2"},
        {"tags": "TagC", "keys": ["c-order-3"], "body": "filtered out by the consumer"},
        {"tags": "TagA", "keys": ["c-order-big"], "body": "fedcba9876543210", "bodyRepeat": 200},
    ]
    consumer = _run(tmp_path, "consume", "--namesrv", ns, "--topic", topic, "--group", group,
                    "--sub", "TagA || TagB", "--expect", "5", "--timeout", "60", name="consumer")
    producer = None
    ours = None
    try:
        consumer.wait_event("ready", timeout=30)
        producer = _run(tmp_path, "produce", "--namesrv", ns, "--topic", topic, "--group", "cpp-producer",
                        "--spec", json.dumps(specs), name="producer")
        producer.finish(timeout=60)
        sent = producer.of("sent")
        assert not producer.of("error"), producer.describe()
        assert [s["status"] for s in sent] == ["OK"] * 4, producer.describe()

        broker.store.wait_for_dispatch()  # the index is built by the reput thread, after the send's answer
        for spec, s in zip(specs, sent, strict=True):
            for key in spec["keys"]:
                found = broker.store.query_message(topic, key).messages
                assert len(found) == 1, (key, found)
                stored = found[0]
                assert stored.properties.get("TAGS") == spec["tags"]
                assert keys_of(stored) == spec["keys"]
                assert stored.queue_offset == s["queueOffset"]
                # The C++ client's msgId is the UNIQ_KEY property it set (it starts with 0100007F... on IPv4).
                assert stored.properties.get("UNIQ_KEY") == s["msgId"]
                body = spec["body"] * spec.get("bodyRepeat", 1)
                assert stored.body == body.encode()
        assert broker.store.query_message(topic, sent[1]["msgId"]).messages[0].properties["TAGS"] == "TagB"
        assert broker.store.query_message(topic, "c-order-1").messages[0].properties["shop"] == "south"

        ours, r, put = send_ours_and_store(broker, topic)

        consumer.finish(timeout=70)

        # The C++ consumer committed its progress at shutdown (also past the TagC message it filtered out).
        assert_offsets_committed(broker, group, topic)
    finally:
        if ours is not None:
            ours.shutdown()
        for p in (producer, consumer):
            if p is not None:
                p.close()

    assert_received(consumer, topic, specs, sent,
                    ["c-order-1", "c-order-2", "c-order-big", "py-1", "store-1"], check_queue_id=False)
    by_key = {m["keys"][0]: m for m in consumer.of("received")}
    for spec, s in zip(specs, sent, strict=True):
        if spec["tags"] == "TagC":
            continue
        m = by_key[spec["keys"][0]]
        assert m["uniqKey"] == s["msgId"] and m["msgId"] == s["msgId"]  # its msgId is the UNIQ_KEY, as Java's
    py = by_key["py-1"]
    assert (py["tags"], py["keys"], py["body"]) == ("TagB", ["py-1", "py-2"], "from our producer")
    assert py["queueOffset"] == r.queue_offset and py["queueId"] == r.queue_id
    st = by_key["store-1"]
    assert (st["tags"], st["body"], st["queueId"]) == ("TagA", "put into the store", 1)
    assert st["commitLogOffset"] == put.append_result.wrote_offset
