"""The POP / ACK fast paths against what the general code makes, over a real store and broker in this process:
the same wire bytes (the client's POP and BATCH_ACK requests, the broker's POP response, whose body is each
popped record as stored), the same buffer journal lines and acked bits when consecutive offsets come as a
range, pops with gaps (tag-filtered messages) as well as without, and a missing topic that the topic cache
remembers forgotten once the topic is created."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.pop_buffer import PopBufferMergeService, PopJournal
from rmq_eventstore.broker.processor.pop import AckMessageProcessor, PopMessageProcessor
from rmq_eventstore.client.pop_consumer import PopConsumer
from rmq_eventstore.common import Message, codec
from rmq_eventstore.common.filter import MessageFilter
from rmq_eventstore.common.pop import BatchAck, ExtraInfo, PopCheckPoint, pop_retry_topic
from rmq_eventstore.common.properties import PROPERTY_POP_CK
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


class _Route:
    def __init__(self, name: str) -> None:
        self.broker_addrs = {name: "127.0.0.1:0"}


class _Base:
    """The client's connection layer replaced by a call into the broker's processors (no socket): the
    requests the client made and the responses it got are kept."""

    timeout = 3.0

    def __init__(self, broker: Broker) -> None:
        self.pop = PopMessageProcessor(broker)
        self.acker = AckMessageProcessor(broker)
        self.name = broker.config.broker_name
        self.sent: list[tuple[RemotingCommand, RemotingCommand]] = []

    def broker_for(self, topic: str) -> str:
        return "127.0.0.1:0"

    def route(self, topic: str) -> _Route:
        return _Route(self.name)

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0, ok: tuple = ()) -> RemotingCommand:
        r = (self.pop if cmd.code == RequestCode.POP_MESSAGE else self.acker).process(cmd, None)
        assert r is not None
        self.sent.append((cmd, r))
        return r


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with MessageStore.open(tmp_path / "store", **SMALL) as store:
        b = Broker(store)
        b.start()
        try:
            b.topic_manager.ensure("jobs", 4)
            # queue 0: 40 messages, every 4th tagged "skip"; queue 2: 5 messages; queues 1 and 3 empty
            store.put_messages([Message("jobs", f"a{i}".encode(), tags="skip" if i % 4 == 3 else "t", queue_id=0)
                                for i in range(40)])
            store.put_messages([Message("jobs", f"b{i}".encode(), tags="t", queue_id=2) for i in range(5)])
            store.wait_for_dispatch()
            yield b
        finally:
            b.shutdown()


def consumer(broker: Broker) -> tuple[PopConsumer, _Base]:
    c = PopConsumer.__new__(PopConsumer)
    base = _Base(broker)
    c.group, c._base = "g", base
    return c, base


def stored_record(broker: Broker, topic: str, queue_id: int, offset: int) -> bytes:
    r = broker.store.get_message("test-reader", topic, queue_id, offset, 1, None)
    assert r is not None and r.message_queue_offsets == [offset]
    return r.message_buffers[0]


def check_pop_response(broker: Broker, req: RemotingCommand, resp: RemotingCommand, topic: str) -> int:
    """The response is what `req.response` makes of the header values (same bytes), and its body is the
    stored record of every offset msgOffsetInfo names, in that order; how many messages."""
    x = resp.ext_fields
    ext = {"popTime": int(x["popTime"]), "invisibleTime": int(x["invisibleTime"]), "reviveQid": int(x["reviveQid"]),
           "restNum": int(x["restNum"]), "startOffsetInfo": x["startOffsetInfo"], "msgOffsetInfo": x["msgOffsetInfo"]}
    code = ResponseCode(resp.code)
    remark = None if code == ResponseCode.SUCCESS else "no new message"
    assert resp.encode() == req.response(code, remark, ext, resp.body).encode()
    records = []
    for item in filter(None, x["msgOffsetInfo"].split(";")):
        _flag, qid, offsets = item.split(" ")
        records += [stored_record(broker, topic, int(qid), int(o)) for o in offsets.split(",")]
    assert resp.body == b"".join(records)
    return len(records)


@pytest.mark.parametrize("tags", ["*", "t"])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_pop_responses_and_acks_are_what_the_general_code_makes(broker: Broker, tags: str, batch: int) -> None:
    c, base = consumer(broker)
    total = 0
    expected = 45 if tags == "*" else 35
    while True:
        msgs = c.pop("jobs", max_nums=batch, invisible_time=60_000, tags=tags)
        pop_req, pop_resp = base.sent[-1]
        # the client's request: what `RemotingCommand.request` makes of the same fields
        ref = RemotingCommand.request(RequestCode.POP_MESSAGE, {
            "consumerGroup": "g", "topic": "jobs", "queueId": -1, "maxMsgNums": batch, "invisibleTime": 60_000,
            "pollTime": 0, "bornTime": 0, "initMode": 1, "expType": "TAG", "exp": tags, "order": False})
        ref.opaque = pop_req.opaque
        assert pop_req.encode() == ref.encode()
        if not msgs:
            assert pop_resp.code == ResponseCode.NO_MESSAGE
            check_pop_response(broker, pop_req, pop_resp, "jobs")
            break
        assert check_pop_response(broker, pop_req, pop_resp, "jobs") == len(msgs)
        total += len(msgs)
        c.ack_batch(msgs)
        ack_req, ack_resp = base.sent[-1]
        assert ack_req.code == RequestCode.BATCH_ACK_MESSAGE and ack_resp.code == ResponseCode.SUCCESS
        doc = json.loads(ack_req.body)
        assert ack_req.body == json.dumps(doc, separators=(",", ":")).encode()
        ref = RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, ack_req.body)
        ref.opaque = ack_req.opaque
        assert ack_req.encode() == ref.encode()
    assert total == expected
    ps = broker.pop_service
    assert ps.buffer.in_flight() == 0 and ps.buffer.size() == 0  # every pop settled by its acks
    for q, end in ((0, 40), (2, 5)):  # filtered messages are passed too
        assert broker.offset_manager.file.query_offset("g", "jobs", q) == end


def test_pop_result_splits_its_records(broker: Broker) -> None:
    r = broker.pop_service.pop("g", "jobs", 0, 32, 60_000, "t")
    offsets = [int(o) for o in r.msg_offset_info[0].split(" ")[2].split(",")]
    assert offsets == [o for o in range(40) if o % 4 != 3]  # every 4th filtered out
    assert r.count == len(r.buffers) == 30
    assert r.buffers == [stored_record(broker, "jobs", 0, o) for o in offsets]
    assert [m.queue_offset for m in r.messages] == offsets and r.body == b"".join(r.buffers)


def test_the_journal_and_the_acked_bits_are_the_same_for_a_range_of_offsets(tmp_path: Path) -> None:
    def buffer(name: str) -> PopBufferMergeService:
        commits: dict = {}
        b = PopBufferMergeService(lambda ck, qid: True, lambda g, t, q, off: commits.__setitem__((g, t, q), off),
                                  lambda g, t, q: commits.get((g, t, q), -1), stay_ms=600_000)
        b.journal = PopJournal(str(tmp_path / name / "journal"))
        return b

    as_list, as_range = buffer("list"), buffer("range")
    cks = [PopCheckPoint(100, 1, 60_000, 8, 0, "t", "g", "b", list(range(8))),  # no gap
           PopCheckPoint(108, 2, 60_000, 4, 0, "t", "g", "b", [0, 2, 3, 7]),  # gaps: the general path
           PopCheckPoint(116, 3, 60_000, 32, 0, "t", "g", "b", list(range(32)))]
    acks = [(0, range(102, 105)), (0, range(98, 101)), (0, range(107, 112)), (1, range(108, 111)),
            (1, range(115, 116)), (2, range(116, 148)), (0, range(100, 108))]
    for b in (as_list, as_range):
        for ck in cks:
            assert b.add_ck(ck, 3, ck.start_offset + ck.queue_offset_diff[-1] + 1)
    for i, offsets in acks:
        ck = cks[i]
        key = (ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time)
        bits = [e.acked for e in as_list._queues[("g", "t", 0)]]
        assert bits == [e.acked for e in as_range._queues[("g", "t", 0)]]
        assert as_list.ack(key, list(offsets)) == as_range.ack(key, offsets)
    assert as_list.in_flight() == as_range.in_flight() == 1  # the one with gaps: 111 never acked
    assert [e.acked for e in as_list._queues[("g", "t", 0)]] == [e.acked for e in as_range._queues[("g", "t", 0)]]
    journal = (tmp_path / "list" / "journal").read_bytes()
    assert journal == (tmp_path / "range" / "journal").read_bytes()
    lines = journal.decode().splitlines()
    assert lines[0] == "C g t 0 100 1 60000 3 108 0,1,2,3,4,5,6,7"  # the cached text of a pop with no gap
    assert lines[1] == "C g t 0 108 2 60000 3 116 0,2,3,7"
    assert lines[3] == "A g t 0 100 1 102,103,104"


def test_ack_of_one_message_and_change_of_invisible_time_still_settle(broker: Broker) -> None:
    c, base = consumer(broker)
    msgs = c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=2)
    assert [m.queue_offset for m in msgs] == [0, 1, 2]
    c.ack(msgs[1])
    assert base.sent[-1][1].code == ResponseCode.SUCCESS
    c.change_invisible_time(msgs[0], 60_000)
    c.ack(msgs[0])
    c.ack(msgs[2])
    ps = broker.pop_service
    assert ps.buffer.in_flight() == 0


def test_extra_info_text_is_unchanged() -> None:
    e = ExtraInfo(10, 1700000000000, 30000, 3, True, "broker-a", 2, 17)
    assert e.build() == " ".join(str(x) for x in (10, 1700000000000, 30000, 3, "1", "broker-a", 2, 17))
    assert ExtraInfo(0, 1, 2, 0, False, "b", 0, 5).build() == "0 1 2 0 0 b 0 5"


def test_a_missing_topic_is_remembered_until_it_is_created(broker: Broker) -> None:
    tm = broker.topic_manager
    assert tm.get("later") is None and tm.get("later") is None
    tm.ensure("later", 2)
    tc = tm.get("later")
    assert tc is not None and tc.read_queue_nums == 2
    broker.topic_manager.file.delete("later")
    assert tm.get("later") is None


def reference_ack_body(group: str, msgs: list) -> bytes:
    """The BATCH_ACK body as the general code makes it: each handle parsed (`ExtraInfo.split`), one
    `BatchAck` per pop's queue in the order of first appearance, `{"acks": [to_dict(), ...]}` as compact JSON."""
    acks: dict[tuple, BatchAck] = {}
    for m in msgs:
        extra = ExtraInfo.split(m.properties[PROPERTY_POP_CK])
        key = (m.topic, extra.ck_queue_offset, extra.pop_time, extra.invisible_time, extra.revive_qid, extra.retry,
               extra.broker_name, extra.queue_id)
        if key not in acks:
            topic = pop_retry_topic(group, m.topic) if extra.retry else m.topic
            acks[key] = BatchAck(group, topic, extra.retry, extra.ck_queue_offset, extra.queue_id, extra.revive_qid,
                                 extra.pop_time, extra.invisible_time, [])
        acks[key].bits.append(extra.queue_offset - extra.ck_queue_offset)
    return json.dumps({"acks": [a.to_dict() for a in acks.values()]}, separators=(",", ":")).encode()


