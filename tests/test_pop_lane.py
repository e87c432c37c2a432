"""The POP lane (`_native.pop_frame` -> `PopMessageProcessor.serve_frame` -> `PopService.pop_now` ->
`_native.pop_response`) against the reference (the frame decoded, `PopMessageProcessor.process(wait=False)`,
`PopService._pop_once`, `RemotingCommand.encode`): two brokers on byte-identical copies of one store, with the
same clock, the same random draws and the same revive queue counter, serve the same POP frames, one by the
lane and one by the reference; the response frames, the buffer journals, the consume offsets and the buffers'
state must be the same bytes after every request. Also: what the frame reader takes and declines, the
response builder against `encode`, and the lane over a real socket (served there, skipped under ACL)."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmq_eventstore.broker import Broker, pop_buffer, pop_service
from rmq_eventstore.broker.processor import pop as pop_processor
from rmq_eventstore.broker.processor.pop import ACK_FRAME, AckMessageProcessor, PopMessageProcessor
from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import PopConsumer, Producer
from rmq_eventstore.common import Message, codec
from rmq_eventstore.common.pop import pop_retry_topic
from rmq_eventstore.remoting import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.remoting.codes import SerializeType
from rmq_eventstore.remoting.command import decode_frame
from rmq_eventstore.store import MessageStore
from tests.conftest import import_native

_native = import_native()

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
NOW = time.time() + 3600.0  # the pops' clock: nothing they buffer comes due in a test
MAX_FRAME, MAX_HEADER = 16 << 20, 1 << 20
# the lane serves only with the native core in use (RMQ_EVENTSTORE_PURE=1: it declines everything, the usual path serves)
LANE = pop_processor.POP_FRAME is not None and codec.pull_native is not None


def pop_request(queue_id: int | str = -1, max_nums: int | str = 1, poll: int | str = 0, exp: str = "*",
                group: str = "g", topic: str = "jobs", invisible: int | str = 60_000, **extra: str) -> RemotingCommand:
    """A POP request as our client makes it (every field a string)."""
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
           "invisibleTime": str(invisible), "pollTime": str(poll), "bornTime": "0", "initMode": "1",
           "expType": "TAG", "exp": exp, "order": "false"}
    ext.update(extra)
    return RemotingCommand(RequestCode.POP_MESSAGE, ext, b"", 4711)


def fields(frame: bytes) -> tuple | None:
    return _native.pop_frame(frame, MAX_FRAME, MAX_HEADER, bytearray())


class Pair:
    """Two brokers on copies of one store: `lane` serves frames by the POP lane, `ref` by the reference."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, retry: bool = True, big: int = 0) -> None:
        seed = root / "seed"
        with MessageStore.open(seed, **SMALL) as store:
            b = Broker(store)
            b.start()
            try:
                b.topic_manager.ensure("jobs", 4)
                if retry:
                    b.topic_manager.ensure(pop_retry_topic("g", "jobs"), 1)
                # queue 0: 30 messages, every 4th tagged "skip"; queue 2: 5; queues 1 and 3 empty; the retry topic: 3
                store.put_messages([Message("jobs", f"a{i}".encode(), tags="skip" if i % 4 == 3 else "t", queue_id=0)
                                    for i in range(30)])
                store.put_messages([Message("jobs", f"b{i}".encode(), tags="t", queue_id=2) for i in range(5)])
                if big:  # queue 1: `big` more (pops of more than the 62 messages ack_settle takes)
                    store.put_messages([Message("jobs", f"c{i}".encode(), tags="t", queue_id=1) for i in range(big)])
                # stored even without the retry topic's config: its queue is popped once the config exists
                store.put_messages([Message(pop_retry_topic("g", "jobs"), f"r{i}".encode(), tags="t", queue_id=0)
                                    for i in range(3)])
                assert store.wait_for_dispatch()
            finally:
                b.shutdown()
        if not retry:  # the store registered the retry topic with its records: its config goes, its queue stays
            path = seed / "config" / "topics.json"
            doc = json.loads(path.read_text())
            del doc["topicConfigTable"][pop_retry_topic("g", "jobs")]
            path.write_text(json.dumps(doc))
        shutil.copytree(seed, root / "lane")
        shutil.copytree(seed, root / "ref")
        monkeypatch.setattr(pop_service, "time", types.SimpleNamespace(time=lambda: NOW, monotonic=time.monotonic))
        # no revive round at all, not even the one a slow start (the second broker's) would let the first run
        # before its thread is stopped below: its revive offsets would differ from the other broker's
        monkeypatch.setattr(pop_service, "REVIVE_INTERVAL", 3600.0)
        self.stores = [MessageStore.open(root / name, **SMALL) for name in ("lane", "ref")]
        self.brokers = []
        for store in self.stores:
            b = Broker(store)
            b.start()
            b.pop_service._stop.set()  # no revive round (nor journal reset) between the requests: only the test acts
            b.pop_service._thread.join(5)
            b.pop_service._qid = 0
            self.brokers.append(b)
        self.draws = [random.Random(7), random.Random(7)]
        self.lane_pop, self.ref_pop = (PopMessageProcessor(b) for b in self.brokers)
        self.ref_pop.now = False  # the reference: `_pop_once` only
        self.lane_ack, self.ref_ack = (AckMessageProcessor(b) for b in self.brokers)

    def close(self) -> None:
        for b in self.brokers:
            b.shutdown()
        for s in self.stores:
            s.shutdown()

    def _draws(self, i: int, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pop_service, "rng", self.draws[i])

    def pop(self, req: RemotingCommand, monkeypatch: pytest.MonkeyPatch, served: bool | None = True,
            looked_twice: bool = False) -> bytes | None:
        """The request's frame served by both; the lane's answer (None: it declined, and the reference then
        served it on the lane's broker too, as the server does) must be the reference's bytes."""
        frame = req.encode()
        f = fields(frame)
        assert f is not None
        self._draws(0, monkeypatch)
        got = self.lane_pop.serve_frame(f)
        if served is not None:
            assert (got is not None) == (served and LANE)
        if got is None:
            r = self.lane_pop.process(decode_frame(frame[4:]), None, wait=False)
            got = r.encode() if r is not None else None
        self._draws(1, monkeypatch)
        ref = self.ref_pop.process(decode_frame(frame[4:]), None, wait=False)
        assert got == (ref.encode() if ref is not None else None)
        if looked_twice and LANE:  # declined after its look (it may wait): the usual path looked again, a revive queue further
            assert self.brokers[0].pop_service._qid == (self.brokers[1].pop_service._qid + 1) % 8
            self.brokers[0].pop_service._qid = self.brokers[1].pop_service._qid
        self.check_state()
        return got

    def ack(self, resp: bytes, which: str = "all", lane: bool = False) -> None:
        """Ack (one ACK_MESSAGE per message) the popped messages of a response on both brokers; with `lane`, the
        lane broker serves each by the ACK lane (`AckMessageProcessor.lane`: `PopBufferMergeService.ack_one`,
        `_native.ack_settle`) when it takes it, the reference broker by `process`."""
        r = decode_frame(resp[4:])
        x = r.ext_fields
        starts = {}
        for item in filter(None, x["startOffsetInfo"].split(";")):
            flag, qid, start = item.split(" ")
            starts[(flag, qid)] = start
        n = 0
        for item in filter(None, x["msgOffsetInfo"].split(";")):
            flag, qid, offsets = item.split(" ")
            topic = pop_retry_topic("g", "jobs") if flag == "1" else "jobs"
            for off in offsets.split(","):
                n += 1
                if which == "odd" and n % 2 == 0:
                    continue
                extra = (f"{starts[(flag, qid)]} {x['popTime']} {x['invisibleTime']} {x['reviveQid']} {flag} "
                         f"{self.brokers[0].config.broker_name} {qid} {off}")
                for p in (self.lane_ack, self.ref_ack):
                    req = RemotingCommand.request(RequestCode.ACK_MESSAGE, {
                        "consumerGroup": "g", "topic": topic, "queueId": qid, "extraInfo": extra, "offset": off})
                    if lane and p is self.lane_ack and ACK_FRAME is not None:
                        got = ACK_FRAME(req.encode(), MAX_FRAME, MAX_HEADER, bytearray())
                        assert got is not None
                        if p.lane(got):
                            continue
                    a = p.process(req, None)
                    assert a.code == ResponseCode.SUCCESS
        self.check_state()

    def ack_batch(self, resp: bytes) -> None:
        """Ack every popped message of a response with one BATCH_ACK_MESSAGE entry per queue on both brokers: the
        lane broker by the ACK lane when it takes it, the reference broker by `process`."""
        x = decode_frame(resp[4:]).ext_fields
        starts = {}
        for item in filter(None, x["startOffsetInfo"].split(";")):
            flag, qid, start = item.split(" ")
            starts[(flag, qid)] = int(start)
        acks = []
        for item in filter(None, x["msgOffsetInfo"].split(";")):
            flag, qid, offsets = item.split(" ")
            so = starts[(flag, qid)]
            acks.append({"c": "g", "t": "jobs", "r": flag, "so": so, "q": int(qid), "rq": int(x["reviveQid"]),
                         "pt": int(x["popTime"]), "it": int(x["invisibleTime"]),
                         "b": [int(o) - so for o in offsets.split(",")]})
        req = RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {})
        req.body = json.dumps({"acks": acks}, separators=(",", ":")).encode()
        got = ACK_FRAME(req.encode(), MAX_FRAME, MAX_HEADER, bytearray()) if ACK_FRAME is not None else None
        if got is None or not self.lane_ack.lane(got):
            assert self.lane_ack.process(req, None).code == ResponseCode.SUCCESS
        assert self.ref_ack.process(req, None).code == ResponseCode.SUCCESS
        self.check_state()

    def check_state(self) -> None:
        lane, ref = self.brokers
        jl, jr = (Path(b.pop_service.buffer.journal.path).read_bytes() for b in self.brokers)
        assert jl == jr
        assert lane.offset_manager.file.offset_table() == ref.offset_manager.file.offset_table()
        bl, br = lane.pop_service.buffer, ref.pop_service.buffer
        assert {k: [(e.next_offset, e.acked, e.full, e.stored, e.contiguous, e.revive_qid, e.flush_at, e.ck)
                    for e in q] for k, q in bl._queues.items()} == \
               {k: [(e.next_offset, e.acked, e.full, e.stored, e.contiguous, e.revive_qid, e.flush_at, e.ck)
                    for e in q] for k, q in br._queues.items()}
        assert bl._by_key.keys() == br._by_key.keys()
        assert [type(v).__name__ for e in bl._by_key.values() for v in (e.acked, e.full, e.flush_at, e.ck.num)] == \
               [type(v).__name__ for e in br._by_key.values() for v in (e.acked, e.full, e.flush_at, e.ck.num)]
        assert bl._count == br._count
        assert (bl.settled, bl.stored, bl._committed_by_me) == (br.settled, br.stored, br._committed_by_me)
        assert bl.journal.size == br.journal.size == len(jl)
        assert lane.pop_service._qid == ref.pop_service._qid


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    p = Pair(tmp_path, monkeypatch)
    try:
        yield p
    finally:
        p.close()


