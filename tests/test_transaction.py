"""Transactional (half) messages over a real broker on loopback: commit, rollback, check-back (also answered by
another process of the producer group when the sender is gone), discard after the maximum of checks, ends that
repeat or cross, and half messages invisible to every read path until committed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokertools import pull_all, wait_until

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.broker.transaction import CHECK_GROUP, COMMIT, ROLLBACK
from rmq_eventstore.client import (
    Admin,
    Message,
    MessageExt,
    MQBrokerError,
    Producer,
    TransactionProducer,
    TransactionState,
)
from rmq_eventstore.common import codec
from rmq_eventstore.common.fastjson import fastjson_loads
from rmq_eventstore.common.properties import set_property
from rmq_eventstore.common.topic import RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.spark.source import RocketMQReader

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
FAST_CHECK = {"transaction_timeout": 300, "transaction_check_interval": 100}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL, **FAST_CHECK) as rb:
        yield rb


def visible(rb: RunningBroker, topic: str, group: str = "reader") -> list[MessageExt]:
    """Every message a consumer can pull from `topic`, once the dispatcher caught up."""
    rb.store.wait_for_dispatch()
    return pull_all(rb.namesrv_address, topic, group)


def test_commit_makes_the_message_visible_once_and_rollback_never(broker: RunningBroker) -> None:
    seen: list[str] = []

    def never_checked(msg: MessageExt) -> TransactionState:
        seen.append(msg.uniq_key or "")
        return TransactionState.UNKNOWN

    with TransactionProducer(broker.namesrv_address, "orders-app", never_checked) as p:
        r1 = p.send_in_transaction(Message("orders", b"placed", keys=["o-1"]), lambda m: TransactionState.COMMIT)
        r2 = p.send_in_transaction(Message("orders", b"cancelled", keys=["o-2"]),
                                   lambda m: TransactionState.ROLLBACK)
    assert r1.status == "SEND_OK" and r1.local_transaction_state is TransactionState.COMMIT
    assert r2.local_transaction_state is TransactionState.ROLLBACK
    assert wait_until(lambda: [m.body for m in visible(broker, "orders")] == [b"placed"])
    committed = visible(broker, "orders")[0]
    assert committed.uniq_key == r1.transaction_id
    assert codec.transaction_value(committed.sys_flag) == codec.TRANSACTION_COMMIT_TYPE
    assert committed.properties["TRAN_PREPARED_QUEUE_OFFSET"] == str(r1.queue_offset)
    assert "REAL_TOPIC" not in committed.properties
    # the rolled-back message is found nowhere on its topic, by key or by id
    admin = Admin(broker.namesrv_address)
    assert [m.body for m in admin.query_message("orders", "o-1")] == [b"placed"]
    assert admin.query_message("orders", "o-2") == []
    assert admin.query_message("orders", r2.transaction_id) == []
    time.sleep(0.6)  # longer than transaction_timeout: ended transactions are never checked
    assert seen == []


def test_a_commit_record_is_the_half_with_its_end_properties_and_a_fresh_crc_trailer(broker: RunningBroker) -> None:
    """The committed record's properties are the half message's with REAL_TOPIC, REAL_QID and
    TRANSACTION_CHECK_TIMES cut, TRAN_PREPARED_QUEUE_OFFSET set, the half's `__CRC32#` trailer dropped and a
    new one, right for the new record, at the end (RocketMQ's encoder with enabledAppendPropCRC)."""
    with TransactionProducer(broker.namesrv_address, "crc-app", lambda m: TransactionState.UNKNOWN) as p:
        r = p.send_in_transaction(Message("crc-orders", b"placed", keys=["c-1"], tags="T"),
                                  lambda m: TransactionState.COMMIT)
    assert wait_until(lambda: len(visible(broker, "crc-orders")) == 1)
    _, _, half_offset = codec.decode_message_id(r.offset_msg_id)
    half = broker.store.look_message_by_offset(half_offset)
    assert half is not None and codec.PROPERTY_CRC32 in half.properties_string
    expected = half.properties_string
    for name in ("REAL_TOPIC", "REAL_QID", "TRANSACTION_CHECK_TIMES"):
        expected = codec.delete_property(expected, name)
    expected = set_property(expected, "TRAN_PREPARED_QUEUE_OFFSET", str(half.queue_offset))
    expected = codec.delete_property(expected, codec.PROPERTY_CRC32)
    expected += "" if expected.endswith("\x02") else "\x02"
    committed = visible(broker, "crc-orders")[0]
    assert committed.properties_string[:len(expected)] == expected
    trailer = committed.properties_string[len(expected):]
    assert trailer.startswith(codec.PROPERTY_CRC32 + "\x01") and len(trailer) == codec.CRC32_RESERVED_LEN
    raw = bytes(broker.store.commit_log.read_record(committed.commit_log_offset))
    fresh = bytearray(raw)
    codec.fill_crc_trailer(fresh)
    assert bytes(fresh) == raw  # the trailer holds the CRC of this record's bytes


def test_the_broker_says_how_it_ended_transactions_in_one_request(broker: RunningBroker) -> None:
    """QUERY_TRANSACTION_ENDS (`Admin.transaction_ends`): COMMIT and ROLLBACK for ends this broker made, nothing
    for an open transaction or an id it never saw; a bad body or too many ids is an error, not a guess."""
    gate = threading.Event()
    open_ids: list[str] = []

    def hold(msg: Message) -> TransactionState:
        open_ids.append(msg.uniq_key)
        gate.wait(10)
        return TransactionState.ROLLBACK

    with TransactionProducer(broker.namesrv_address, "ends-app", lambda m: TransactionState.UNKNOWN) as p:
        c = p.send_in_transaction(Message("ends", b"c"), lambda m: TransactionState.COMMIT)
        r = p.send_in_transaction(Message("ends", b"r"), lambda m: TransactionState.ROLLBACK)
        held = Message("ends", b"o")
        held.uniq_key = p._ids.create()  # the transaction id, known before the send
        t = threading.Thread(target=p.send_in_transaction, args=(held, hold))
        t.start()
        assert wait_until(lambda: bool(open_ids))
        admin = Admin(broker.namesrv_address)
        ids = [c.transaction_id, r.transaction_id, open_ids[0], "never-seen"]
        assert wait_until(lambda: admin.transaction_ends("ends", ids) == {c.transaction_id: "COMMIT",
                                                                       r.transaction_id: "ROLLBACK"})
        gate.set()
        t.join(10)
        assert wait_until(lambda: admin.transaction_ends("ends", ids)[open_ids[0]] == "ROLLBACK")
        assert admin.transaction_ends("ends", []) == {}
        addr = admin._base.broker_for("ends")
        for body, remark in ((b"[1]", "needs a body"), (b'{"ids": [1]}', "needs a body"),
                             (json.dumps({"ids": ["x"] * 10_001}).encode(), "at most 10000")):
            resp = admin._base.remoting.invoke(addr, RemotingCommand.request(
                RequestCode.QUERY_TRANSACTION_ENDS, {"topic": "ends"}, body=body), 5)
            assert resp.code == ResponseCode.SYSTEM_ERROR and remark in (resp.remark or "")


def test_half_message_is_invisible_until_the_end(broker: RunningBroker) -> None:
    gate = threading.Event()
    results = []

    def execute(msg: Message) -> TransactionState:
        # inside the local transaction: the half message is stored, yet nothing of it shows on the topic
        half_store = broker.store
        half_store.wait_for_dispatch()
        results.append((visible(broker, "payments"),
                        Admin(broker.namesrv_address).query_message("payments", "p-1"),
                        half_store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)))
        gate.wait(5)
        return TransactionState.COMMIT

    with TransactionProducer(broker.namesrv_address, "pay-app", lambda m: TransactionState.UNKNOWN) as p:
        t = threading.Thread(target=p.send_in_transaction, args=(Message("payments", b"paid", keys="p-1"), execute))
        t.start()
        assert wait_until(lambda: bool(results))
        pulled, queried, halves = results[0]
        assert pulled == [] and queried == [] and halves == 1
        gate.set()
        t.join(10)
    assert wait_until(lambda: [m.body for m in visible(broker, "payments")] == [b"paid"])


