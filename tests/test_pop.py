"""POP / ACK / CHANGE_INVISIBLE_TIME over a real broker on loopback: popped messages are hidden, acks settle,
unacked messages come back after their invisible time through the pop retry topic (and to the DLQ past the
group's maximum), long polling wakes on arrival, concurrent consumers in other processes never hold the same
message, and a SIGKILL of the broker loses no unacked message and brings back no acked one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client import Admin, Message, PopConsumer, Producer
from rmq_eventstore.common.pop import AckMsg, ExtraInfo, PopCheckPoint, pop_retry_topic
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
POP_CRASH_ROUNDS = int(os.environ.get("POP_CRASH_ROUNDS", "3"))


@given(st.integers(0, 2**40), st.integers(0, 2**41), st.integers(1, 2**31 - 1), st.integers(0, 7), st.booleans(),
       st.text(alphabet="abcdefghij-_0123456789", min_size=1, max_size=12), st.integers(0, 1023),
       st.integers(0, 2**40))
def test_receipt_handles_round_trip(so: int, pt: int, it: int, rq: int, retry: bool, bn: str, q: int,
                                    off: int) -> None:
    e = ExtraInfo(so, pt, it, rq, retry, bn, q, off)
    assert ExtraInfo.split(e.build()) == e
    assert e.build().split(" ")[4] == ("1" if retry else "0")


def test_batch_ack_bit_sets() -> None:
    from rmq_eventstore.common.pop import BatchAck, bitset_indexes

    assert bitset_indexes([3, 0, 3]) == [0, 3]
    assert bitset_indexes("CQE=") == [0, 3, 8]  # Java's BitSet{0, 3, 8}.toByteArray() = [0x09, 0x01], base64
    a = BatchAck("g", "t", True, 5, 1, 2, 100, 30000, [0, 2])
    assert BatchAck.from_dict(a.to_dict()) == a and a.to_dict()["r"] == "1"


def test_checkpoint_and_ack_json_use_rocketmqs_keys() -> None:
    ck = PopCheckPoint(10, 1700000000000, 30000, 3, 2, "orders", "g", "broker-a", [0, 1, 5])
    d = json.loads(ck.to_json())
    assert set(d) == {"so", "pt", "it", "bm", "n", "q", "t", "c", "ro", "d", "bn", "rp"}
    assert PopCheckPoint.from_json(ck.to_json()) == ck and ck.offsets() == [10, 11, 15]
    ack = AckMsg(11, 10, "g", "orders", 2, 1700000000000, "broker-a")
    assert set(json.loads(ack.to_json())) == {"ao", "so", "c", "t", "q", "pt", "bn"}
    assert AckMsg.from_json(ack.to_json()) == ack
    with pytest.raises(ValueError):
        ExtraInfo.split("1 2 3")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        yield rb


def send(ns: str, topic: str, n: int, tags: str | None = None) -> None:
    with Producer(ns, "pop-producer") as p:
        for i in range(n):
            p.send(Message(topic, f"m{i}".encode(), tags=tags, keys=f"m{i}"))


def test_pop_hides_ack_settles_and_the_rest_comes_back_through_the_retry_topic(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "tasks", 6)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        got = c.pop("tasks", max_nums=32, invisible_time=800)
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(6)]
        assert all("POP_CK" in m.properties for m in got)
        assert c.pop("tasks", invisible_time=800) == []  # invisible to the group meanwhile
        for m in got[:4]:
            c.ack(m)
        time.sleep(1.2)
        back: list = []
        deadline = time.monotonic() + 10
        while len(back) < 2 and time.monotonic() < deadline:
            back += c.pop("tasks", invisible_time=5000, poll_time=500)
        assert sorted(m.body for m in back) == sorted(m.body for m in got[4:])
        assert all(m.reconsume_times == 1 and m.topic == "tasks" for m in back)
        c.ack_batch(back)
        time.sleep(0.3)
        assert c.pop("tasks", invisible_time=1000) == []
    assert broker.store.get_max_offset_in_queue(pop_retry_topic("workers", "tasks"), 0) == 2


def test_change_invisible_time(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "tasks", 2)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        a, b = sorted(c.pop("tasks", invisible_time=60_000), key=lambda m: m.body)
        c.change_invisible_time(a, 0)  # give it back now
        c.change_invisible_time(b, 60_000)  # keep b longer
        deadline = time.monotonic() + 10
        again: list = []
        while not again and time.monotonic() < deadline:
            again = c.pop("tasks", invisible_time=60_000, poll_time=300)
        assert [m.body for m in again] == [b"m0"]
        c.ack(b)  # the new receipt handle acks it


def test_past_the_maximum_a_message_goes_to_the_dlq(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    Admin(ns)._base.invoke(broker.broker_address, RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
        json.dumps({"groupName": "fragile", "retryMaxTimes": 1}).encode()))
    send(ns, "tasks", 1)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "fragile") as c:
        assert len(c.pop("tasks", invisible_time=300)) == 1
        deadline = time.monotonic() + 10
        retried: list = []
        while not retried and time.monotonic() < deadline:
            retried = c.pop("tasks", invisible_time=300, poll_time=300)
        assert retried and retried[0].reconsume_times == 1
        time.sleep(1.0)
    assert broker.store.get_max_offset_in_queue("%DLQ%fragile", 0) == 1


def test_long_polling_wakes_on_arrival(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "tasks", 1)
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "workers") as c:
        c.ack(c.pop("tasks", invisible_time=1000)[0])
        threading.Timer(0.3, lambda: send(ns, "tasks", 1)).start()
        t0 = time.monotonic()
        got = c.pop("tasks", invisible_time=1000, poll_time=10_000)
        assert len(got) == 1 and time.monotonic() - t0 < 5
        assert c.pop("tasks", invisible_time=1000, poll_time=200) == []


def test_a_message_dispatched_between_a_pops_look_and_its_wait_is_popped_at_once(broker: RunningBroker) -> None:
    """A pop that found nothing counts itself as waiting only after its look; a record dispatched in between
    wakes nobody (the arrival listener calls no one while no pop waits). The pop must notice it and look
    again at once, not wait out its 0.5 s re-look: here the record is put and dispatched right after the
    first look (in the pop's own thread, so the timing is exact)."""
    ns = broker.namesrv_address
    send(ns, "tasks", 1)
    broker.store.wait_for_dispatch()
    service = broker.broker.pop_service
    with PopConsumer(ns, "workers") as c:
        c.ack(c.pop("tasks", invisible_time=1000)[0])
        real = service._pop_once
        looks = []

        def look_then_arrive(*a: object) -> object:
            result = real(*a)
            looks.append(time.monotonic())
            if len(looks) == 1:
                assert result.count == 0
                assert broker.broker.put_message(Message("tasks", b"late", keys="late"))[0] == ResponseCode.SUCCESS
                assert broker.store.wait_for_dispatch()
            return result

        service._pop_once = look_then_arrive  # type: ignore[method-assign]
        try:
            got = service.pop("workers", "tasks", -1, 1, 1000, poll_time_ms=5000)
        finally:
            service._pop_once = real  # type: ignore[method-assign]
        assert got.count == 1
        assert looks[1] - looks[0] < 0.25  # looked again at once (the wait would have been 0.5 s)


def test_tag_expressions(broker: RunningBroker) -> None:
    ns = broker.namesrv_address
    send(ns, "tagged", 3, tags="A")
    send(ns, "tagged", 3, tags="B")
    broker.store.wait_for_dispatch()
    with PopConsumer(ns, "only-a") as c:
        got = []
        for _ in range(5):
            got += c.pop("tagged", tags="A || C", invisible_time=10_000)
        assert len(got) == 3 and {m.tags for m in got} == {"A"}


# -- RocketMQ's own POP tests (broker/src/test/java/org/apache/rocketmq/broker/processor), where they apply ------
# Covered above: PopMessageProcessorTest.testProcessRequest_Found, AckMessageProcessorTest.testProcessRequest_Success
# and ChangeInvisibleTimeProcessorTest.testProcessRequest_Success (pop, ack and change with real receipt handles).
# Not mirrored: testProcessRequest_whenTimerWheelIsFalse (our revive service does not ride on the timer wheel,
# DESIGN.md), testGetInitOffset_* (a new group starts at the queue's first message whatever its initMode),
# testProcessRequest_WrongRequestCode (the processor is only routed its own codes), ExtraInfoUtilTest.
# testOrderCountInfo (orderly POP is not built). The checkpoint buffer (PopBufferMergeServiceTest's subject)
# is tested in tests/test_pop_buffer.py.
def _raw(broker: RunningBroker, code: int, header: dict, body: bytes = b"") -> RemotingCommand:
    """A request answered as it is (no error raised for a failure code)."""
    with Admin(broker.namesrv_address) as admin:
        return admin._base.remoting.invoke(broker.broker_address, RemotingCommand.request(code, header, body), 5)


def test_ack_and_change_invisible_time_check_topic_queue_and_offset(broker: RunningBroker) -> None:
    """AckMessageProcessorTest.testSingleAck_TopicCheck / testSingleAck_QueueCheck / testSingleAck_OffsetCheck
    and ChangeInvisibleTimeProcessorTest.testProcessRequest_NoMessage: a topic that does not exist is
    TOPIC_NOT_EXIST, a queue id outside the read queues MESSAGE_ILLEGAL, an offset outside the queue NO_MESSAGE
    (an ack may name the queue's end offset, a change of invisible time may not)."""
    send(broker.namesrv_address, "tasks", 2)
    broker.store.wait_for_dispatch()
    handle = ExtraInfo(0, int(time.time() * 1000) - 1000, 30_000, 0, False, "broker-a", 0, 0).build()
    for code in (RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        def ask(topic: str = "tasks", queue_id: int = 0, offset: int = 0, code: int = code) -> RemotingCommand:
            return _raw(broker, code, {"consumerGroup": "workers", "topic": topic, "queueId": queue_id,
                                       "offset": offset, "extraInfo": handle, "invisibleTime": 30_000})
        r = ask(topic="wrongTopic")
        assert (r.code, "not exist, apply first" in r.remark) == (ResponseCode.TOPIC_NOT_EXIST, True)
        for qid in (-1, 17):
            r = ask(queue_id=qid)
            assert (r.code, f"queueId[{qid}] is illegal" in r.remark) == (ResponseCode.MESSAGE_ILLEGAL, True)
        queue = next(q for q in range(8) if broker.store.get_max_offset_in_queue("tasks", q) > 0)
        top = broker.store.get_max_offset_in_queue("tasks", queue)
        for offset in (-1, top + 1) + ((top,) if code == RequestCode.CHANGE_MESSAGE_INVISIBLETIME else ()):
            r = ask(queue_id=queue, offset=offset)
            assert (r.code, "offset is illegal" in r.remark) == (ResponseCode.NO_MESSAGE, True), (code, offset)
        assert ask(queue_id=queue, offset=top - 1).code == ResponseCode.SUCCESS


def test_batch_ack_without_acks_is_no_message(broker: RunningBroker) -> None:
    """AckMessageProcessorTest.testBatchAck_NoMessage: no body, no `acks`, or an empty list: NO_MESSAGE."""
    for body in (b"", b"{}", b'{"acks":[]}'):
        assert _raw(broker, RequestCode.BATCH_ACK_MESSAGE, {}, body).code == ResponseCode.NO_MESSAGE, body


def _batch_body(*acks: dict) -> bytes:
    return json.dumps({"acks": list(acks)}).encode()


def test_batch_ack_over_the_wire_settles_the_good_entries_beside_bad_ones(broker: RunningBroker) -> None:
    """BATCH_ACK_MESSAGE as upstream's batch path (`AckMessageProcessor.appendAck` with a BatchAck): an entry
    for a queue that does not exist, and offsets outside the queue, are skipped without failing the request,
    and the good entries beside them are settled; a retried message is acked by an entry naming its retry topic
    (our client) or the popped topic with `r` = "1" (upstream's clients, `ExtraInfoUtil.getRealTopic`); a body
    that is not BatchAcks is ILLEGAL_OPERATION."""
    from rmq_eventstore.common.pop import BatchAck

    ns = broker.namesrv_address
    with Producer(ns, "pop-producer") as p:
        for i in range(4):
            p.send(Message("tasks", f"m{i}".encode()), queue_id=0)
    broker.store.wait_for_dispatch()

    def entry(m, **change) -> dict:  # noqa: ANN001
        e = ExtraInfo.split(m.properties["POP_CK"])
        topic = pop_retry_topic("workers", "tasks") if e.retry else "tasks"
        d = BatchAck("workers", topic, e.retry, e.ck_queue_offset, e.queue_id, e.revive_qid, e.pop_time,
                     e.invisible_time, [e.queue_offset - e.ck_queue_offset]).to_dict()
        d.update(change)
        return d

    with PopConsumer(ns, "workers") as c:
        got = sorted(c.pop("tasks", max_nums=32, invisible_time=800), key=lambda m: m.body)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
        both = entry(got[0])
        both["b"] = [0, 1, 500]  # m0 and m1 of this pop, and an offset past the queue's end
        r = _raw(broker, RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body(
            entry(got[2], t="noSuchTopic"),  # no such queue: skipped
            both,
            entry(got[3], q=5),  # a queue of the topic with nothing in it: skipped
        ))
        assert r.code == ResponseCode.SUCCESS, r.remark
        bad = _raw(broker, RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body({"c": "workers", "t": "tasks"}))
        assert bad.code == ResponseCode.ILLEGAL_OPERATION and "bad BATCH_ACK_MESSAGE body" in bad.remark
        time.sleep(1.2)
        back: list = []
        deadline = time.monotonic() + 10
        while len(back) < 2 and time.monotonic() < deadline:
            back += c.pop("tasks", invisible_time=800, poll_time=500)
        assert sorted(m.body for m in back) == [b"m2", b"m3"]  # m0 and m1 were settled
        assert all(ExtraInfo.split(m.properties["POP_CK"]).retry for m in back)
        back.sort(key=lambda m: m.body)
        ours, upstream = entry(back[0]), entry(back[1], t="tasks")  # upstream: the popped topic, r = "1"
        assert _raw(broker, RequestCode.BATCH_ACK_MESSAGE, {}, _batch_body(ours, upstream)).code == ResponseCode.SUCCESS
        time.sleep(1.5)
        assert c.pop("tasks", invisible_time=800, poll_time=300) == []


def test_pop_of_a_topic_that_does_not_exist_or_has_nothing(broker: RunningBroker) -> None:
    """PopMessageProcessorTest.testProcessRequest_TopicNotExist and testProcessRequest_NoMsgInQueue: an unknown
    topic is TOPIC_NOT_EXIST; an empty queue gives nothing, at once without a poll time and after it with one
    (RocketMQ holds the request until its poll time ends or a message arrives)."""
    header = {"consumerGroup": "workers", "topic": "nowhere", "queueId": -1, "maxMsgNums": 30,
              "invisibleTime": 10_000, "pollTime": 0, "bornTime": 0, "initMode": 1}
    r = _raw(broker, RequestCode.POP_MESSAGE, header)
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "topic[nowhere] not exist" in r.remark
    send(broker.namesrv_address, "quiet", 1)
    broker.store.wait_for_dispatch()
    with PopConsumer(broker.namesrv_address, "workers") as c:
        c.ack(c.pop("quiet", invisible_time=10_000)[0])
        assert c.pop("quiet", invisible_time=10_000) == []
        t0 = time.monotonic()
        assert c.pop("quiet", invisible_time=10_000, poll_time=400) == []
        assert time.monotonic() - t0 >= 0.35


def test_a_message_whose_put_back_fails_comes_back_later(broker: RunningBroker,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """PopReviveServiceTest.testReviveMsgFromCk_messageFound_writeRetryFailed_rewriteCK: when the put of an
    unacked message to the retry topic fails, its checkpoint is kept and the message is put back by a later
    round, not dropped."""
    from rmq_eventstore.store import PutMessageResult, PutMessageStatus

    ns = broker.namesrv_address
    send(ns, "tasks", 1)
    broker.store.wait_for_dispatch()
    real = broker.store.put_message
    failed: list[str] = []

    def flaky(msg):  # type: ignore[no-untyped-def]
        if msg.topic == pop_retry_topic("workers", "tasks") and len(failed) < 2:
            failed.append(msg.topic)
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, "injected")
        return real(msg)

    monkeypatch.setattr(broker.store, "put_message", flaky)
    with PopConsumer(ns, "workers") as c:
        assert [m.body for m in c.pop("tasks", invisible_time=300)] == [b"m0"]
        back: list = []
        deadline = time.monotonic() + 15
        while not back and time.monotonic() < deadline:
            back = c.pop("tasks", invisible_time=60_000, poll_time=500)
        assert len(failed) == 2 and [(m.body, m.reconsume_times) for m in back] == [(b"m0", 1)]
        c.ack(back[0])


POPPER = textwrap.dedent("""
    import sys, time
    from rmq_eventstore.client import PopConsumer
    ns, seconds = sys.argv[1], float(sys.argv[2])
    with PopConsumer(ns, "crowd") as c:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in c.pop("crowd", max_nums=8, invisible_time=60_000, poll_time=200):
                print(m.body.decode(), flush=True)
                c.ack(m)
""")


def test_concurrent_consumers_in_other_processes_never_hold_the_same_message(broker: RunningBroker,
                                                                             tmp_path: Path) -> None:
    ns = broker.namesrv_address
    script = tmp_path / "popper.py"
    script.write_text(POPPER)
    procs = [subprocess.Popen([sys.executable, str(script), ns, "8"], stdout=subprocess.PIPE, text=True)
             for _ in range(16)]
    send(ns, "crowd", 1500)
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    counts = Counter(b for out in outs for b in out)
    assert len(counts) == 1500 and max(counts.values()) == 1, counts.most_common(3)
    assert sum(1 for out in outs if out) > 1  # the work was shared


def test_a_broker_kill_loses_no_unacked_message_and_brings_back_no_acked_one(tmp_path: Path) -> None:
    from tests.test_transaction_crash import Broker

    rng = random.Random(int(os.environ.get("POP_CRASH_SEED", str(random.randrange(1 << 30)))))
    broker = Broker(tmp_path)
    broker.start()
    total = 600
    send(broker.namesrv, "jobs", total)
    acked: set[str] = set()
    seen: Counter = Counter()
    try:
        for _ in range(POP_CRASH_ROUNDS):
            deadline = time.monotonic() + rng.uniform(0.3, 1.0)
            with PopConsumer(broker.namesrv, "jobs-workers") as c:
                while time.monotonic() < deadline:
                    try:
                        for m in c.pop("jobs", max_nums=16, invisible_time=1500):
                            seen[m.keys] += 1
                            if rng.random() < 0.7:  # the rest is left unacked: it must come back
                                c.ack(m)
                                acked.add(m.keys)
                    except Exception:
                        break
            assert broker.proc is not None
            broker.proc.send_signal(signal.SIGKILL)
            broker.proc.wait(30)
            broker.start()
        # drain: everything not acked must come back; acked ones may not
        after: Counter = Counter()
        with PopConsumer(broker.namesrv, "jobs-workers") as c:
            deadline = time.monotonic() + 40
            while len(acked) + len(set(after) - acked) < total and time.monotonic() < deadline:
                for m in c.pop("jobs", max_nums=32, invisible_time=60_000, poll_time=300):
                    after[m.keys] += 1
                    c.ack(m)
        missing = {f"m{i}" for i in range(total)} - acked - set(after)
        assert not missing, f"unacked messages lost: {sorted(missing)[:10]}"
        print(f"{POP_CRASH_ROUNDS} kills: {len(acked)} acked before, {len(after)} delivered after, "
              f"{len(set(after) & acked)} acked ones delivered again")
    finally:
        broker.stop()
