"""The native dispatch pass (`_native.dispatch_singles`, `ReputMessageService.set_fast_pass`) against the Python
pass, store against store.

Two stores receive the same puts (same topics, queues, bodies, keys: records of the same sizes at the same
offsets), and before each dispatch pass the reference store's hand-offs are replaced with the native store's
own requests, so both dispatch exactly the same `DispatchRequest`s in the same passes. The native store
dispatches with the one-call pass (falling back to the Python pass for what it does not take); the reference
with the whole Python pass and `codec.native` switched off while it dispatches (group_units_py, the numpy
index loop, the array consume-queue path). Then the consume-queue files, the index files (in order; their
names are creation times), the checkpoint's logics time, the reput offsets and what the arrival listeners
heard must be the same. Scenarios: consume-queue file rolls, many queues in one pass, index files filling up
(entries split across files), a deleted topic with records before its cutoff, prepared and rolled-back
transaction records, a read-only queue, keys of wide characters, the index turned off.

Skipped when the extension is not built, unless `RMQ_EVENTSTORE_REQUIRE_NATIVE=1`. Under `RMQ_EVENTSTORE_PURE=1`
the native pass is switched on for the native store by hand, so the comparison runs in both passes of
`make test`.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.common.sysflag import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from rmq_eventstore.store import Message, MessageStore, PutMessageStatus
from rmq_eventstore.store import commitlog as commitlog_module
from rmq_eventstore.store import reput as reput_module
from tests.conftest import import_native, stop_reput_thread

_native = import_native()

GEOMETRY = {
    "mapped_file_size_commit_log": 16 * 1024,  # BLANK records at file ends
    "mapped_file_size_consume_queue": 10 * 20,  # a consume-queue file every 10 units
    "max_hash_slot_num": 16,
    "max_index_num": 40,  # an index file every 39 entries
}


class Twin:
    """A store dispatching with the native pass and its reference, fed the same requests pass by pass."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, **config: object) -> None:
        self.native_taken = 0  # records the native pass took (the rest went the Python way)
        self.singles = False  # dispatch hands every record over as a request alone (see dispatch)
        real = _native.dispatch_singles

        def counting(reput, ctx, here):  # noqa: ANN001, ANN202
            out = real(reput, ctx, here)
            self.native_taken += out[0]
            return out

        # set before the stores exist (MessageStore.__init__ calls set_fast_pass): on under RMQ_EVENTSTORE_PURE too
        monkeypatch.setattr(reput_module, "_dispatch_singles", counting)
        self.monkeypatch = monkeypatch
        self.fast = MessageStore.open(root / "fast", **GEOMETRY, **config)
        self.ref = MessageStore.open(root / "ref", **GEOMETRY, **config)
        for s in (self.fast, self.ref):
            stop_reput_thread(s.reput_message_service)
            # and the consume queues' flush thread: its rounds write the checkpoint's logics time back to the
            # value they read before flushing (as RocketMQ's FlushConsumeQueueService does), which made the two
            # stores' in-memory times differ for a moment (a CI failure: 7 ms apart)
            s.flush_consume_queue_service.shutdown()
        assert self.fast.reput_message_service._fast_ctx is not None
        self.ref.reput_message_service._fast_ctx = None
        self.heard: dict[str, list[dict]] = {"fast": [], "ref": []}
        self.fast.add_message_arriving_listener(lambda g: self.heard["fast"].append(dict(g)))
        self.ref.add_message_arriving_listener(lambda g: self.heard["ref"].append(dict(g)))

    def put(self, msg: Message) -> None:
        r = self.fast.put_message(msg)
        assert r.status == PutMessageStatus.PUT_OK, r
        stamp = r.append_result.store_timestamp
        with self.monkeypatch.context() as m:  # the reference stamped at the same millisecond: the two puts may
            m.setattr(commitlog_module, "now_ms", lambda: stamp)  # straddle one (its put then takes Python's path)
            r = self.ref.put_message(msg)
        assert r.status == PutMessageStatus.PUT_OK, r
        assert r.append_result.store_timestamp == stamp

    def dispatch(self, here: bool = True) -> int:
        """Dispatch everything on each store (`dispatch_here` until nothing is behind, or the thread's
        `do_reput`), the reference given the native store's requests. Returns how many records were taken.

        The two may cut what they take into passes differently (the native pass takes the single puts at
        the head and the Python pass the rest; the Python pass never mixes columns with requests): every
        record here has a UNIQ_KEY index entry, so no pass makes an index file no entry needs and the files
        do not depend on the cut."""
        fast, ref = self.fast.reput_message_service, self.ref.reput_message_service
        mine = list(fast._pending)
        theirs = list(ref._pending)
        assert [_span(c) for c in mine] == [_span(c) for c in theirs]  # same records, same places
        if self.singles:  # every record handed over as a single put hands it, whatever put it
            mine = _as_singles(self.fast, mine)
            fast._pending.clear()
            fast._pending.extend(mine)
            fast._pending_count = ref._pending_count = sum(1 for c in mine if c.__class__ is not tuple)
        ref._pending.clear()
        ref._pending.extend(mine)
        n = _drain(fast, here)
        with self.monkeypatch.context() as m:
            m.setattr(codec, "native", None)
            m.setattr(reput_module, "_take_requests", None)
            assert _drain(ref, here) == n
        return n

    def assert_same(self) -> None:
        """The files as mapped (nothing flushed: the page cache is what a crash leaves) and the state."""
        fast, ref = self.fast, self.ref
        cq_fast = tree_bytes(Path(fast.config.consume_queue_path))
        assert cq_fast == tree_bytes(Path(ref.config.consume_queue_path))
        assert [_index_bytes(f) for f in fast.index_service.files] == [_index_bytes(f) for f in ref.index_service.files]
        assert [_index_state(f) for f in fast.index_service.files] == [_index_state(f) for f in ref.index_service.files]
        assert fast.checkpoint.logics_msg_timestamp == ref.checkpoint.logics_msg_timestamp
        fs, rs = fast.reput_message_service, ref.reput_message_service
        assert (fs.reput_from_offset, fs.dispatched_offset, fs._pending_count, len(fs._pending)) == (
            rs.reput_from_offset, rs.dispatched_offset, rs._pending_count, len(rs._pending))
        assert _merged(self.heard["fast"]) == _merged(self.heard["ref"])
        for s in (fast, ref):  # what readers see: every queue's units point at the records
            for topic, queues in s.consume_queue_table.items():
                for qid, cq in queues.items():
                    assert cq._max_physic_offset == ref.consume_queue_table[topic][qid]._max_physic_offset

    def close(self) -> None:
        self.fast.shutdown()
        self.ref.shutdown()