@pytest.mark.parametrize("parsed", [False, True])
def test_the_batch_ack_body_is_what_batch_acks_encode_to(broker: Broker, parsed: bool) -> None:
    """The client writes the BATCH_ACK body's text directly: the same bytes as the BatchAck entries' JSON, for
    messages of several queues and pops, a retry message, handles with a gap, and parsed properties."""
    c, _base = consumer(broker)
    first = c.pop("jobs", max_nums=7, invisible_time=60_000, tags="t", queue_id=0)  # a gap at every 4th
    second = c.pop("jobs", max_nums=3, invisible_time=30_000, queue_id=2)
    third = c.pop("jobs", max_nums=5, invisible_time=60_000, queue_id=0)
    msgs = [*first[:3], *second, *first[3:], *third]
    # a message that came from the retry topic: its handle says so (the ack names the retry topic)
    retry = c.pop("jobs", max_nums=1, invisible_time=60_000, queue_id=2)[0]
    extra = ExtraInfo.split(retry.properties[PROPERTY_POP_CK])
    retry.properties[PROPERTY_POP_CK] = dataclasses.replace(extra, retry=True).build()
    msgs.append(retry)
    if parsed:
        for m in msgs[::2]:
            assert m.properties  # parsed now: the loop in C leaves them to the Python path
    reqs = c._ack_requests(msgs)
    assert list(reqs) == ["127.0.0.1:0"]
    body = reqs["127.0.0.1:0"].body
    assert body == reference_ack_body("g", msgs)
    assert [len(a["b"]) for a in json.loads(body)["acks"]] == [3 + 4, 3, 5, 1]
    assert json.loads(body)["acks"][3]["t"] == pop_retry_topic("g", "jobs")
    for order in (msgs[::-1], third + third[:2]):  # bits descending; a run and then repeats
        assert c._ack_requests(order)["127.0.0.1:0"].body == reference_ack_body("g", order)
    unpopped = broker.store.get_message("test-reader", "jobs", 2, 4, 1, None)
    assert unpopped is not None
    with pytest.raises(ValueError, match="no POP_CK"):  # a message that was not popped
        c._ack_requests([*msgs[:2], unpopped.messages[0]])


