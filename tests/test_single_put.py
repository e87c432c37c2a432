"""The single put's native path (issue 16) against its pure-Python references, in one process.

`_native.append_one` (CommitLog's locked body of a single put, and its result objects) against
`CommitLog._append_one_py`; `_native.uniq_create` against `UniqueIdGenerator.create`'s fast path;
`_native.take_requests` against `ReputMessageService._take_pending`'s Python loop; and a whole store fed
single puts through the native path against one fed through the reference (same commitlog, consume-queue
and index bytes). The functions are called directly, so the file also runs (and compares) under
`RMQ_EVENTSTORE_PURE=1`, where the store itself takes the references.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import codec
from rmq_eventstore.common import message_id as message_id_module
from rmq_eventstore.common.codec import DispatchRequest
from rmq_eventstore.common.message import Message
from rmq_eventstore.common.message_id import UniqueIdGenerator
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store import commitlog as commitlog_module
from rmq_eventstore.store import reput as reput_module
from rmq_eventstore.store.commitlog import PutMessageResult
from tests.single_put_helpers import FIELDS, compare_single_puts, open_store, put_and_read, store_pair
from tests.single_put_helpers import native as _native


def _messages(n: int) -> list[Message]:
    """Plain messages of several sizes, queues, tags and keys, with and without a UNIQ_KEY of their own,
    and a few that are not plain (a properties string, a born host): the native path declines those."""
    out = []
    for i in range(n):
        m = Message(topic="TopicA" if i % 5 else "%RETRY%g-1", body=bytes([i % 251]) * (i * 37 % 700),
                    keys=None if i % 7 == 0 else (f"k{i} x{i % 3}" if i % 2 else [f"a{i}", "", f"b{i}"]),
                    tags=None if i % 3 else f"tag{i % 4}", queue_id=i % 3,
                    uniq_key=f"{i:032X}" if i % 11 == 0 else None)
        if i % 17 == 16:
            m.properties_string = f"KEYS\x01p{i}\x02WAIT\x01true\x02"
        if i % 23 == 22:
            m.born_host = "10.0.0.1:9"
        out.append(m)
    return out


def _store(path: Path) -> MessageStore:
    return open_store(path, auto_create_uniq_key=False)


def test_append_one_equals_the_reference(tmp_path: Path) -> None:
    """Put by put, `_native.append_one` writes what `_append_one_py` writes at the same store time (record
    bytes, write position, store timestamp, queue table, the request handed to `on_appended`) and declines
    exactly what it declines (a new queue, no room before the file's end, a message that is not plain),
    changing nothing then; its result objects are those `_append_one` builds from the reference's tuple."""
    with store_pair(tmp_path, auto_create_uniq_key=False) as (a, b):
        puts = compare_single_puts(
            a, b, _messages(400),
            lambda cl, m: _native.append_one(cl, m, None, cl.encoder.plain_context(), cl.file_size),
            lambda cl, m: cl._append_one_py(m, None))
        assert 30 < puts.count(None) < 200  # new queues, file ends and the messages that are not plain all came up
        assert len(a.commit_log.mapped_file_queue.mapped_files) > 3  # the files rolled


def test_a_store_fed_single_puts_natively_equals_the_reference(tmp_path: Path, monkeypatch) -> None:
    """Whole stores: single puts through `put_message` with the native put and hand-off walk, and with both
    switched off (the references), leave the same records (all fields but the clock's), the same
    consume-queue bytes and index answers, across file rolls, new queues and messages that are not plain."""
    msgs = _messages(300)

    keys = [k for i in range(len(msgs)) for k in (f"k{i}", f"a{i}", f"b{i}", f"p{i}")]

    def uniq_created(i: int, m: Message, r: PutMessageResult) -> None:
        assert (r.append_result.uniq_keys[0] is not None) == (m.properties_string is None), i

    def run(name: str) -> tuple[list, dict, dict]:
        # UNIQ_KEYs created (C fast path, or create()): keys differ
        return put_and_read(tmp_path / name, msgs, lambda m: tuple(getattr(m, f) for f in FIELDS), keys,
                            ("TopicA", "%RETRY%g-1"), check=uniq_created)

    a = run("native")
    monkeypatch.setattr(commitlog_module, "native_put_one", None)  # put_message's native path in one call
    monkeypatch.setattr(commitlog_module, "_native_append_one", None)
    monkeypatch.setattr(commitlog_module, "_native_uniq", None)
    monkeypatch.setattr(reput_module, "_take_requests", None)
    b = run("ref")
    strip = [(*r[:-1], "\x02".join(p for p in r[-1].split("\x02") if not p.startswith("UNIQ_KEY\x01"))) for r in a[0]]
    strip_b = [(*r[:-1], "\x02".join(p for p in r[-1].split("\x02") if not p.startswith("UNIQ_KEY\x01"))) for r in b[0]]
    assert len(a[0]) == len(msgs) and strip == strip_b
    assert a[1] == b[1] and len(a[1]) > 3
    assert a[2] == b[2] and len(a[2]) > 100


def _gen_state(g: UniqueIdGenerator) -> tuple:
    return g._time, g._time_used, g._counter, g._head, g._head_time


def test_uniq_create_is_create_fast_path(monkeypatch) -> None:
    """`_native.uniq_create` issues the id `create()` issues from the same state and leaves the same state;
    it declines (None, state untouched) where `create()` must claim more than one millisecond's text: a new
    millisecond outside the generator's month (here: no month yet), or 65536 ids issued in the millisecond.
    Real ids from it are unique and well formed. (`create()` itself is the Python method here: it takes the
    C fast path too when the native core is there.)"""
    monkeypatch.setattr(message_id_module, "_native_uniq", None)
    far = 1 << 60  # a millisecond ahead of the clock: `now > _time` never fires, the state decides alone
    for counter, used, head_time in ((0, 0, far), (0xFFFF, 5, far), (17, 0xFFFF, far), (3, 0x10000, far),
                                     (3, 0, far - 1)):
        a, b = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7), UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
        for g in (a, b):
            g._time, g._time_used, g._counter, g._head, g._head_time = far, used, counter, "AB" * 14, head_time
        before = _gen_state(a)
        got = _native.uniq_create(a)
        if head_time != far or used >= 0x10000:
            assert got is None and _gen_state(a) == before
            continue
        assert got == b.create() and _gen_state(a) == _gen_state(b)
    g = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    ids, fast = [], 0
    for _ in range(20000):
        i = _native.uniq_create(g)
        fast += i is not None
        ids.append(i or g.create())  # as the put path: create() claims each new millisecond
    assert len(set(ids)) == len(ids) and all(len(i) == 32 and i == i.upper() for i in ids)
    assert fast > 10000  # the fast path is taken
    assert fast == 20000 - 1  # only the first id (no month yet) is claimed by create()


