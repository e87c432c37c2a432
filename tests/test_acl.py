"""RocketMQ ACL 1.0 on a real broker over loopback: signatures (ours and ali-ons'), every served request code
refused unsigned or wrongly signed, permissions per topic and group, admin-only requests, white-listed
addresses, tampering, reload of the file, and nothing written for a refused request."""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.broker.acl import AclConfigError, AclError, PlainAccessValidator, RemoteAddressStrategy
from rmq_eventstore.client import Admin, Message, MQBrokerError, PopConsumer, Producer, PullConsumer
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.remoting.acl import (
    SessionCredentials,
    calculate_signature,
    combine_request_content,
    sign_request,
)

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
ACL = textwrap.dedent("""
    globalWhiteRemoteAddresses: ["10.10.103.*"]
    accounts:
      - accessKey: writer
        secretKey: writer-secret
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms: [orders=PUB|SUB, audit=PUB, secrets=DENY]
        groupPerms: [banned=DENY]
      - accessKey: reader
        secretKey: reader-secret
        defaultTopicPerm: SUB
        defaultGroupPerm: SUB
      - accessKey: boss
        secretKey: boss-secret-key
        admin: true
""")
WRITER = {"access_key": "writer", "secret_key": "writer-secret"}
READER = {"access_key": "reader", "secret_key": "reader-secret"}
BOSS = {"access_key": "boss", "secret_key": "boss-secret-key"}


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    f = tmp_path / "plain_acl.yml"
    f.write_text(ACL)
    return f


@pytest.fixture
def broker(tmp_path: Path, acl_file: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL, acl_enable=True, acl_file=str(acl_file)) as rb:
        yield rb


def test_the_signature_is_rocketmqs() -> None:
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "orders", "a": "pg", "e": 3, "k": False},
                                  b"body")
    sign_request(cmd, SessionCredentials("ak", "secret"))
    # sorted by name: AccessKey, a, b, e, k -> values concatenated, then the body (AclUtils.combineRequestContent)
    assert combine_request_content(cmd.ext_fields, cmd.body) == b"akpgorders3falsebody"
    assert cmd.ext_fields["Signature"] == calculate_signature(b"akpgorders3falsebody", "secret")
    assert calculate_signature(b"abc", "key") == "T9CyFSdu8S8rPkyOysKBFJi2Vvw="  # openssl dgst -sha1 -hmac key
    assert "secret" not in repr(SessionCredentials("ak", "secret"))


@pytest.mark.parametrize(("pattern", "yes", "no"), [
    ("*", ["1.2.3.4:5"], []),
    ("192.168.0.*", ["192.168.0.7:1"], ["192.168.1.7:1"]),
    ("192.168.1.{1,2}", ["192.168.1.2:1"], ["192.168.1.3:1"]),
    ("192.168.1.1,2", ["192.168.1.1:9"], ["192.168.1.12:9"]),
    ("10.0.0.1-5", ["10.0.0.5:1"], ["10.0.0.6:1"]),
    ("10.1.0.0/16", ["10.1.200.3:4"], ["10.2.0.1:4"]),
    ("127.0.0.1", ["127.0.0.1:80"], ["127.0.0.2:80"]),
])
def test_white_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    s = RemoteAddressStrategy(pattern)
    assert all(s.matches(a) for a in yes) and not any(s.matches(a) for a in no)


def signed(code: int, ext: dict, creds: dict | None, body: bytes = b"") -> RemotingCommand:
    cmd = RemotingCommand.request(code, ext, body)
    if creds:
        sign_request(cmd, SessionCredentials(creds["access_key"], creds["secret_key"]))
    return cmd


class Conn:
    remote_address = "127.0.0.1:40000"

    def send_oneway(self, cmd: RemotingCommand) -> None:
        pass


def heartbeat_body(group: str, topic: str) -> bytes:
    return json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": group, "consumeType": 0, "messageModel": 1,
         "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}]}).encode()