def spark_rows(root: Path, topic: str, use_cq: bool) -> list[tuple[str, bytes]]:
    """(topic, body) of every row Spark's reader gives for a topic filter, with or without consume queues."""
    reader = RocketMQReader(str(root), {"topic": topic, "useConsumeQueue": str(use_cq).lower()})
    rows = []
    for part in reader.partitions():
        for batch in reader.read(part):
            d = batch.to_pydict()
            rows += list(zip(d["topic"], d["body"], strict=True))
    return rows


def test_spark_topic_filter_never_reads_a_half_message(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with serve_in_thread(root, **SMALL, transaction_timeout=60_000) as rb, \
            TransactionProducer(rb.namesrv_address, "pay-app", lambda m: TransactionState.UNKNOWN) as p:
        p.send_in_transaction(Message("payments", b"open"), lambda m: TransactionState.UNKNOWN)
        p.send_in_transaction(Message("payments", b"rolled back"), lambda m: TransactionState.ROLLBACK)
        p.send_in_transaction(Message("payments", b"paid"), lambda m: TransactionState.COMMIT)
        # END_TRANSACTION is one-way: wait for the commit record before reading the files
        assert wait_until(lambda: sum(rb.store.get_max_offset_in_queue("payments", q) for q in range(16)) >= 1)
        rb.store.wait_for_dispatch()
        assert rb.store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0) == 3
        for use_cq in (True, False):
            assert spark_rows(root, "payments", use_cq) == [("payments", b"paid")]
            halves = spark_rows(root, RMQ_SYS_TRANS_HALF_TOPIC, use_cq)
            assert sorted(body for _, body in halves) == [b"open", b"paid", b"rolled back"]