def _drain(svc, here: bool) -> int:  # noqa: ANN001
    n = 0
    for _ in range(100):
        n += svc.dispatch_here() if here else svc.do_reput()
        if svc.behind() <= 0:
            return n
    raise AssertionError("dispatch does not catch up")


def _span(chunk: tuple) -> tuple[int, int]:
    """Where a hand-off chunk lies: (start, end, requests), or a single put's request alone."""
    return chunk[:2] if chunk.__class__ is tuple else (chunk[2], chunk[2] + chunk[3])


def _as_singles(store: MessageStore, chunks: list) -> list:
    """The hand-off chunks as one `DispatchRequest` per record (parsed back from the commit log, as the reput
    parses), BLANK chunks kept: what the records would have been handed over as by single puts."""
    out: list = []
    for c in chunks:
        if c.__class__ is tuple and not len(c[2]):
            out.append(c)
            continue
        a, b = _span(c)
        while a < b:
            start, buf = store.commit_log.get_data(a)
            r = codec.check_message_and_return_size(buf, 0, False, len(buf))
            buf.release()
            assert r.success and r.size > 0
            out.append(r.request)
            a += r.size
    return out


def _index_state(f) -> tuple:  # noqa: ANN001
    return (f._begin_timestamp, f._end_timestamp, f._begin_phy_offset, f._end_phy_offset, f._hash_slot_count,
            f._index_count, f._dirty)


def _index_bytes(f) -> bytes:  # noqa: ANN001
    return Path(f.path).read_bytes()