def requests(topic: str = "orders", group: str = "cg") -> dict[str, tuple[int, dict, bytes]]:
    """One request of every code the broker serves (besides the name server's)."""
    return {
        "send": (RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0,
                                               "g": 0, "h": 0, "i": "", "j": 0, "k": False}, b"x"),
        "send v1": (RequestCode.SEND_MESSAGE, {"producerGroup": "pg", "topic": topic, "queueId": 0}, b"x"),
        "send batch": (RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0,
                                                        "f": 0, "g": 0, "h": 0, "i": "", "j": 0, "k": False,
                                                        "m": True}, b"\x00\x00\x00\x05zz"),
        "pull": (RequestCode.PULL_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0,
                                            "maxMsgNums": 1, "sysFlag": 2, "commitOffset": 0,
                                            "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}, b""),
        "pop": (RequestCode.POP_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": -1, "maxMsgNums": 1,
                                          "invisibleTime": 1000, "pollTime": 0}, b""),
        "ack": (RequestCode.ACK_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": 0,
                                          "extraInfo": "0 1 1000 0 0 broker-a 0 0", "offset": 0}, b""),
        "batch ack": (RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps({"acks": [
            {"c": group, "t": topic, "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 1000, "b": [0]}]}).encode()),
        "change invisible time": (RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {
            "consumerGroup": group, "topic": topic, "queueId": 0, "extraInfo": "0 1 1000 0 0 broker-a 0 0",
            "offset": 0, "invisibleTime": 1000}, b""),
        "query offset": (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": 0},
                         b""),
        "update offset": (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": 0,
                                                               "commitOffset": 0}, b""),
        "query message": (RequestCode.QUERY_MESSAGE, {"topic": topic, "key": "k", "maxNum": 1,
                                                      "beginTimestamp": 0, "endTimestamp": 1}, b""),
        "heartbeat": (RequestCode.HEART_BEAT, {}, heartbeat_body(group, topic)),
        "unregister": (RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": group}, b""),
        "consumer list": (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}, b""),
        "send back": (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": group, "offset": 0, "delayLevel": 0}, b""),
        "max offset": (RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}, b""),
        "min offset": (RequestCode.GET_MIN_OFFSET, {"topic": topic, "queueId": 0}, b""),
        "earliest": (RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": topic, "queueId": 0}, b""),
        "by time": (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": topic, "queueId": 0, "timestamp": 0}, b""),
        "view": (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 0}, b""),
        "end transaction": (RequestCode.END_TRANSACTION, {"topic": topic, "producerGroup": "pg",
                                                          "commitLogOffset": 0, "commitOrRollback": 0}, b""),
        "extensions": (RequestCode.GET_BROKER_EXTENSIONS, {}, b""),
        "query stream": (RequestCode.QUERY_STREAM, {"topic": topic, "stream": "s-1"}, b""),
        "transaction ends": (RequestCode.QUERY_TRANSACTION_ENDS, {"topic": topic}, b'{"ids": ["t-1"]}'),
        "create topic": (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "newtopic", "readQueueNums": 1,
                                                               "writeQueueNums": 1, "perm": 6}, b""),
        "all topics": (RequestCode.GET_ALL_TOPIC_CONFIG, {}, b""),
        "all offsets": (RequestCode.GET_ALL_CONSUMER_OFFSET, {}, b""),
        "all delay offsets": (RequestCode.GET_ALL_DELAY_OFFSET, {}, b""),
        "create group": (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                         json.dumps({"groupName": "g2"}).encode()),
        "all groups": (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}, b""),
        "runtime info": (RequestCode.GET_BROKER_RUNTIME_INFO, {}, b""),
        "topic stats": (RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, b""),
        "consume stats": (RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic}, b""),
        "stats history": (RequestCode.GET_BROKER_STATS_HISTORY, {}, b""),
        "delete topic": (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "doomed"}, b""),
    }


def test_every_request_code_is_refused_unsigned_or_wrongly_signed(broker: RunningBroker) -> None:
    b = broker.broker
    served = set(b._processors)
    reqs = requests()
    assert {code for code, _, _ in reqs.values()} == served  # the matrix covers every code the broker serves
    time.sleep(0.2)  # the broker's services have written what they write at start
    before = broker.store.get_max_phy_offset()
    for name, (code, ext, body) in reqs.items():
        for creds in (None, {"access_key": "writer", "secret_key": "wrong-secret"},
                      {"access_key": "nobody", "secret_key": "whatever"}):
            r = b.process(signed(code, ext, creds, body), Conn())
            assert r.code == ResponseCode.NO_PERMISSION, (name, creds and creds["access_key"], r.remark)
            assert "secret" not in (r.remark or "").replace("Check signature", "")
    assert broker.store.get_max_phy_offset() == before  # nothing written for a refused request


MATRIX = {  # request kind -> (writer, reader, boss): True = allowed
    "send": (True, False, True),
    "send v1": (True, False, True),
    "send batch": (True, False, True),
    "pull": (True, True, True),
    "pop": (True, True, True),
    "ack": (True, True, True),
    "batch ack": (True, True, True),
    "change invisible time": (True, True, True),
    "query offset": (True, True, True),
    "update offset": (True, True, True),
    "query message": (True, True, True),
    "query stream": (True, True, True),
    "transaction ends": (True, True, True),
    "heartbeat": (True, True, True),
    "unregister": (True, True, True),
    "consumer list": (True, True, True),
    "send back": (True, True, True),
    "max offset": (True, True, True),
    "min offset": (True, True, True),
    "earliest": (True, True, True),
    "by time": (True, True, True),
    "view": (True, True, True),
    "end transaction": (True, False, True),
    "extensions": (True, True, True),
    "create topic": (False, False, True),
    "all topics": (False, False, True),
    "all offsets": (False, False, True),
    "all delay offsets": (False, False, True),
    "create group": (False, False, True),
    "all groups": (False, False, True),
    "runtime info": (False, False, True),
    "topic stats": (True, True, True),
    "consume stats": (True, True, True),
    "stats history": (False, False, True),
    "delete topic": (False, False, True),
}