class _FrozenClock:
    """`time` for message_id's Python path: time() answers one millisecond (`ms`, mid-millisecond)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def time(self) -> float:
        return (self.ms + 0.5) / 1000


def _uniq_pair(ip: bytes, state: tuple) -> tuple[UniqueIdGenerator, UniqueIdGenerator]:
    """Two generators alike (salt, counter and clock state): one for the C path, one for the reference."""
    a = UniqueIdGenerator(ip=ip, pid=7)
    b = UniqueIdGenerator(ip=ip, pid=7)
    b._prefix = a._prefix
    for g in (a, b):
        g._time, g._time_used, g._counter, g._head, g._head_time, g._month_start, g._next_month = state
    return a, b


def _full_state(g: UniqueIdGenerator) -> tuple:
    return (g._time, g._time_used, g._counter, g._head, g._head_time, g._month_start, g._next_month, g._prefix)


def _reference_create(monkeypatch, g: UniqueIdGenerator, now: int) -> str:
    """`UniqueIdGenerator.create` in Python (its fast path, else `_claim(1)`) with the clock at `now` ms."""
    monkeypatch.setattr(message_id_module, "_native_uniq", None)
    monkeypatch.setattr(message_id_module, "time", _FrozenClock(now))
    try:
        return g.create()
    finally:
        monkeypatch.undo()


_IPS = st.sampled_from([b"\x0a\x00\x00\x01", bytes(range(16))])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ip=_IPS, month=st.integers(0, 1200), into=st.integers(-3, 40 * 86_400_000),
       head_back=st.sampled_from([0, 1, 2, 1000, 1 << 40, None]), used=st.sampled_from([0, 1, 0xFFFE, 0xFFFF, 0x10000]),
       counter=st.integers(0, 0xFFFF), from_end=st.one_of(st.none(), st.integers(-2, 1)))
def test_uniq_create_new_millisecond_equals_claim(monkeypatch, ip, month, into, head_back, used, counter,
                                                  from_end) -> None:
    """A millisecond ahead of the clock (so `now > _time` never fires and the state alone decides): from the
    same state `_native.uniq_create` issues the id `create()` / `_claim(1)` issues and leaves the same slots,
    including a new millisecond's `_head` and `_head_time`, across real month boundaries (the month of
    `_roll_month`, months of 28 to 31 days, `into` ms past its start or `from_end` ms from its end: past its
    end the month rolls). It declines, changing nothing, exactly at a month roll or with 65536 ids issued in
    the millisecond."""
    import datetime as dt

    base = dt.datetime(2300, 1, 1) + dt.timedelta(days=31 * month)
    g0 = UniqueIdGenerator(ip=ip, pid=7)
    g0._roll_month(int(base.timestamp() * 1000))
    t = g0._month_start + into if from_end is None else g0._next_month + from_end  # or at the month's end
    head_time = -1 if head_back is None else t - head_back
    a, b = _uniq_pair(ip, (t, used, counter, "CD" * 14, head_time, g0._month_start, g0._next_month))
    before = _full_state(a)
    got = _native.uniq_create(a)
    rolls = head_time != t and not (g0._month_start <= t < g0._next_month)
    if rolls or used >= 0x10000:
        assert got is None and _full_state(a) == before
        return
    assert got is not None
    want = _reference_create(monkeypatch, b, 0)  # the clock far behind _time: only the state counts
    assert got == want and _full_state(a) == _full_state(b)
    if head_time != t:  # the new head: prefix + ms since the month's start
        assert a._head == a._prefix + f"{(t - g0._month_start) & 0xFFFFFFFF:08X}" and a._head_time == t


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ip=_IPS, behind=st.integers(1, 10**9), head_back=st.sampled_from([0, 1, 5000, None]),
       used=st.sampled_from([0, 7, 0xFFFF, 0x10000]), counter=st.integers(0, 0xFFFF),
       month_around=st.booleans())
def test_uniq_create_with_the_clock_moving_equals_create(monkeypatch, ip, behind, head_back, used, counter,
                                                         month_around) -> None:
    """The real clock ahead of `_time` (`now > _time`: the counter of a new millisecond restarts): the C path
    reads the clock once, and `create()` with the clock stopped at the millisecond C stamped (its `_time`
    afterwards) issues the same id and leaves the same slots. The generator's month holds the clock (or,
    with `month_around` false, ends before it: a month roll, declined with nothing changed)."""
    import time as real_time

    now0 = int(real_time.time() * 1000)
    t = now0 - behind
    head_time = -1 if head_back is None else t - head_back
    ms0, ms1 = (now0 - 2 * 10**9, now0 + 10**9) if month_around else (now0 - 2 * 10**9, now0 - 1)
    a, b = _uniq_pair(ip, (t, used, counter, "EF" * 14, head_time, ms0, ms1))
    before = _full_state(a)
    got = _native.uniq_create(a)
    if not month_around:
        assert got is None and _full_state(a) == before
        return
    assert got is not None and now0 <= a._time <= int(real_time.time() * 1000) and a._time_used == 1
    assert got == _reference_create(monkeypatch, b, a._time) and _full_state(a) == _full_state(b)
    assert a._head_time == a._time and a._head == a._prefix + f"{(a._time - ms0) & 0xFFFFFFFF:08X}"


def test_uniq_create_threads_issue_unique_ids() -> None:
    """Threads sharing one generator through the put path (`uniq_create`, else `create()`, both under the
    generator's lock) issue unique, well-formed ids."""
    g = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    out: list[list[str]] = [[] for _ in range(4)]

    def work(k: int) -> None:
        for _ in range(15000):
            out[k].append(_native.uniq_create(g) or g.create())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids = [i for ids in out for i in ids]
    assert len(set(ids)) == len(ids) == 60000 and all(len(i) == 32 and i == i.upper() for i in ids)


class _DictGenerator:
    """A generator-shaped object whose fields are plain attributes, not UniqueIdGenerator's slots."""

    def __init__(self, far: int) -> None:
        self._lock = threading.Lock()
        self._time, self._time_used, self._counter, self._head, self._head_time = far, 0, 5, "AB" * 14, far


def test_uniq_create_reads_the_generators_slots_and_declines_other_shapes() -> None:
    """`uniq_create` reads and writes UniqueIdGenerator's slots by offset (a subclass's too); an object with
    the same fields as plain attributes, or with a slot unset, is declined (None, nothing changed), so the
    put path falls back to `create()`."""
    far = 1 << 60

    class Sub(UniqueIdGenerator):
        __slots__ = ("extra",)

    for g in (UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7), Sub(ip=b"\x0a\x00\x00\x01", pid=7)):
        g._time, g._time_used, g._counter, g._head, g._head_time = far, 0, 5, "AB" * 14, far
        assert _native.uniq_create(g) == "AB" * 14 + "0005"
        assert _gen_state(g) == (far, 1, 6, "AB" * 14, far)
    d = _DictGenerator(far)
    assert _native.uniq_create(d) is None and _gen_state(d) == (far, 0, 5, "AB" * 14, far)
    assert _native.uniq_create(UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)) is None  # no head yet: create()
    g = UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)
    g._time, g._time_used, g._counter, g._head_time = far, 0, 5, far
    del g._head
    assert _native.uniq_create(g) is None
    assert _native.uniq_create(UniqueIdGenerator(ip=b"\x0a\x00\x00\x01", pid=7)) is None  # after a declined type