def test_unknown_is_settled_by_the_check_back(broker: RunningBroker) -> None:
    decisions = {"o-3": TransactionState.COMMIT, "o-4": TransactionState.ROLLBACK}
    asked: list[str] = []

    def checker(msg: MessageExt) -> TransactionState:
        asked.append(msg.keys or "")
        return decisions[msg.keys or ""]

    with TransactionProducer(broker.namesrv_address, "orders-app", checker) as p:
        p.send_in_transaction(Message("orders", b"three", keys="o-3"), lambda m: TransactionState.UNKNOWN)

        def boom(m: Message) -> TransactionState:
            raise RuntimeError("database down")

        r = p.send_in_transaction(Message("orders", b"four", keys="o-4"), boom)
        assert r.local_transaction_state is TransactionState.UNKNOWN
        assert wait_until(lambda: sorted(set(asked)) == ["o-3", "o-4"])
        assert wait_until(lambda: [m.body for m in visible(broker, "orders")] == [b"three"])
    assert broker.store.consumer_offset_manager.query_offset(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0) > 0


CHECKER_PROCESS = textwrap.dedent("""
    import sys, time
    from rmq_eventstore.client import TransactionProducer, TransactionState
    answers = []
    def checker(msg):
        answers.append(msg.keys)
        print("checked", msg.keys, flush=True)
        return TransactionState.COMMIT
    with TransactionProducer(sys.argv[1], "orders-app", checker) as p:
        p._base.route("orders")  # announce the group to the broker (heartbeat)
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
""")


def test_another_process_of_the_group_answers_when_the_sender_died(broker: RunningBroker, tmp_path: Path) -> None:
    sender = TransactionProducer(broker.namesrv_address, "orders-app", lambda m: TransactionState.UNKNOWN).start()
    blocked = threading.Event()

    def crash_before_commit(msg: Message) -> TransactionState:
        blocked.set()
        raise SystemExit  # stands for the web process dying inside its local transaction

    with pytest.raises(SystemExit):
        sender.send_in_transaction(Message("orders", b"orphan", keys="o-9"), crash_before_commit)
    sender._base.remoting.close()  # the connection goes away with the process
    sender.shutdown()
    script = tmp_path / "checker.py"
    script.write_text(CHECKER_PROCESS)
    other = subprocess.Popen([sys.executable, str(script), broker.namesrv_address], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout is not None
        assert other.stdout.readline().strip() == "ready"
        assert other.stdout.readline().strip() == "checked o-9"
        assert wait_until(lambda: [m.body for m in visible(broker, "orders")] == [b"orphan"])
    finally:
        other.wait(30)


def test_past_the_maximum_of_checks_the_half_message_is_discarded(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "store", **SMALL, **FAST_CHECK, transaction_check_max=2) as rb:
        asked: list[str] = []

        def undecided(msg: MessageExt) -> TransactionState:
            asked.append(msg.properties.get("TRANSACTION_CHECK_TIMES", "0"))
            return TransactionState.UNKNOWN

        with TransactionProducer(rb.namesrv_address, "orders-app", undecided) as p:
            r = p.send_in_transaction(Message("orders", b"limbo", keys="o-5"), lambda m: TransactionState.UNKNOWN)
            assert wait_until(lambda: rb.store.get_max_offset_in_queue(RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, 0) == 1)
            assert sorted(set(asked)) == ["1", "2"]
            # a late commit for a discarded transaction changes nothing
            p._end(r.broker_address, r.offset_msg_id, r.queue_offset, r.transaction_id, TransactionState.COMMIT,
                   False)
            time.sleep(0.3)
        assert visible(rb, "orders") == []


def end_request(group: str, half_offset: int, queue_offset: int, kind: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": queue_offset, "commitLogOffset": half_offset,
        "commitOrRollback": kind, "fromTransactionCheck": False})