def test_the_permission_matrix(broker: RunningBroker) -> None:
    b = broker.broker
    rows = []
    for name, (code, ext, body) in requests().items():
        outcome = []
        for creds in (WRITER, READER, BOSS):
            r = b.process(signed(code, ext, creds, body), Conn())
            outcome.append(r.code != ResponseCode.NO_PERMISSION)
        rows.append((name, *outcome))
        assert tuple(outcome) == MATRIX[name], (name, outcome)
    # topic and group permissions of one account
    for topic, group, allowed in (("audit", "cg", False), ("secrets", "cg", False), ("orders", "banned", False),
                                  ("other", "cg", False), ("orders", "cg", True)):
        code, ext, body = requests(topic, group)["pull"]
        r = b.process(signed(code, ext, WRITER, body), Conn())
        assert (r.code != ResponseCode.NO_PERMISSION) is allowed, (topic, group, r.remark)
    code, ext, body = requests("audit")["send"]
    assert b.process(signed(code, ext, WRITER, body), Conn()).code == ResponseCode.SUCCESS  # PUB only: send ok
    code, ext, body = requests("%RETRY%banned")["send"]
    r = b.process(signed(code, ext, WRITER, body), Conn())
    assert r.code == ResponseCode.NO_PERMISSION and "group banned" in (r.remark or "")
    # statistics follow the topic and group permissions
    for kind, topic, group, allowed in (("topic stats", "secrets", "cg", False), ("topic stats", "orders", "cg", True),
                                        ("consume stats", "orders", "banned", False),
                                        ("consume stats", "secrets", "cg", False)):
        code, ext, body = requests(topic, group)[kind]
        r = b.process(signed(code, ext, WRITER, body), Conn())
        assert (r.code != ResponseCode.NO_PERMISSION) is allowed, (kind, topic, group, r.remark)
    code, ext, body = requests()["consume stats"]
    ext = {"consumerGroup": "cg", "topicList": "orders;secrets"}
    assert b.process(signed(code, ext, WRITER, body), Conn()).code == ResponseCode.NO_PERMISSION


def test_white_listed_addresses_need_no_signature(broker: RunningBroker) -> None:
    class Office(Conn):
        remote_address = "10.10.103.9:5555"

    code, ext, body = requests()["create topic"]
    assert broker.broker.process(signed(code, ext, None, body), Office()).code == ResponseCode.SUCCESS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["b", "e", "i", "AccessKey", "extra"]), value=st.text(min_size=1, max_size=8),
       body=st.binary(max_size=16), signature=st.text(max_size=30))
def test_tampered_requests_are_refused(broker: RunningBroker, field: str, value: str, body: bytes,
                                       signature: str) -> None:
    code, ext, _ = requests()["send"]
    good = signed(code, ext, WRITER, b"x")
    tampered = RemotingCommand(good.code, dict(good.ext_fields), good.body, good.opaque, good.flag)
    if tampered.ext_fields.get(field) != value:
        tampered.ext_fields[field] = value
        assert broker.broker.process(tampered, Conn()).code == ResponseCode.NO_PERMISSION
    if body != b"x":
        other_body = RemotingCommand(good.code, dict(good.ext_fields), body, good.opaque, good.flag)
        assert broker.broker.process(other_body, Conn()).code == ResponseCode.NO_PERMISSION
    if signature != good.ext_fields["Signature"]:
        forged = RemotingCommand(good.code, {**good.ext_fields, "Signature": signature}, good.body, good.opaque,
                                 good.flag)
        assert broker.broker.process(forged, Conn()).code == ResponseCode.NO_PERMISSION