def _merged(heard: list[dict]) -> dict:
    """The listeners' news folded: each queue's last announced next offset (passes may announce in other
    groupings when the native pass stops early and the Python pass takes the rest)."""
    out: dict = {}
    for g in heard:
        out.update(g)
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def twin(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    t = Twin(tmp_path, monkeypatch)
    yield t
    t.close()


def _msg(rng: random.Random, i: int, topics: list[str], queues: int = 3) -> Message:
    keys = rng.choice([None, f"k{i}", f"a{i} b{i}  c{i}", " lead trail ", "ü" * (i % 3 + 1), ["x", "", f"y{i}"]])
    return Message(topic=rng.choice(topics), body=b"b" * rng.randint(1, 40), tags=rng.choice([None, "TagA", "t"]),
                   keys=keys, queue_id=rng.randrange(queues))


@pytest.mark.parametrize("singles", [False, True])
def test_single_passes_write_what_the_python_pass_writes(twin, singles):
    """One put, one pass (the broker's loop after a lone send), across consume-queue, index and commit log
    file rolls."""
    twin.singles = singles
    rng = random.Random(1)
    for i in range(160):
        twin.put(_msg(rng, i, ["TopicA", "TopicB"]))
        assert twin.dispatch() == 1
    twin.assert_same()
    assert twin.native_taken > 100  # most passes were the native one (file rolls go the Python way)
    assert len(twin.fast.index_service.files) > 3


@pytest.mark.parametrize(("here", "singles"), [(True, False), (False, False), (True, True), (False, True)])
def test_multi_record_passes_write_what_the_python_pass_writes(twin, here, singles):
    """Passes of 1 to 12 records over many queues (the dispatch thread's passes, `do_reput`, too)."""
    twin.singles = singles
    rng = random.Random(2)
    i = 0
    for _ in range(40):
        k = rng.randint(1, 12)
        for _ in range(k):
            twin.put(_msg(rng, i, ["T1", "T2", "T3"], queues=8))
            i += 1
        assert twin.dispatch(here) == k
    assert twin.fast.reput_message_service.behind() == 0
    twin.assert_same()
    assert twin.native_taken > i // 3


def test_index_full_and_wide_keys(twin):
    """Records with many keys fill index files mid-record (the rest of its entries go to the next file);
    keys of 2- and 4-byte characters (UTF-16 surrogate pairs in Java's hash)."""
    twin.singles = True
    rng = random.Random(3)
    for i in range(60):
        keys = [f"k{i}-{j}" for j in range(rng.randint(0, 9))]
        if i % 7 == 3:
            keys.append("wide\U0001f600key\u0416")
        twin.put(Message(topic="Full", body=b"x", keys=keys or None, queue_id=0))
        if rng.random() < 0.6:
            twin.dispatch()
    twin.dispatch()
    twin.assert_same()
    assert len(twin.fast.index_service.files) >= 5


def test_deleted_topic_and_transaction_records(twin):
    """Records of a topic put before its deletion get no unit (the Python pass, by its cutoff) and the topic
    made again after it gets its new queue; prepared and rolled-back records get no unit, rolled-back ones
    no index entry; a read-only queue gets nothing; all in passes shared with plain records, each record
    handed over as a single put hands it."""
    twin.singles = True
    for i in range(5):
        twin.put(Message(topic="Gone", body=b"g", keys=f"g{i}"))
        twin.put(Message(topic="Stay", body=b"s", keys=f"s{i}"))
    twin.dispatch()
    for i in range(3):
        twin.put(Message(topic="Gone", body=b"late", keys=f"late{i}"))
    for s in (twin.fast, twin.ref):
        assert s.delete_topic("Gone")
    twin.put(Message(topic="Stay", body=b"s2"))
    twin.put(Message(topic="Gone", body=b"again", keys="again"))
    twin.dispatch()
    for i in range(4):
        twin.put(Message(topic="Stay", body=b"s3", keys=f"s3-{i}"))
        twin.dispatch()
    for flag in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, 0x8):
        twin.put(Message(topic="Stay", body=b"t", keys=f"tx{flag}", sys_flag=flag))
        twin.put(Message(topic="Stay", body=b"after", keys=f"after{flag}"))
        twin.dispatch()
    for s in (twin.fast, twin.ref):
        s.consume_queue_table["Stay"][0].read_only = True
    twin.put(Message(topic="Stay", body=b"ro"))
    twin.put(Message(topic="Other", body=b"o"))
    twin.dispatch()
    for s in (twin.fast, twin.ref):
        s.consume_queue_table["Stay"][0].read_only = False
    twin.put(Message(topic="Other", body=b"o2"))
    twin.dispatch()
    # a cutoff over a record of a queue that exists (as a deletion's while its topic is made again)
    twin.put(Message(topic="Cut", body=b"c0"))
    twin.dispatch()
    twin.put(Message(topic="Other", body=b"o3"))
    twin.put(Message(topic="Cut", body=b"c1", keys="cut"))
    for s in (twin.fast, twin.ref):
        s.topic_deletions.cutoffs["Cut"] = s.commit_log.get_max_offset()
    twin.put(Message(topic="Other", body=b"o4"))
    n = twin.native_taken
    twin.dispatch()
    assert twin.native_taken == n + 1  # "o3"; the Python pass left "c1" out
    for s in (twin.fast, twin.ref):
        del s.topic_deletions.cutoffs["Cut"]
    twin.assert_same()
    assert twin.fast.get_max_offset_in_queue("Gone", 0) == 1