def from_get_message(broker: Broker, queue_id: int, offset: int, n: int, filt: MessageFilter | None) -> tuple:
    r = broker.store.get_message("test-reader", "jobs", queue_id, offset, n, filt)
    assert r is not None
    return (r.status, r.next_begin_offset, r.max_offset, r.message_count, r.body if r.message_count else b"",
            r.message_queue_offsets)


@pytest.mark.parametrize("native", [True, False])
def test_the_read_for_pop_is_what_get_message_answers(broker: Broker, native: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`MessageStore.read_for_pop` (the native read without the result object) against `get_message`: the
    same statuses, next offsets, max offset, records and their offsets, for every start offset of a queue
    (and past its end), every batch size, with a filter that matches everything and one that skips."""
    if not native:
        monkeypatch.setattr(codec, "pull_native", None)
    elif codec.pull_native is None:
        pytest.skip("no native module")
    store = broker.store
    checked = 0
    for queue_id, top in ((0, 40), (2, 5), (1, 0)):
        cq = store.find_consume_queue("jobs", queue_id, create=False)
        if cq is None:
            continue
        for filt in (None, MessageFilter("*"), MessageFilter("t")):
            for offset in range(0, top + 3):
                for n in (1, 3, 32):
                    got = store.read_for_pop("jobs", queue_id, cq, offset, n, filt)
                    assert got is not None
                    status, end, max_offset, count, body, offsets = got
                    assert (status, end, max_offset, count, body, list(offsets)) == \
                        from_get_message(broker, queue_id, offset, n, filt)
                    if count and end - offset == count:  # consecutive: no per-record list made
                        assert isinstance(offsets, range)
                    checked += 1
    assert checked > 300
    store.shutdown()
    cq = store.find_consume_queue("jobs", 0, create=False)
    assert cq is not None and store.read_for_pop("jobs", 0, cq, 0, 1, None) is None  # as get_message


def test_the_rest_offset_is_the_pop_offset(broker: Broker) -> None:
    """What a POP counts as left in a queue (`rest_offset`, no lock) is where the next pop starts
    (`pop_offset`): for queues never popped, with pops in the buffer, partly and wholly acked, and
    committed; and the restNum of a pop over several queues is the sum of what each has left."""
    c, base = consumer(broker)
    buf = broker.pop_service.buffer

    def same() -> None:
        for q in range(4):
            assert buf.rest_offset("g", "jobs", q) == buf.pop_offset("g", "jobs", q)

    same()
    first = c.pop("jobs", max_nums=3, invisible_time=60_000, queue_id=2)
    second = c.pop("jobs", max_nums=7, invisible_time=60_000, queue_id=0)
    same()
    c.ack_batch(second[:2])
    same()
    c.ack_batch(first)
    same()
    c.ack_batch(second[2:])
    same()
    c.pop("jobs", max_nums=1, invisible_time=60_000)  # from queue 0 or 2: the others counted
    x = base.sent[-1][1].ext_fields
    left = sum(max(broker.store.get_max_offset_in_queue("jobs", q) - max(buf.pop_offset("g", "jobs", q), 0), 0)
               for q in range(4))
    assert int(x["restNum"]) == left == 34  # 40 - 7 + 5 - 3, less the one popped