def drain(pair: Pair, monkeypatch: pytest.MonkeyPatch, first_served: bool, **kw: object) -> list[bytes]:
    """POP until NO_MESSAGE; every response is checked against the reference."""
    out = [pair.pop(pop_request(**kw), monkeypatch, served=first_served)]  # the first makes the filter
    for _ in range(60):
        got = pair.pop(pop_request(**kw), monkeypatch)
        assert got is not None
        out.append(got)
        if decode_frame(got[4:]).code == ResponseCode.NO_MESSAGE:
            return out
    raise AssertionError("the queues never ran dry")


@pytest.mark.parametrize("batch", [1, 3, 32])
def test_all_queues_pop_to_the_end_as_the_reference_does(pair: Pair, monkeypatch: pytest.MonkeyPatch,
                                                         batch: int) -> None:
    out = drain(pair, monkeypatch, False, max_nums=batch)
    popped = [(item.split(" ")[0], item.split(" ")[1], int(o)) for f in out
              for item in filter(None, decode_frame(f[4:]).ext_fields["msgOffsetInfo"].split(";"))
              for o in item.split(" ")[2].split(",")]
    assert sorted(popped) == sorted([("0", "0", o) for o in range(30)] + [("0", "2", o) for o in range(5)]
                                    + [("1", "0", o) for o in range(3)])  # every message once
    for f in out[1:-1]:
        pair.ack(f)


