"""The broker over real sockets, request by request, as RocketMQ clients speak to it (raw frames)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.common import codec
from rmq_eventstore.common.fastjson import fastjson_loads
from rmq_eventstore.remoting import FrameDecoder, RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


class Wire:
    """A raw remoting connection: frames in, frames out, nothing else."""

    def __init__(self, address: str, store: MessageStore | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.dec = FrameDecoder()
        self.inbox: list[RemotingCommand] = []
        self.requests: list[RemotingCommand] = []  # requests the broker sent us (NOTIFY_CONSUMER_IDS_CHANGED)
        self.store = store  # when set, sends wait until the message is dispatched (pullable)

    def send(self, cmd: RemotingCommand) -> RemotingCommand:
        self.sock.sendall(cmd.encode())
        return cmd

    def recv(self, timeout: float = 10.0) -> RemotingCommand:
        self.sock.settimeout(timeout)
        while not self.inbox:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the broker")
            self.inbox += self.dec.feed(data)
        return self.inbox.pop(0)

    def call(self, code: int, ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
        req = self.send(RemotingCommand.request(code, ext, body))
        resp = self.recv()
        while not resp.is_response:
            self.requests.append(resp)
            resp = self.recv()
        assert resp.opaque == req.opaque
        if self.store is not None and code in (10, 310, 320, 36):
            assert self.store.wait_for_dispatch(5)
        return resp

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", **SMALL)
    yield rb
    rb.close()


@pytest.fixture
def wire(broker: RunningBroker) -> Iterator[Wire]:
    w = Wire(broker.broker_address, broker.store)
    yield w
    w.close()


def send_v2(w: Wire, topic: str, body: bytes, queue_id: int = 0, props: str = "", **extra: object) -> RemotingCommand:
    ext = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0, "g": int(time.time() * 1000),
           "h": 0, "i": props, "j": 0, "k": False, **extra}
    return w.call(RequestCode.SEND_MESSAGE_V2, ext, body)


def pull_ext(topic: str, queue_id: int, offset: int, suspend_ms: int = 0, group: str = "cg", **extra: object) -> dict:
    return {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": 4 | (2 if suspend_ms else 0), "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
            "subscription": "*", "subVersion": 0, **extra}


def records(body: bytes) -> list:
    out, pos = [], 0
    while pos < len(body):
        m = codec.decode_message(body, pos)
        out.append(m)
        pos += m.store_size
    return out


# -- name server -------------------------------------------------------------------------------------
def test_route_for_topic_retry_topic_and_unknown(broker: RunningBroker, tmp_path: Path) -> None:
    ns = Wire(broker.namesrv_address)
    r = ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
    assert r.code == ResponseCode.SUCCESS
    route = json.loads(r.body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.broker_address}
    assert route["queueDatas"][0]["writeQueueNums"] == 4 and route["queueDatas"][0]["perm"] == 6
    r = ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%cg"})
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body)["queueDatas"][0]["writeQueueNums"] == 1
    for bad in ("../etc", "a/b", "", "x" * 200, "rmq_sys_foo"):
        assert ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": bad}).code == ResponseCode.TOPIC_NOT_EXIST
    assert ns.call(RequestCode.SEND_MESSAGE_V2, {}).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    ns.close()


def test_no_route_when_auto_create_is_off(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", auto_create_topic_enable=False, **SMALL) as rb:
        ns = Wire(rb.namesrv_address)
        assert ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code == ResponseCode.TOPIC_NOT_EXIST
        w = Wire(rb.broker_address, rb.store)
        r = send_v2(w, "orders", b"x")
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        r = w.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 0))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert w.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "orders", "readQueueNums": 2,
                                                           "writeQueueNums": 2, "perm": 6}).code == 0
        assert send_v2(w, "orders", b"x", queue_id=1).code == 0
        assert json.loads(ns.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).body)[
            "queueDatas"][0]["readQueueNums"] == 2
        assert "orders" in json.loads(ns.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)["topicList"]
        ns.close()
        w.close()


# -- send ---------------------------------------------------------------------------------------------
def test_send_v1_v2_and_batch(broker: RunningBroker, wire: Wire) -> None:
    r = send_v2(wire, "orders", b"one", props="TAGS\x01A\x02KEYS\x01k1\x02UNIQ_KEY\x01ABC\x02")
    assert r.code == 0 and r.ext_fields["queueId"] == "0" and r.ext_fields["queueOffset"] == "0"
    assert codec.decode_message_id(r.ext_fields["msgId"])[2] == 0
    # SEND_MESSAGE (10): the C++ client's long names, numbers mixed with strings, AccessKey etc.
    r = wire.call(RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": "orders", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": "0", "sysFlag": 0, "bornTimestamp": "1700000000000", "flag": 0,
        "properties": "WAIT\x01true\x02", "reconsumeTimes": 0, "unitMode": "false", "batch": False,
        "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x"}, b"two")
    assert r.code == 0 and r.ext_fields["queueOffset"] == "1"
    body = codec.encode_batch_body([(b"b%d" % i, 0, f"KEYS\x01bk{i}\x02UNIQ_KEY\x01U{i}\x02") for i in range(3)])
    r = wire.call(RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": "orders", "c": "TBW102", "d": 4, "e": 0, "f": 0,
                                                   "g": 0, "h": 0, "i": "", "j": 0, "k": False, "m": True}, body)
    assert r.code == 0 and r.ext_fields["queueOffset"] == "2" and len(r.ext_fields["msgId"].split(",")) == 3
    p = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 0))
    assert p.code == 0
    msgs = records(p.body)
    assert [m.body for m in msgs] == [b"one", b"two", b"b0", b"b1", b"b2"]
    assert msgs[0].tags == "A" and msgs[0].uniq_key == "ABC" and msgs[0].born_host.startswith("127.0.0.1:")
    assert msgs[1].uniq_key  # the broker gives a message without UNIQ_KEY one
    assert msgs[1].born_timestamp == 1700000000000
    assert all(m.magic_code == codec.MESSAGE_MAGIC_CODE and len(m.store_host_bytes) == 4 for m in msgs)  # V1, IPv4
    assert p.ext_fields["nextBeginOffset"] == "5" and p.ext_fields["maxOffset"] == "5"
    assert p.ext_fields["minOffset"] == "0" and p.ext_fields["suggestWhichBrokerId"] == "0"


def test_send_refusals(broker: RunningBroker, wire: Wire) -> None:
    root = broker.store.config.store_path_root_dir
    assert send_v2(wire, "../escape", b"x").code == ResponseCode.SYSTEM_ERROR
    assert send_v2(wire, "SCHEDULE_TOPIC_XXXX", b"x").code == ResponseCode.NO_PERMISSION
    assert send_v2(wire, "orders", b"x", queue_id=99).code == ResponseCode.SYSTEM_ERROR
    assert send_v2(wire, "orders", b"x" * (4 * 1024 * 1024 + 1)).code == ResponseCode.MESSAGE_ILLEGAL
    assert send_v2(wire, "orders", b"x", f=12).code == ResponseCode.MESSAGE_ILLEGAL  # ROLLBACK type: no send
    prepared = send_v2(wire, "orders", b"x", f=4)  # PREPARED: stored as a half message, not on the topic
    assert prepared.code == ResponseCode.SUCCESS
    broker.store.wait_for_dispatch()
    assert broker.store.get_max_offset_in_queue("orders", int(prepared.ext_fields["queueId"])) == 0
    assert broker.store.get_max_offset_in_queue("RMQ_SYS_TRANS_HALF_TOPIC", 0) == 1
    r = wire.call(RequestCode.SEND_MESSAGE_V2, {"a": "pg"}, b"x")
    assert r.code == ResponseCode.SYSTEM_ERROR and "<topic>" in r.remark
    bad_batch = wire.call(RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": "orders", "e": 0}, b"\x00\x00\x00\x05zz")
    assert bad_batch.code == ResponseCode.MESSAGE_ILLEGAL
    assert not os.path.exists(os.path.join(root, "escape"))
    assert not os.path.exists(os.path.join(root, "consumequeue", "..", "escape"))
    assert broker.store.get_max_offset_in_queue("orders", 0) == 0


def test_unknown_request_code(wire: Wire) -> None:
    r = wire.call(9999, {"x": 1})
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in r.remark


# -- pull and long polling --------------------------------------------------------------------------------
def test_held_pull_is_woken_by_a_send_on_the_same_connection(broker: RunningBroker, wire: Wire) -> None:
    assert send_v2(wire, "orders", b"first").code == 0
    t0 = time.monotonic()
    pull = wire.send(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 1, suspend_ms=10_000)))
    time.sleep(0.2)
    send = wire.send(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": "orders", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0, "i": "", "j": 0}, b"second"))
    first, second = wire.recv(), wire.recv()
    elapsed = time.monotonic() - t0
    # the send is answered although a pull ahead of it on this connection is held
    assert first.opaque == send.opaque and first.code == 0
    assert second.opaque == pull.opaque and second.code == 0
    assert [m.body for m in records(second.body)] == [b"second"]
    assert elapsed < 3.0  # woken by the dispatcher, not by the 10 s timeout


def test_held_pull_times_out_with_pull_not_found(wire: Wire) -> None:
    send_v2(wire, "orders", b"x")
    t0 = time.monotonic()
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 1, suspend_ms=400))
    elapsed = time.monotonic() - t0
    assert r.code == ResponseCode.PULL_NOT_FOUND and 0.35 <= elapsed < 5
    assert r.ext_fields["nextBeginOffset"] == "1"


def test_many_held_pulls_on_one_connection_do_not_block_each_other(broker: RunningBroker, wire: Wire) -> None:
    for q in range(4):
        send_v2(wire, "orders", b"seed", queue_id=q)
    pulls = [wire.send(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_ext("orders", q, 1, suspend_ms=10_000)))
             for q in range(4)]
    time.sleep(0.1)
    other = Wire(broker.broker_address, broker.store)
    for q in (2, 0):
        assert send_v2(other, "orders", b"q%d" % q, queue_id=q).code == 0
    got = {wire.recv().opaque: None for _ in range(2)}
    assert set(got) == {pulls[2].opaque, pulls[0].opaque}
    other.close()


def test_pull_statuses(wire: Wire) -> None:
    # a consumer may start before the first send creates the topic: nothing there yet
    assert wire.call(RequestCode.PULL_MESSAGE, pull_ext("nosuch", 0, 0)).code == ResponseCode.PULL_NOT_FOUND
    assert wire.call(RequestCode.PULL_MESSAGE, pull_ext("%DLQ%x", 0, 0)).code == ResponseCode.TOPIC_NOT_EXIST
    send_v2(wire, "orders", b"x")
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 50))
    assert r.code == ResponseCode.PULL_OFFSET_MOVED and r.ext_fields["nextBeginOffset"] == "1"
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 1, 0))
    assert r.code == ResponseCode.PULL_NOT_FOUND
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 9, 0))
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 0, expressionType="SQL92"))
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    # without the subscription flag the group must have registered one through a heartbeat
    r = wire.call(RequestCode.PULL_MESSAGE, {**pull_ext("orders", 0, 0), "sysFlag": 0})
    assert r.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


def test_pull_filters_by_tag(wire: Wire) -> None:
    for tag in ("A", "B", "A"):
        send_v2(wire, "orders", tag.encode(), props=f"TAGS\x01{tag}\x02")
    r = wire.call(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 0, subscription="B"))
    assert r.code == 0 and [m.body for m in records(r.body)] == [b"B"]


# -- offsets --------------------------------------------------------------------------------------------
def test_consumer_offsets_and_queue_offsets(broker: RunningBroker, wire: Wire) -> None:
    t_before = int(time.time() * 1000)
    for i in range(3):
        send_v2(wire, "orders", b"%d" % i)
    q = {"consumerGroup": "cg", "topic": "orders", "queueId": 0}
    r = wire.call(RequestCode.QUERY_CONSUMER_OFFSET, q)
    assert r.code == 0 and r.ext_fields["offset"] == "0"  # a new group on a queue that starts at 0
    assert wire.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 2}).code == 0
    assert wire.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "2"
    # commit through the pull's commitOffset flag
    wire.call(RequestCode.PULL_MESSAGE, {**pull_ext("orders", 0, 2), "sysFlag": 4 | 1, "commitOffset": 3})
    assert wire.call(RequestCode.QUERY_CONSUMER_OFFSET, q).ext_fields["offset"] == "3"
    assert wire.call(RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0}).ext_fields["offset"] == "3"
    assert wire.call(RequestCode.GET_MIN_OFFSET, {"topic": "orders", "queueId": 0}).ext_fields["offset"] == "0"
    r = wire.call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "orders", "queueId": 0, "timestamp": t_before})
    assert r.ext_fields["offset"] == "0"
    r = wire.call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "orders", "queueId": 0,
                                                           "timestamp": int(time.time() * 1000) + 60_000})
    assert r.ext_fields["offset"] == "3"
    ts = int(wire.call(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "orders", "queueId": 0}).ext_fields["timestamp"])
    assert t_before - 5 <= ts <= int(time.time() * 1000)
    broker.close()
    offsets = fastjson_loads(open(os.path.join(broker.store.config.config_path, "consumerOffset.json")).read())
    assert offsets["offsetTable"]["orders@cg"] == {0: 3}


# -- query ----------------------------------------------------------------------------------------------
def test_query_by_key_and_view_by_id(wire: Wire) -> None:
    send_v2(wire, "orders", b"a", props="KEYS\x01order-1 order-2\x02")
    r2 = send_v2(wire, "orders", b"b", props="KEYS\x01order-2\x02")
    deadline = time.monotonic() + 5
    while True:
        r = wire.call(RequestCode.QUERY_MESSAGE, {"topic": "orders", "key": "order-2", "maxNum": 32,
                                                  "beginTimestamp": 0, "endTimestamp": 2**62})
        if r.code == 0 and len(records(r.body)) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert sorted(m.body for m in records(r.body)) == [b"a", b"b"]
    r = wire.call(RequestCode.QUERY_MESSAGE, {"topic": "orders", "key": "nope", "maxNum": 32,
                                              "beginTimestamp": 0, "endTimestamp": 2**62})
    assert r.code == ResponseCode.QUERY_NOT_FOUND
    _, _, off = codec.decode_message_id(r2.ext_fields["msgId"])
    v = wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": off})
    assert v.code == 0 and records(v.body)[0].body == b"b"
    assert wire.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 10**12}).code == ResponseCode.SYSTEM_ERROR


# -- clients ---------------------------------------------------------------------------------------------
def heartbeat_body(client_id: str, group: str, ints: bool = False) -> bytes:
    cd = {"groupName": group, "consumeType": 1 if ints else "CONSUME_PASSIVELY",
          "messageModel": 1 if ints else "CLUSTERING", "consumeFromWhere": 0 if ints else "CONSUME_FROM_LAST_OFFSET",
          "subscriptionDataSet": [{"topic": "orders", "subString": "*", "classFilterMode": False, "tagsSet": [],
                                   "codeSet": [], "subVersion": 1}], "unitMode": False}
    return (json.dumps({"clientID": client_id, "consumerDataSet": [cd],
                        "producerDataSet": [{"groupName": "pg"}]}) + "\n").encode()


def test_heartbeat_consumer_list_notify_and_unregister(broker: RunningBroker, wire: Wire) -> None:
    assert wire.call(RequestCode.HEART_BEAT, body=heartbeat_body("c1", "cg")).code == 0
    assert json.loads(wire.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}).body) == {
        "consumerIdList": ["c1"]}
    other = Wire(broker.broker_address)
    # the C++ client: enums as integers, a trailing newline
    assert other.call(RequestCode.HEART_BEAT, body=heartbeat_body("c2", "cg", ints=True)).code == 0
    ids = json.loads(wire.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}).body)
    notify = wire.requests[-1]  # the first consumer is told to rebalance (once for itself, once for c2)
    assert len(wire.requests) == 2
    assert notify.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and notify.is_oneway
    assert notify.ext_fields["consumerGroup"] == "cg"
    ids = json.loads(wire.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}).body)
    assert sorted(ids["consumerIdList"]) == ["c1", "c2"]
    # the registered subscription serves a pull without the subscription flag
    send_v2(wire, "orders", b"x")
    assert wire.call(RequestCode.PULL_MESSAGE, {**pull_ext("orders", 0, 0), "sysFlag": 0}).code == 0
    assert wire.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "cg"}).code == 0
    other.close()  # closing the connection forgets c2
    deadline = time.monotonic() + 5
    while broker.broker.consumer_ids("cg") and time.monotonic() < deadline:
        time.sleep(0.02)
    r = wire.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    # the group and its retry topic were created from the heartbeat
    assert broker.store.subscription_group_manager.get("cg") is not None
    assert broker.store.topic_config_manager.get("%RETRY%cg") is not None
    r = wire.call(RequestCode.HEART_BEAT, body=b"{nope")
    assert r.code == ResponseCode.SYSTEM_ERROR
    flood = {"clientID": "c9", "consumerDataSet": [{"groupName": f"g{i}"} for i in range(300)]}
    r = wire.call(RequestCode.HEART_BEAT, body=json.dumps(flood).encode())
    assert r.code == ResponseCode.SYSTEM_ERROR and "more than 256 groups" in r.remark
    assert broker.store.subscription_group_manager.get("g1") is None


def test_create_topic_and_topic_config(wire: Wire) -> None:
    r = wire.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "payments", "readQueueNums": 8, "writeQueueNums": 8,
                                                        "perm": 6, "topicFilterType": "SINGLE_TAG"})
    assert r.code == 0
    r = wire.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "SCHEDULE_TOPIC_XXXX", "readQueueNums": 1,
                                                        "writeQueueNums": 1, "perm": 6})
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert wire.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "bad/name"}).code == ResponseCode.SYSTEM_ERROR
    cfg = fastjson_loads(wire.call(RequestCode.GET_ALL_TOPIC_CONFIG).body)
    assert cfg["topicConfigTable"]["payments"]["readQueueNums"] == 8
    wire.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "payments", "queueId": 3,
                                                   "commitOffset": 9})
    offsets = fastjson_loads(wire.call(RequestCode.GET_ALL_CONSUMER_OFFSET).body)
    assert offsets["offsetTable"]["payments@cg"] == {3: 9}
    assert "offsetTable" in fastjson_loads(wire.call(RequestCode.GET_ALL_DELAY_OFFSET).body)


# -- robustness ---------------------------------------------------------------------------------------------
def test_malformed_frame_closes_only_that_connection(broker: RunningBroker, wire: Wire, caplog) -> None:
    bad = Wire(broker.broker_address)
    bad.sock.sendall(b"\x00\x00\x00\x10\x00\x00\x00\x0c{not json!!}")
    with pytest.raises((ConnectionError, OSError)):
        bad.recv(timeout=5)
    bad.close()
    assert send_v2(wire, "orders", b"still fine").code == 0
    assert any("malformed frame" in r.getMessage() for r in caplog.records)


def test_concurrent_connections_and_sends(broker: RunningBroker) -> None:
    errors = []

    def worker(n: int) -> None:
        try:
            w = Wire(broker.broker_address)
            for i in range(50):
                assert send_v2(w, "orders", b"%d-%d" % (n, i), queue_id=n % 4).code == 0
            w.close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert broker.store.wait_for_dispatch(5)
    assert sum(broker.store.get_max_offset_in_queue("orders", q) for q in range(4)) == 400


def test_close_is_idempotent_and_releases_the_store(tmp_path: Path) -> None:
    rb = serve_in_thread(tmp_path / "s", **SMALL)
    addr = rb.broker_address
    rb.close()
    rb.close()
    with pytest.raises(OSError):
        Wire(addr)
    with serve_in_thread(tmp_path / "s", **SMALL) as again:  # the lock was released
        assert again.store.get_max_phy_offset() == 0


# -- embedded (no sockets) ----------------------------------------------------------------------------------
def test_broker_object_in_process(tmp_path: Path) -> None:
    from rmq_eventstore.broker import Broker
    from rmq_eventstore.store import Message

    with MessageStore.open(tmp_path / "s", **{k: v for k, v in SMALL.items()}) as store:
        b = Broker(store)
        b.start()
        try:
            code, _, ext = b.put_message(Message("orders", b"one", tags="A", queue_id=1))
            assert code == 0 and ext["queueOffset"] == 0
            store.wait_for_dispatch()
            r = b.pull_blocking("cg", "orders", 1, 0)
            assert r.code == 0 and records(r.body)[0].body == b"one"
            timer = threading.Timer(0.2, lambda: b.put_message(Message("orders", b"two", queue_id=1)))
            t0 = time.monotonic()
            timer.start()
            r = b.pull_blocking("cg", "orders", 1, 1, suspend_timeout_ms=10_000)
            timer.join()
            assert r.code == 0 and records(r.body)[0].body == b"two" and time.monotonic() - t0 < 5
            assert b.hold_service.held_count() == 0
            b.commit_offset("cg", "orders", 1, 2)
            assert b.query_offset("cg", "orders", 1) == 2
        finally:
            b.shutdown()


def test_idle_connections_are_closed_but_held_pulls_are_not(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", channel_max_idle_seconds=0.4, **SMALL) as rb:
        idle = Wire(rb.broker_address)
        holder = Wire(rb.broker_address, rb.store)
        send_v2(holder, "orders", b"x")
        pull = holder.send(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_ext("orders", 0, 1, suspend_ms=1500)))
        with pytest.raises((ConnectionError, OSError)):
            idle.recv(timeout=5)  # closed after ~0.4 s of silence
        r = holder.recv(timeout=5)
        assert r.opaque == pull.opaque and r.code == ResponseCode.PULL_NOT_FOUND  # the held pull was answered
        idle.close()
        holder.close()


def test_consumer_offsets_are_flushed_periodically(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", flush_consumer_offset_interval=300, **SMALL) as rb:
        w = Wire(rb.broker_address)
        w.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "orders", "queueId": 1,
                                                    "commitOffset": 42})
        path = os.path.join(rb.store.config.config_path, "consumerOffset.json")
        deadline = time.monotonic() + 5
        doc: dict = {}
        while time.monotonic() < deadline:  # written by the broker's scheduled task, the broker still running
            if os.path.exists(path):
                doc = fastjson_loads(open(path).read())
                if doc.get("offsetTable", {}).get("orders@cg") == {1: 42}:
                    break
            time.sleep(0.05)
        assert doc["offsetTable"]["orders@cg"] == {1: 42}
        assert not rb.closed
        w.close()