class _Cols(codec.DispatchColumns):
    """A stand-in for a columns chunk (only its class matters to the walk)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_take_requests_walks_as_the_python_loop(monkeypatch) -> None:
    """`_take_pending` with `_native.take_requests` takes the same chunks, requests and offsets as its Python
    loop: runs of single-put chunks (tuples, or a DispatchRequest alone as notify_appended keeps them) and
    batch chunks (lists), stopping at a gap, a chunk past the limit, a BLANK (no requests), columns, and the
    batch limit."""
    from rmq_eventstore.store.reput import ReputMessageService

    def chunks() -> list:
        out, off = [], 100
        for i in range(60):
            if i in (7, 30):
                out.append((off, off + 50, []))  # a BLANK
                off += 50
                continue
            if i == 20:
                off += 3  # a gap: parsed back from the commitlog, not taken
            n = 1 if i % 4 else 3
            if n == 1 and i % 3 == 0:  # a request alone: it starts at its commit_log_offset, msg_size long
                out.append(tuple.__new__(DispatchRequest, ("t", 0, off, 10, 0, 0, i, None, None, 0, 0, "")))
                off += 10
                continue
            reqs = tuple(("r", off + j) for j in range(n)) if n == 1 else [("r", off + j) for j in range(n)]
            out.append((off, off + 10 * n, reqs))
            off += 10 * n
        return out

    def walk(native: bool, limit: int, batch: int) -> list:
        monkeypatch.setattr(reput_module, "_take_requests", _native.take_requests if native else None)
        monkeypatch.setattr(reput_module, "MAX_BATCH", batch)
        svc = ReputMessageService.__new__(ReputMessageService)
        svc._pending = collections.deque(chunks())
        svc._pending_count = sum(len(c[2]) if c.__class__ is tuple else 1 for c in svc._pending)
        svc.reput_from_offset = 100
        steps = []
        for _ in range(12):
            got = svc._take_pending(limit)
            steps.append((list(got), svc.reput_from_offset, svc._pending_count, len(svc._pending)))
            if svc._pending and reput_module._chunk_start(svc._pending[0]) != svc.reput_from_offset:
                svc.reput_from_offset = reput_module._chunk_start(svc._pending[0])  # what a parse of the gap would do
        return steps

    for limit in (10 ** 9, 700):
        for batch in (8192, 5):
            assert walk(True, limit, batch) == walk(False, limit, batch)
    cols = collections.deque([(0, 10, ("a",)), (10, 20, ("b",)), (20, 30, _Cols(2)), (30, 40, ("c",))])
    out: list = []
    assert _native.take_requests(cols, cols.popleft, 0, 100, 10, out) == (20, 2) and out == ["a", "b"]
    assert len(cols) == 2  # stopped at the columns


def test_append_one_hands_off_as_notify_appended(tmp_path: Path, monkeypatch) -> None:
    """When `on_appended` is a reput service's `notify_appended`, `append_one` does the hand-off itself: the
    service's pending chunks, count, wake-up flag and event end as the method leaves them, below and at
    MAX_PENDING, with the flag set and clear."""
    from rmq_eventstore.store import reput as reput_module

    s = _store(tmp_path / "s")
    try:
        cl = s.commit_log
        svc = s.reput_message_service
        svc.shutdown()  # nothing takes the chunks: they stay to be compared
        ref = reput_module.ReputMessageService.__new__(reput_module.ReputMessageService)
        msgs = [m for m in _messages(40) if m.properties_string is None and m.born_host is None]
        for m in msgs[:8]:
            assert s.put_message(m).is_ok()  # the queues exist: the native path takes the rest
        taken = 0
        for i, m in enumerate(msgs[8:]):
            full = i % 5 == 4
            for x in (svc, ref):
                x._pending = collections.deque()
                x._pending_count = reput_module.MAX_PENDING if full else i
                x._signalled = bool(i % 2)
                x._wakeup = __import__("threading").Event()
            with cl.put_lock:
                res = _native.append_one(cl, m, None, cl.encoder.plain_context(), cl.file_size)
            if res is None:  # the file's end: the general path rolls it
                assert s.put_message(m).is_ok()
                continue
            taken += 1
            a = res.append_result
            # a chunk of one request is kept as the request alone (one object waits per single put)
            assert not svc._pending or svc._pending[0].__class__ is DispatchRequest
            ref.notify_appended(a.wrote_offset, a.wrote_offset + a.wrote_bytes, (svc._pending[0],) if svc._pending
                                else (None,))
            assert list(svc._pending) == list(ref._pending)
            assert (svc._pending_count, svc._signalled, svc._wakeup.is_set()) == \
                   (ref._pending_count, ref._signalled, ref._wakeup.is_set())
            assert full == (not svc._pending)
        assert taken > 20
    finally:
        s.shutdown()


def test_append_one_raises_what_on_appended_raises_as_the_reference(tmp_path: Path) -> None:
    """A hand-off that raises propagates out of both implementations after the same writes (the record is in
    the file, the queue offset taken), and the store goes on putting."""
    with store_pair(tmp_path, auto_create_uniq_key=False) as (a, b):
        msgs = [m for m in _messages(30) if m.properties_string is None and m.born_host is None]
        for m in msgs[:6]:
            assert a.put_message(m).is_ok() and b.put_message(m).is_ok()

        def boom(start: int, end: int, reqs: tuple) -> None:
            raise RuntimeError("hand-off failed")

        for s in (a, b):
            s.commit_log.on_appended = boom
        cla, clb = a.commit_log, b.commit_log
        with pytest.raises(RuntimeError, match="hand-off failed"):
            with cla.put_lock:
                _native.append_one(cla, msgs[6], None, cla.encoder.plain_context(), cla.file_size)
        with pytest.raises(RuntimeError, match="hand-off failed"):
            clb._append_one_py(msgs[6], None)
        assert cla.topic_queue_table == clb.topic_queue_table
        mfa, mfb = cla.mapped_file_queue.mapped_files[-1], clb.mapped_file_queue.mapped_files[-1]
        assert mfa.wrote_position == mfb.wrote_position
        assert (cla.begin_time_in_lock != 0) == (clb.begin_time_in_lock != 0)
        for s in (a, b):
            s.commit_log.begin_time_in_lock = 0
            s.commit_log.on_appended = s.reput_message_service.notify_appended
            assert s.put_message(msgs[7]).is_ok()
            assert s.wait_for_dispatch(10)  # the failed hand-off's record is parsed back from the file
        for topic in ("TopicA", "%RETRY%g-1"):
            for q in range(3):
                assert a.get_max_offset_in_queue(topic, q) == b.get_max_offset_in_queue(topic, q)
        assert sum(a.get_max_offset_in_queue(t, q) for t in ("TopicA", "%RETRY%g-1") for q in range(3)) == 8


def test_put_one_takes_and_releases_its_locks_as_threading_does(tmp_path: Path) -> None:
    """`_native.put_one` takes the put lock and the UniqueIdGenerator's lock without calling their methods
    when they are free: a put leaves both free, waits while another thread holds either, and releases the
    put lock when the hand-off raises; the locks work with `with` / acquire() / release() as before."""
    import threading
    import time

    if commitlog_module.native_put_one is None:
        pytest.skip("the store runs its pure-Python loops (RMQ_EVENTSTORE_PURE=1)")
    s = open_store(tmp_path / "s")
    try:
        cl = s.commit_log
        msgs = [Message(topic="TopicL", body=b"x" * 50, keys=f"k{i}", queue_id=0) for i in range(6)]
        assert s.put_message(msgs[0]).is_ok()  # a new queue: the general path
        for lock in (cl.put_lock, cl.uniq_ids._lock):
            r = s.put_message(msgs[1])
            assert r.is_ok() and r.append_result.uniq_keys[0] is not None
            assert not cl.put_lock.locked() and not cl.uniq_ids._lock.locked()
            held = threading.Event()

            def hold(lock: threading.Lock = lock, held: threading.Event = held) -> None:
                with lock:
                    held.set()
                    time.sleep(0.3)

            t = threading.Thread(target=hold)
            t.start()
            assert held.wait(5)
            t0 = time.monotonic()
            r = s.put_message(msgs[2])  # waits for the other thread's release
            waited = time.monotonic() - t0
            t.join()
            assert r.is_ok() and waited > 0.15, waited
            assert not lock.locked() and lock.acquire(blocking=False)
            lock.release()

        def boom(start: int, end: int, reqs: tuple) -> None:
            raise RuntimeError("hand-off failed")

        cl.on_appended = boom
        with pytest.raises(RuntimeError, match="hand-off failed"):
            s.put_message(msgs[3])
        assert not cl.put_lock.locked()
        cl.on_appended = s.reput_message_service.notify_appended
        cl.begin_time_in_lock = 0  # the failed put's stamp (as the Python reference leaves it)
        assert s.put_message(msgs[4]).is_ok() and not cl.put_lock.locked()
        assert s.wait_for_dispatch(10)
        assert s.get_max_offset_in_queue("TopicL", 0) == 7  # 1 + 2 + 2 + the failed hand-off's + 1
    finally:
        s.shutdown()


def test_network_puts_keep_queues_apart_whose_keys_share_a_cache_slot(tmp_path: Path) -> None:
    """The native network put caches the queue table's `topic-queue` keys by queue id modulo 64: topics
    and queue ids that share a slot (1, 65, 129; two topics) still count their own queue offsets."""
    s = open_store(tmp_path / "s", auto_create_uniq_key=False)
    try:
        want: collections.Counter = collections.Counter()
        for i in range(240):
            topic, qid = ("TopicA", "TopicB")[i // 3 % 2], (1, 65, 129)[i % 3]
            m = Message(topic=topic, body=b"x" * (i % 50), queue_id=qid,
                        properties_string=f"KEYS\x01k{i}\x02UNIQ_KEY\x01{i:032X}\x02")
            r = s.put_message(m)
            assert r.is_ok(), (i, r)
            assert r.append_result.logics_offset == want[(topic, qid)], (i, topic, qid)
            want[(topic, qid)] += 1
        assert s.commit_log.topic_queue_table == {f"{t}-{q}": n for (t, q), n in want.items()}
    finally:
        s.shutdown()