@pytest.mark.parametrize("batch", [1, 4])
def test_without_a_retry_topic_and_once_it_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      batch: int) -> None:
    p = Pair(tmp_path, monkeypatch, retry=False)
    try:
        assert all(b.topic_manager.get(pop_retry_topic("g", "jobs")) is None for b in p.brokers)
        p.pop(pop_request(max_nums=batch), monkeypatch, served=False)
        for _ in range(5):  # the queues in `_queues`' order, without the retry topic
            p.pop(pop_request(max_nums=batch), monkeypatch)
        for b in p.brokers:
            b.topic_manager.ensure(pop_retry_topic("g", "jobs"), 1)
            assert b.topic_manager.get(pop_retry_topic("g", "jobs")) is not None, b.pop_service._retry_names
        out = [p.pop(pop_request(max_nums=batch), monkeypatch) for _ in range(40)]
        infos = [decode_frame(f[4:]).ext_fields["msgOffsetInfo"] for f in out if f]
        assert any(item.startswith("1 0 ") for i in infos for item in i.split(";"))  # the retry messages came
    finally:
        p.close()


def test_one_queue_with_acks_between_the_pops(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    pair.pop(pop_request(queue_id=0, max_nums=2), monkeypatch, served=False)  # the filter "*" is made here
    for i in range(8):
        got = pair.pop(pop_request(queue_id=0, max_nums=1 + i % 3), monkeypatch)
        assert got is not None
        pair.ack(got, "odd" if i % 2 else "all")
    pair.pop(pop_request(queue_id=2, max_nums=9), monkeypatch)
    pair.pop(pop_request(queue_id=3, max_nums=9), monkeypatch)  # an empty queue: NO_MESSAGE, served


def test_a_pop_that_may_wait_and_finds_nothing_is_left_to_the_usual_path(pair: Pair,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    drain(pair, monkeypatch, False, max_nums=32)
    assert pair.pop(pop_request(poll=1000), monkeypatch, served=False, looked_twice=True) is None  # process: None too
    assert pair.pop(pop_request(queue_id=2, poll=1000), monkeypatch, served=False, looked_twice=True) is None


@pytest.mark.parametrize("req", [
    pop_request(exp="t"),  # a tag filter: the reference's
    pop_request(exp="t || skip"),
    pop_request(expType="SQL92"),  # refused by the reference
    pop_request(invisible=0),
    pop_request(group="%bad group%"),
    pop_request(topic="nope"),
    pop_request(queue_id=4),
], ids=["tag", "tags", "sql", "invisible0", "badgroup", "notopic", "badqueue"])
def test_the_lane_declines_what_is_not_its_case_before_anything_changed(pair: Pair, monkeypatch: pytest.MonkeyPatch,
                                                                        req: RemotingCommand) -> None:
    pair.pop(pop_request(queue_id=3), monkeypatch, served=False)  # the "*" filter exists
    journal = Path(pair.brokers[0].pop_service.buffer.journal.path).read_bytes()
    qid = pair.brokers[0].pop_service._qid
    f = fields(req.encode())
    assert f is not None
    pair._draws(0, monkeypatch)
    assert pair.lane_pop.serve_frame(f) is None
    assert Path(pair.brokers[0].pop_service.buffer.journal.path).read_bytes() == journal
    assert pair.brokers[0].pop_service._qid == qid
    pair.draws[0] = random.Random(7)  # the draws stay in step
    pair.draws[1] = random.Random(7)
    pair.pop(req, monkeypatch, served=False)


def test_a_full_buffer_writes_the_checkpoint_as_add_ck_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(tmp_path, monkeypatch)
    try:
        for b in p.brokers:
            b.pop_service.buffer.max_size = 2
        p.pop(pop_request(queue_id=0), monkeypatch, served=False)
        for _ in range(4):  # the buffer fills: the rest are written to the revive topic
            p.pop(pop_request(queue_id=0, max_nums=2), monkeypatch)
        revive = p.brokers[0].pop_service.revive_topic
        assert all(s.wait_for_dispatch() for s in p.stores)
        counts = [sum(s.get_max_offset_in_queue(revive, q) for q in range(8)) for s in p.stores]
        assert counts[0] == counts[1] > 0
    finally:
        p.close()


def test_the_buffer_off_is_declined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = Pair(tmp_path, monkeypatch)
    try:
        for b in p.brokers:
            b.pop_service.buffer.enabled = False
        p.pop(pop_request(queue_id=0), monkeypatch, served=False)
        p.pop(pop_request(queue_id=0), monkeypatch, served=False)
    finally:
        p.close()


# -- the POP core: pop_now's registration and ack_one's settling in C (_native.pop_register / ack_settle) -----
@pytest.mark.parametrize("one", [True, False], ids=["ack_one", "ack_settle"])
@pytest.mark.parametrize("batch", [1, 2, 5, 32])
def test_pops_acked_by_the_ack_lane_as_the_reference_acks_them(pair: Pair, monkeypatch: pytest.MonkeyPatch,
                                                               batch: int, one: bool) -> None:
    """Entries the lane's POP registered (`pop_register`), settled by the ACK lane (`ack_settle`; with `one`, THE
    ACK ONE's `ack_one`: the lane's checks, ack_settle and the offset commit in one C call) on one broker and by
    the reference's pop and ack on the other: every frame, journal byte and buffer field the same."""
    calls = {"register": 0, "settle": 0, "one": 0}
    if not one:
        monkeypatch.setattr(pop_processor, "_ACK_ONE", None)
    for module, name, what in ((pop_service, "_POP_REGISTER", "register"), (pop_buffer, "_ACK_SETTLE", "settle"),
                               (pop_service, "_POP_QUEUE", "register"),  # pop_queue registers by pop_register
                               (pop_processor, "_ACK_ONE", "one")):
        real = getattr(module, name)
        if real is not None:
            def counted(*args: object, _real: Any = real, _what: str = what, _queue: bool = name == "_POP_QUEUE") -> Any:
                got = _real(*args)
                calls[_what] += got is not None and (not _queue or len(got) == 6)
                return got
            monkeypatch.setattr(module, name, counted)
    pair.pop(pop_request(max_nums=batch), monkeypatch, served=False)  # the "*" filter is made here
    for i in range(40):
        got = pair.pop(pop_request(max_nums=batch, queue_id=-1 if i % 3 else 0), monkeypatch)
        assert got is not None
        if decode_frame(got[4:]).code == ResponseCode.NO_MESSAGE:
            break
        if i % 4 == 3:
            pair.ack_batch(got)
        else:
            pair.ack(got, "odd" if i % 4 == 1 else "all", lane=True)
    assert (calls["register"] > 0 and calls["settle" if not one else "one"] > 0) == LANE, calls  # pure: no C half


def test_a_pop_of_many_and_its_acks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pop of more than 62 messages (a full mask past 64 bits: pop_register makes it, ack_settle declines to
    `_ack_run`) and one of exactly 62 (the largest ack_settle takes)."""
    p = Pair(tmp_path, monkeypatch, retry=False, big=200)
    try:
        for store in p.stores:  # reads of up to 1024 messages (32 by default)
            store.config.max_transfer_count_on_message_in_memory = 1024
        p.pop(pop_request(queue_id=1, max_nums=2), monkeypatch, served=False)
        for n, how in ((100, "odd"), (62, "all"), (36, "batch")):
            got = p.pop(pop_request(queue_id=1, max_nums=n), monkeypatch)
            assert got is not None
            assert len(decode_frame(got[4:]).ext_fields["msgOffsetInfo"].split(" ")[2].split(",")) == n
            if how == "batch":
                p.ack_batch(got)
            else:
                p.ack(got, how, lane=True)
        assert [len(b.pop_service.buffer._by_key) for b in p.brokers] == [2, 2]  # the first pop, the 100s unacked half
    finally:
        p.close()


def test_the_core_declines_what_is_not_its_case_before_anything_changed(pair: Pair) -> None:
    from collections import deque

    from rmq_eventstore.broker.pop_buffer import _Entry
    from rmq_eventstore.common.pop import PopCheckPoint

    buffer = pair.brokers[0].pop_service.buffer
    fd = buffer.journal._fd
    by_key: dict = {}
    queues: dict = {}
    good = [PopCheckPoint, _Entry, deque, by_key, queues, ("g", "jobs", 0), fd, "g", "jobs", 0, 5, 7, 10**12,
            60_000, "b", 3, 10_000, 500, False]
    for i, bad in ((3, {}.items()), (5, ["g", "jobs", 0]), (6, -1), (7, b"g"), (8, None), (9, 1.0), (10, 7),
                   (10, True), (11, 5 + 1025), (11, 2**70), (12, "1"), (14, None), (18, 0), (7, "g\udc80")):
        args = list(good)
        args[i] = bad
        assert _native.pop_register(*args) is None, (i, bad)
    assert not by_key and not queues and Path(buffer.journal.path).read_bytes() == b""
    got = _native.pop_register(*good)
    assert got == (len(b"C g jobs 0 5 1000000000000 60000 3 7 0,1\n"), False, "0 0 5", "0 0 5,6")
    entry = by_key[("g", "jobs", 0, 5, 10**12)]
    assert list(queues[("g", "jobs", 0)]) == [entry]
    # ack_settle: what it leaves to `_ack_run` (and `ack_one`'s own refusals) changes nothing
    key = ("g", "jobs", 0, 5, 10**12)
    journal = Path(buffer.journal.path).read_bytes()
    for args in ((by_key, ("g", "jobs", 0, 5, 10**12 + 1), 5, 6, fd), (by_key, key, 6, 6, fd), (by_key, key, 6, 5, fd),
                 (by_key, list(key), 5, 6, fd), (by_key, key, 5, 6, -1), (by_key, key, 5.0, 6, fd),
                 (dict(by_key), ("g", "jobs", 0, 5, True), 5, 6, fd)):
        assert _native.ack_settle(*args) is None
    entry.stored = True
    assert _native.ack_settle(by_key, key, 5, 6, fd) is None
    entry.stored = False
    entry.contiguous = False
    assert _native.ack_settle(by_key, key, 5, 6, fd) is None
    entry.contiguous = True
    assert entry.acked == 0 and Path(buffer.journal.path).read_bytes() == journal
    assert _native.ack_settle(by_key, key, 4, 6, fd) == (len("A g jobs 0 5 1000000000000 4,5\n"), False)
    assert entry.acked == 1 and key in by_key
    assert _native.ack_settle(by_key, key, 6, 9, fd) == (len("A g jobs 0 5 1000000000000 6,7,8\n"), True)
    assert entry.acked == 3 and key not in by_key
    assert Path(buffer.journal.path).read_bytes() == journal + b"A g jobs 0 5 1000000000000 4,5\n" \
        b"A g jobs 0 5 1000000000000 6,7,8\n"


# -- the frame reader -------------------------------------------------------------------------------------
def test_the_fields_are_what_process_reads() -> None:
    req = pop_request(queue_id=-1, max_nums=32, poll=15000, exp="a || b", group="g\u00e9\"x", topic="t\\1",
                      invisible=12345)
    assert fields(req.encode()) == (4711, 435, "g\u00e9\"x", "t\\1", -1, 32, 12345, 15000, "a || b", "TAG")
    bare = RemotingCommand(RequestCode.POP_MESSAGE, {"invisibleTime": "5"}, b"", 9)
    assert fields(bare.encode()) == (9, 435, None, None, None, None, 5, None, None, None)


@pytest.mark.parametrize("mutate", [
    lambda c: setattr(c, "code", RequestCode.PULL_MESSAGE),
    lambda c: setattr(c, "flag", FLAG_ONEWAY),
    lambda c: setattr(c, "flag", FLAG_RESPONSE),
    lambda c: c.ext_fields.update(queueId="+1"),
    lambda c: c.ext_fields.update(maxMsgNums=" 1"),
    lambda c: c.ext_fields.update(pollTime=""),
    lambda c: c.ext_fields.update(invisibleTime="1_000"),
    lambda c: c.ext_fields.update(invisibleTime="1234567890123456789"),
], ids=["code", "oneway", "response", "plus", "space", "empty", "underscore", "long"])
def test_the_frame_reader_declines_what_is_not_plain(mutate: object) -> None:
    req = pop_request()
    mutate(req)  # type: ignore[operator]
    assert fields(req.encode()) is None


def rewrite_header(frame: bytes, text: str) -> bytes:
    """`frame` with its JSON header replaced by `text` (the same frame, its header written another way)."""
    head = text.encode()
    body = frame[8 + (int.from_bytes(frame[4:8], "big") & 0xFFFFFF):]
    return (4 + len(head) + len(body)).to_bytes(4, "big") + len(head).to_bytes(4, "big") + head + body


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": "), (",", " : "), (" ,", " :"), ("\n,", "\t:")])
def test_the_frame_reader_reads_a_header_written_any_way(separators: tuple) -> None:
    """The header's keys as our peers write them (`"key":`) are read inline (THE ACK BATCH's al_member), any other
    spacing by the general reader: the same fields either way."""
    frame = pop_request(queue_id=2, max_nums=32).encode()
    head = json.loads(frame[8:8 + (int.from_bytes(frame[4:8], "big") & 0xFFFFFF)])
    text = json.dumps(head, separators=separators)
    assert fields(rewrite_header(frame, text)) == fields(frame) == (4711, 435, "g", "jobs", 2, 32, 60000, 0, "*", "TAG")
    escaped = text.replace('"code"', '"\\u0063ode"')  # an escaped key: the decoder's
    assert fields(rewrite_header(frame, escaped)) is None


def test_the_frame_reader_declines_a_binary_header() -> None:
    frame = bytearray(pop_request().encode())
    frame[4] = SerializeType.ROCKETMQ  # the serialize type byte of the header length word
    assert fields(bytes(frame)) is None


def test_the_frame_reader_declines_anything_but_one_whole_frame() -> None:
    frame = pop_request().encode()
    assert fields(frame) is not None
    assert fields(frame + frame) is None
    assert fields(frame[:-1]) is None
    assert _native.pop_frame(frame, MAX_FRAME, MAX_HEADER, bytearray(b"x")) is None  # the decoder holds a part
    assert _native.pop_frame(frame, len(frame) - 8, MAX_HEADER, bytearray()) is None
    bad = frame.replace(b'"invisibleTime":"60000"', b'"invisibleTime":60000')  # not a string: the decoder's
    bad = len(bad[4:]).to_bytes(4, "big") + bad[4:]
    assert fields(bad) is None


@pytest.mark.parametrize("code,remark,body", [(ResponseCode.SUCCESS, None, b"\x00\x01rec"),
                                              (ResponseCode.NO_MESSAGE, "no new message", b""),
                                              (ResponseCode.POLLING_TIMEOUT, "a \"quoted\" \u00e9 remark\n", b"")])
def test_the_response_frame_is_what_encode_makes(code: int, remark: str | None, body: bytes) -> None:
    args = (1 << 40, 60_000, 7, 123456789012, "0 2 5;1 0 0", "0 2 5,6,7;1 0 0")
    want = RemotingCommand(int(code), {"popTime": str(args[0]), "invisibleTime": str(args[1]),
                                       "reviveQid": str(args[2]), "restNum": str(args[3]),
                                       "startOffsetInfo": args[4], "msgOffsetInfo": args[5]},
                           body, 99, FLAG_RESPONSE, remark, "JAVA", 401).encode()
    assert _native.pop_response(int(code), 99, 401, remark, *args, body) == want
    assert _native.pop_response(int(code), 99, 401, remark, *args[:4], 5, args[5], body) is None  # not a str


# -- over a socket --------------------------------------------------------------------------------------------
def serve_counted(monkeypatch: pytest.MonkeyPatch, **config: object) -> tuple:
    counts = {"served": 0}
    real = PopMessageProcessor.serve_frame

    def counted(self: PopMessageProcessor, f: tuple) -> bytes | None:
        got = real(self, f)
        counts["served"] += got is not None
        return got

    monkeypatch.setattr(PopMessageProcessor, "serve_frame", counted)
    return serve_in_thread(tempfile.mkdtemp(prefix="pop-lane-"), announce=False, **config), counts


def test_pops_over_a_socket_take_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    running, counts = serve_counted(monkeypatch)
    try:
        assert (running.server._pop_lane is not None) == LANE
        with Producer(running.namesrv_address, "p") as p:
            for i in range(6):
                p.send(Message("lane", f"m{i}".encode(), keys=f"k{i}"), queue_id=0)
        assert running.store.wait_for_dispatch()
        with PopConsumer(running.namesrv_address, "g") as c:
            got = []
            for _ in range(8):
                msgs = c.pop("lane", max_nums=1, invisible_time=60_000)
                got += msgs
                for m in msgs:
                    c.ack(m)
            assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(6)]
            assert c.pop("lane", max_nums=1, invisible_time=60_000, poll_time=200) == []  # held on the loop
        assert counts["served"] >= 6 if LANE else counts["served"] == 0
    finally:
        running.close()
        shutil.rmtree(running.store_path, ignore_errors=True)


def test_a_decoded_pop_takes_pop_now_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A POP the lane does not take whole (here pipelined behind its ack: two frames in one read, decoded) is
    served by `process`, which takes `PopService.pop_now` first, as the lane does, not the reference `_pop_once`
    (which only the first pop, making the "*" filter, and the pure build take)."""
    calls = {"once": 0}
    real = pop_service.PopService._pop_once

    def counted(self: pop_service.PopService, *a: Any) -> Any:
        calls["once"] += 1
        return real(self, *a)

    monkeypatch.setattr(pop_service.PopService, "_pop_once", counted)
    running, counts = serve_counted(monkeypatch)
    try:
        with Producer(running.namesrv_address, "p") as p:
            for i in range(6):
                p.send(Message("piped", f"m{i}".encode()), queue_id=0)
        assert running.store.wait_for_dispatch()
        with PopConsumer(running.namesrv_address, "g") as c:
            got = c.pop("piped", max_nums=1, invisible_time=60_000)
            seen = list(got)
            for _ in range(6):
                got = c.pop("piped", max_nums=1, invisible_time=60_000, ack=got)  # ack + pop in one write
                seen += got
            assert [m.body for m in seen] == [f"m{i}".encode() for i in range(6)] and got == []
        assert calls["once"] == (1 if LANE else 7)
    finally:
        running.close()
        shutil.rmtree(running.store_path, ignore_errors=True)


def test_sync_flush_and_the_pure_build_keep_the_usual_path(monkeypatch: pytest.MonkeyPatch) -> None:
    running, counts = serve_counted(monkeypatch, flush_disk_type="SYNC_FLUSH")
    try:
        assert running.server._pop_lane is None  # POPs are served on threads under SYNC_FLUSH
    finally:
        running.close()
        shutil.rmtree(running.store_path, ignore_errors=True)
    monkeypatch.setattr(pop_processor, "_pop_response", None)  # the response encoded by RemotingCommand
    running, counts = serve_counted(monkeypatch)
    try:
        with Producer(running.namesrv_address, "p") as p:
            p.send(Message("lane", b"one", keys="k"), queue_id=0)
        assert running.store.wait_for_dispatch()
        with PopConsumer(running.namesrv_address, "g") as c:
            got = []
            for _ in range(3):  # the first makes the "*" filter (the usual path), the lane serves the others
                got += c.pop("lane", max_nums=1, invisible_time=60_000)
            assert [m.body for m in got] == [b"one"]
        assert counts["served"] == (2 if LANE else 0)
    finally:
        running.close()
        shutil.rmtree(running.store_path, ignore_errors=True)


# -- THE POP READ (branch pop-broker): pop_now's queue list, read and registration in C, and without them ------
@pytest.mark.parametrize("native_parts", ["none", "live", "queue", "both"])
def test_pop_now_with_and_without_the_pop_read(pair: Pair, monkeypatch: pytest.MonkeyPatch, native_parts: str) -> None:
    """pop_now's Python lines for what `_native.queue_live` / `_native.pop_queue` do (the native core without
    them) and the C ones, each against the reference: every queue and one queue, batches of 1, 3 and 32, acks."""
    if native_parts in ("none", "queue"):
        monkeypatch.setattr(pop_service, "_QUEUE_LIVE", None)
    if native_parts in ("none", "live"):
        monkeypatch.setattr(pop_service, "_POP_QUEUE", None)
    pair.pop(pop_request(max_nums=2), monkeypatch, served=False)  # the "*" filter is made here
    for i in range(30):
        got = pair.pop(pop_request(max_nums=(1, 3, 32)[i % 3], queue_id=-1 if i % 4 else 2), monkeypatch)
        assert got is not None
        if decode_frame(got[4:]).code == ResponseCode.SUCCESS and i % 2:
            pair.ack(got, "odd" if i % 3 else "all", lane=bool(i % 5))


# -- THE ACK ONE: the ACK lane's checks, ack_settle and the offset commit in one C call (_native.ack_one) ----------
def test_ack_one_commits_as_commit_offset_does(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """ack_one's commits through the offset file (commit_offset / query_offset read in C) on every step they take:
    a version step every 2 commits (DataVersion.next_version), a pair the table does not hold yet (commit's own
    call, its name checks); the table, its commit count and data version the reference's."""
    if pop_processor._ACK_ONE is None:
        pytest.skip("without the native core")
    for b in pair.brokers:
        b.offset_manager.file.update_version_step = 2
        b.offset_manager.file._offset_table.pop("jobs@g", None)
    used = {"one": 0}
    real = pop_processor._ACK_ONE

    def counted(*args: object) -> Any:
        got = real(*args)
        used["one"] += got is not None
        return got

    monkeypatch.setattr(pop_processor, "_ACK_ONE", counted)
    pair.pop(pop_request(max_nums=1, queue_id=0), monkeypatch, served=False)  # the "*" filter is made here
    for i in range(12):
        got = pair.pop(pop_request(max_nums=1 + i % 3, queue_id=0 if i % 2 else 2), monkeypatch)
        assert got is not None
        if decode_frame(got[4:]).code == ResponseCode.NO_MESSAGE:
            continue
        if i % 3 == 2:
            pair.ack_batch(got)
        else:
            pair.ack(got, "all", lane=True)
        files = [b.offset_manager.file for b in pair.brokers]
        assert [(f._commits, f.data_version.counter) for f in files][0] == \
               [(f._commits, f.data_version.counter) for f in files][1]
    assert used["one"] > 0 and pair.brokers[0].offset_manager.file._commits > 2


def test_ack_one_declines_before_anything_changed(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ack_one does not take (None) changes nothing: another shape, a retry entry, a topic not in the topic
    cache or a cache gone stale, a queue the store has not, an offset outside the queue, an ack of no buffered
    checkpoint; the lane then answers as before (the reference's state after all of them)."""
    if pop_processor._ACK_ONE is None:
        pytest.skip("without the native core")
    lane = pair.brokers[0]
    one = pop_processor._ACK_ONE
    proc = pair.lane_ack
    pair.pop(pop_request(max_nums=1, queue_id=0), monkeypatch, served=False)
    got = pair.pop(pop_request(max_nums=2, queue_id=2), monkeypatch)
    x = decode_frame(got[4:]).ext_fields
    pt, rq = int(x["popTime"]), int(x["reviveQid"])
    bn = lane.config.broker_name
    ctx = proc._ack_one_ctx()
    assert ctx[-1] is lane.offset_manager.file

    def ack_msg(topic: str = "jobs", q: int = 2, offset: int = 0, ck: int = 0, extra_q: int = 2) -> tuple:
        return (b"", None, "g", topic, q, offset, ck, pt, 60_000, rq, False, bn, extra_q, offset)

    def batch(topic: str = "jobs", retry: bool = False, q: int = 2, first: int = 0, count: int = 1) -> tuple:
        return (b"", [("g", topic, retry, 0, q, rq, pt, 60_000, first, count)])

    journal = Path(lane.pop_service.buffer.journal.path).read_bytes()
    state = (dict(lane.pop_service.buffer._by_key), lane.offset_manager.file.offset_table())
    with pytest.raises(TypeError):
        one(ack_msg(), ctx[:-1])
    for bad in (ack_msg()[:13], (b"", None), (b"", [batch()[1][0]] * 2), batch(retry=True),
                batch(topic="nope"), batch(q=3), batch(first=5), batch(first=1, count=2), batch(count=0),
                ack_msg(topic="nope"), ack_msg(q=9), ack_msg(offset=9), ack_msg(ck=1), ack_msg(extra_q=1),
                ack_msg(offset=-1), [ack_msg()], (b"", None, b"g", *ack_msg()[3:])):
        assert one(bad, ctx) is None, bad
    tm_cache = lane.topic_manager._cache
    tm_cache._key = (tm_cache._key[0] - 1, tm_cache._key[1])  # stale: entries() would start afresh
    assert one(ack_msg(), ctx) is None
    tm_cache._key = (-1, -1)
    assert Path(lane.pop_service.buffer.journal.path).read_bytes() == journal
    assert (dict(lane.pop_service.buffer._by_key), lane.offset_manager.file.offset_table()) == state
    pair.ack(got, "all", lane=True)  # the lane (its Python after ack_one's None, or ack_one) as the reference


# -- THE POP OFFSET: PopBufferMergeService.pop_offset in C (_native.pop_offset) --------------------------------------
def test_pop_offset_is_the_buffers(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """pop_offset(ctx, qkey) answers PopBufferMergeService.pop_offset: nothing buffered (the committed offset, or
    -1), a queue's pops buffered (past them, or the committed offset when that is further), with the offset file
    read in C and with the buffer's own `committed` callable."""
    if not hasattr(_native, "pop_offset"):
        pytest.skip("without the native core")
    svc = pair.brokers[0].pop_service
    buffer = svc.buffer
    ctx = svc._make_pop_offset_ctx()
    assert ctx[3] is pair.brokers[0].offset_manager.file
    plain = ctx[:3] + (None,)

    def check() -> None:
        for qkey in (("g", "jobs", 0), ("g", "jobs", 2), ("g", "jobs", 3), ("h", "jobs", 0), ("g", "x", 0)):
            want = buffer.pop_offset(*qkey)
            assert _native.pop_offset(ctx, qkey) == want == _native.pop_offset(plain, qkey), qkey

    check()
    pair.pop(pop_request(max_nums=1, queue_id=0), monkeypatch, served=False)
    for q in (0, 2, 0):
        pair.pop(pop_request(max_nums=2, queue_id=q), monkeypatch)
        check()
    buffer._commit("g", "jobs", 2, 100)  # committed past what is buffered
    check()
    with pytest.raises(TypeError):
        _native.pop_offset(ctx, ("g", "jobs"))
    assert not buffer._lock.locked()