def test_our_clients_sign_when_given_credentials(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    with Producer(ns, "pg", **WRITER) as p:
        assert p.send(Message("orders", b"signed")).status == "SEND_OK"
    with Producer(ns, "pg") as p, pytest.raises(MQBrokerError) as e:
        p.send(Message("orders", b"unsigned"))
    assert e.value.code == ResponseCode.NO_PERMISSION
    with Producer(ns, "pg", **READER) as p, pytest.raises(MQBrokerError) as e:
        p.send(Message("orders", b"reader may not"))
    assert "needs PUB" in str(e.value)
    with PullConsumer(ns, "cg", **READER) as c:
        assert any(c.pull("orders", q, 0, suspend_timeout_ms=0).messages for q in range(4))
    assert Admin(ns, **BOSS).query_message("orders", "nothing") == []


def test_a_signed_long_poll_is_checked_once_and_held_on_the_loop(broker: RunningBroker) -> None:
    """Under ACL a POP is checked (and looked at) on a worker thread; one that must wait is then held on the event
    loop like any other (`BrokerServer._pop_hold`), woken by the arrival; an unsigned one is refused at once."""
    ns = broker.namesrv_address
    with Producer(ns, "pg", **WRITER) as p:
        p.send(Message("orders", b"first"))
    with PopConsumer(ns, "cg", **READER) as c:
        got = c.pop("orders", invisible_time=30_000, poll_time=2000)
        assert [m.body for m in got] == [b"first"]
        c.ack(got[0])
        later: list = []
        t = threading.Thread(target=lambda: later.extend(c.pop("orders", invisible_time=30_000, poll_time=8000)))
        t.start()
        deadline = time.monotonic() + 5
        while broker.server.pop_held < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert broker.server.pop_held == 1
        sent = time.monotonic()
        with Producer(ns, "pg", **WRITER) as p:
            p.send(Message("orders", b"second"))
        t.join(10)
        assert [m.body for m in later] == [b"second"] and time.monotonic() - sent < 1.5
        c.ack(later[0])
    with PopConsumer(ns, "cg") as c, pytest.raises(MQBrokerError) as e:
        c.pop("orders", invisible_time=30_000, poll_time=8000)
    assert e.value.code == ResponseCode.NO_PERMISSION
    assert broker.server.pop_held == 0


def test_ali_ons_signs_with_its_access_key(broker: RunningBroker, tmp_path: Path) -> None:
    from test_client_alions import _run

    specs = [{"tags": "A", "keys": ["acl-1"], "body": "signed by ali-ons"}]
    ok = _run(tmp_path, "produce", "--namesrv", broker.namesrv_address, "--topic", "orders", "--group", "pg",
              "--spec", json.dumps(specs), "--access-key", "writer", "--secret-key", "writer-secret", name="signed")
    ok.finish(timeout=60)
    assert [s["sendStatus"] for s in ok.of("sent")] == ["SEND_OK"], ok.describe()
    broker.store.wait_for_dispatch()
    assert [m.body for m in broker.store.query_message("orders", "acl-1").messages] == [b"signed by ali-ons"]
    bad = _run(tmp_path, "produce", "--namesrv", broker.namesrv_address, "--topic", "orders", "--group", "pg",
               "--spec", json.dumps(specs), "--access-key", "writer", "--secret-key", "not-the-secret",
               "--timeout", "15000", name="badly signed")
    with pytest.raises(AssertionError):
        bad.finish(timeout=60)
    assert not bad.of("sent")


def test_the_file_is_read_again_when_it_changes(tmp_path: Path, acl_file: Path, caplog) -> None:
    v = PlainAccessValidator(acl_file, reload_interval=0.0)
    code, ext, body = requests()["create topic"]
    with pytest.raises(AclError, match="Need admin permission"):
        v.validate(signed(code, ext, WRITER, body), "127.0.0.1:1")
    time.sleep(0.01)
    acl_file.write_text(ACL.replace("admin: false", "admin: true"))
    v.validate(signed(code, ext, WRITER, body), "127.0.0.1:1")  # now an admin
    time.sleep(0.01)
    acl_file.write_text("accounts: [this is: not valid")  # a broken file keeps the rules in force
    v.validate(signed(code, ext, WRITER, body), "127.0.0.1:1")
    assert "cannot be used, keeping the previous rules" in caplog.text
    assert "writer-secret" not in caplog.text


@pytest.mark.parametrize(("text", "message"), [
    ("accounts: [{accessKey: a}]", "needs accessKey and secretKey"),
    ("accounts: [{accessKey: a, secretKey: short}]", "at least 6 characters"),
    ("accounts: [{accessKey: a, secretKey: longenough, defaultTopicPerm: ALL}]", "is not one of DENY"),
    ("accounts: [{accessKey: a, secretKey: longenough, topicPerms: [orders]}]", "name=PERM"),
])
def test_bad_acl_files_are_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "plain_acl.yml"
    f.write_text(text)
    with pytest.raises(AclConfigError, match=message):
        PlainAccessValidator(f)


def test_serve_warns_when_listening_beyond_loopback_without_acl(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "rmq_eventstore", "serve", "--store", str(tmp_path / "s"),
                             "--host", "0.0.0.0", "--namesrv-port", "0", "--broker-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "serving" in proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "WITHOUT access control" in err
    shutil.rmtree(tmp_path / "s", ignore_errors=True)