def test_ends_are_idempotent_per_transaction(broker: RunningBroker) -> None:
    b = broker.broker
    with TransactionProducer(broker.namesrv_address, "orders-app", lambda m: TransactionState.UNKNOWN) as p:
        r = p.send_in_transaction(Message("orders", b"once", keys="o-6"), lambda m: TransactionState.UNKNOWN)
    _, _, half_offset = codec.decode_message_id(r.offset_msg_id)
    commit = end_request("orders-app", half_offset, r.queue_offset, codec.TRANSACTION_COMMIT_TYPE)
    rollback = end_request("orders-app", half_offset, r.queue_offset, codec.TRANSACTION_ROLLBACK_TYPE)
    assert b.process(commit, None).code == ResponseCode.SUCCESS
    assert b.process(commit, None).code == ResponseCode.SUCCESS  # repeated
    assert b.process(rollback, None).code == ResponseCode.SUCCESS  # crossing: the commit stands
    # a check-back copy of the same transaction, ended again, changes nothing either
    half = broker.store.look_message_by_offset(half_offset)
    copy = b.transaction_service.put_back(half)
    assert copy is not None and copy.uniq_key == half.uniq_key
    again = end_request("orders-app", copy.commit_log_offset, copy.queue_offset, codec.TRANSACTION_COMMIT_TYPE)
    assert b.process(again, None).code == ResponseCode.SUCCESS
    assert [m.body for m in visible(broker, "orders")] == [b"once"]
    assert b.transaction_service.outcome(half) == COMMIT


def test_ends_are_checked_against_the_half_message(broker: RunningBroker) -> None:
    b = broker.broker
    with TransactionProducer(broker.namesrv_address, "orders-app", lambda m: TransactionState.UNKNOWN) as p:
        r = p.send_in_transaction(Message("orders", b"x"), lambda m: TransactionState.UNKNOWN)
        plain = Producer(broker.namesrv_address, "plain").start()
        s = plain.send(Message("orders", b"plain"))
        plain.shutdown()
    _, _, half_offset = codec.decode_message_id(r.offset_msg_id)
    wrong_group = b.process(end_request("intruder", half_offset, r.queue_offset, 8), None)
    assert wrong_group.code == ResponseCode.SYSTEM_ERROR and "producer group" in (wrong_group.remark or "")
    wrong_queue_offset = b.process(end_request("orders-app", half_offset, r.queue_offset + 7, 8), None)
    assert wrong_queue_offset.code == ResponseCode.SYSTEM_ERROR
    _, _, plain_offset = codec.decode_message_id(s.offset_msg_id)
    not_half = b.process(end_request("orders-app", plain_offset, 0, 8), None)
    assert not_half.code == ResponseCode.SYSTEM_ERROR and "prepared transaction" in (not_half.remark or "")
    bad_kind = b.process(end_request("orders-app", half_offset, r.queue_offset, 5), None)
    assert bad_kind.code == ResponseCode.SYSTEM_ERROR
    assert [m.body for m in visible(broker, "orders")] == [b"plain"]
    assert b.process(end_request("orders-app", half_offset, r.queue_offset, 12), None).code == ResponseCode.SUCCESS
    assert b.transaction_service.outcome(broker.store.look_message_by_offset(half_offset)) == ROLLBACK


def test_transactional_batches_and_rejected_transactions_are_refused(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "store", **SMALL, reject_transaction_message=True) as rb:
        with TransactionProducer(rb.namesrv_address, "g", lambda m: TransactionState.UNKNOWN) as p:
            with pytest.raises(MQBrokerError) as e:
                p.send_in_transaction(Message("orders", b"x"), lambda m: TransactionState.COMMIT)
            assert e.value.code == ResponseCode.NO_PERMISSION
    with serve_in_thread(tmp_path / "store2", **SMALL) as rb:
        code, remark, _ = rb.broker.send_messages(
            [Message("orders", b"a", properties_string="TRAN_MSG\x01true\x02"),
             Message("orders", b"b", properties_string="TRAN_MSG\x01true\x02")], batch=True)
        assert code == ResponseCode.MESSAGE_ILLEGAL and "batch" in (remark or "")


def test_state_survives_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with serve_in_thread(root, **SMALL, transaction_timeout=60_000) as rb, \
            TransactionProducer(rb.namesrv_address, "orders-app", lambda m: TransactionState.UNKNOWN) as p:
        r = p.send_in_transaction(Message("orders", b"before"), lambda m: TransactionState.COMMIT)
        assert wait_until(lambda: len(visible(rb, "orders")) == 1)
    with serve_in_thread(root, **SMALL, **FAST_CHECK) as rb:
        # a fresh broker knows the transaction ended (from the store, not from memory): no second commit
        b = rb.broker
        _, _, half_offset = codec.decode_message_id(r.offset_msg_id)
        assert b.process(end_request("orders-app", half_offset, r.queue_offset, 8), None).code == 0
        assert b.transaction_check_service.check_once() == 0
        assert [m.body for m in visible(rb, "orders")] == [b"before"]
        b.offset_manager.persist()  # the check group's offset is kept where RocketMQ keeps it
        table = fastjson_loads((root / "config" / "consumerOffset.json").read_text())["offsetTable"]
        assert table[f"{RMQ_SYS_TRANS_HALF_TOPIC}@{CHECK_GROUP}"] == {0: 1}