def test_index_turned_off(tmp_path, monkeypatch):
    t = Twin(tmp_path, monkeypatch, message_index_enable=False)
    try:
        rng = random.Random(4)
        for i in range(30):
            t.put(_msg(rng, i, ["NoIndex"]))
            t.dispatch()
        t.assert_same()
        assert t.native_taken >= 25 and not t.fast.index_service.files
    finally:
        t.close()


def _ok(r) -> None:  # noqa: ANN001
    assert r.status == PutMessageStatus.PUT_OK, r


def test_native_dispatch_here_clears_the_hold_when_nothing_is_left(tmp_path, monkeypatch):
    """The native pass clears `_signalled` only when nothing is behind after it (a put after that wakes the
    thread itself); when something is left (here: a record it does not take, a first put to a new queue,
    is behind an existing queue's record) the Python pass takes the rest in the same call."""
    monkeypatch.setattr(reput_module, "_dispatch_singles", _native.dispatch_singles)
    store = MessageStore.open(tmp_path, **GEOMETRY)
    svc = store.reput_message_service
    stop_reput_thread(svc)
    _ok(store.put_message(Message(topic="Held", body=b"a")))
    assert svc.do_reput() == 1
    svc._wakeup.clear()
    svc._signalled = False
    assert svc.hold_wakeups()
    _ok(store.put_message(Message(topic="Held", body=b"b")))
    assert not svc._wakeup.is_set()
    assert svc.dispatch_here() == 1
    assert not svc._signalled and not svc._wakeup.is_set()
    _ok(store.put_message(Message(topic="Held", body=b"c")))  # not held: wakes the thread
    assert svc._wakeup.is_set()
    assert svc.do_reput() == 1
    svc._wakeup.clear()
    svc._signalled = False
    assert svc.hold_wakeups()
    _ok(store.put_message(Message(topic="Held", body=b"d")))
    _ok(store.put_message(Message(topic="HeldNew", body=b"e")))
    assert svc.dispatch_here() == 2
    assert not svc._signalled and not svc._wakeup.is_set() and svc.behind() == 0
    assert store.get_max_offset_in_queue("Held", 0) == 4 and store.get_max_offset_in_queue("HeldNew", 0) == 1
    store.shutdown()


def test_gated_listeners_are_called_only_while_their_gate_is_open(twin):
    """`add_message_arriving_listener(when=(obj, attr))` is called only while the attribute is true, with
    `queues=` only when one of them grew; the native pass and the Python pass call the same ones with the same
    news (the ungated listener of the twin hears every pass)."""
    for topic, qid in (("Plain", 0), ("Timer", 0), ("Timer", 1)):
        twin.put(Message(topic=topic, body=b"first", queue_id=qid))
    twin.dispatch()
    calls: dict[str, list] = {"fast": [], "ref": []}
    gates = {}
    for name, s in (("fast", twin.fast), ("ref", twin.ref)):
        gates[name] = gate = type("Gate", (), {"waiting": 0})()
        s.add_message_arriving_listener(lambda g, n=name: calls[n].append(("when", g)), when=(gate, "waiting"))
        s.add_message_arriving_listener(lambda g, n=name: calls[n].append(("queues", g)), queues=[("Timer", 0)])
    steps = [("Plain", 0, 0), ("Plain", 0, 1), ("Timer", 1, 0), ("Timer", 0, 0), ("Timer", 0, 2), ("Plain", 0, 0)]
    for topic, qid, waiting in steps:
        for g in gates.values():
            g.waiting = waiting
        twin.put(Message(topic=topic, body=b"b", queue_id=qid))
        twin.dispatch()
    assert calls["fast"] == calls["ref"] == [
        ("when", {("Plain", 0): 3}), ("queues", {("Timer", 0): 2}), ("when", {("Timer", 0): 3}),
        ("queues", {("Timer", 0): 3})]
    assert twin.native_taken >= 6
    twin.assert_same()
