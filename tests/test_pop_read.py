"""THE POP READ (`_native.pop_read`, PopService.pop_now's read of one queue) against its reference, the calls it
replaces: `ConsumeQueue.get_units_raw` + `_native.read_runs` with the memory floor and min physical offset pop_now
passes and `MessageStore._file_span`. A store of small files (several consume-queue and commitlog files) is read at
every kind of offset and batch size with limits that cut by count, by bytes in memory and on disk; the commitlog's
first file unavailable, a last file with a write buffer (transient), fields the C does not take (declined: None,
the caller then takes the reference's `read_for_pop`). Also in PURE_TESTS: the C functions are called directly either way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import Message
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store.message_store import MAX_PULL_MSG_SIZE
from tests.conftest import import_native

_native = import_native()

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 100,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
N = 450  # ~170 KiB of records: three commitlog files; five consume-queue files of queue 0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MessageStore]:
    path: Path = tmp_path_factory.mktemp("pop-read")
    s = MessageStore.open(path, **SMALL)
    for i in range(0, N, 50):  # bodies of varied sizes; queue 1 gets every 7th, so queue 0's records have gaps
        s.put_messages([Message("jobs", bytes([65 + (i + k) % 26]) * (100 + 37 * ((i + k) % 11)), tags="t",
                                queue_id=1 if (i + k) % 7 == 0 else 0) for k in range(50)])
    assert s.wait_for_dispatch()
    yield s
    s.shutdown()


def reference(s: MessageStore, cq, offset: int, want: int, total_ram: int, ratio: int,
              limits: tuple[int, int, int, int]) -> tuple | None:
    """pop_now's read without THE POP READ: get_units_raw, then read_runs as pop_now calls it."""
    units = cq.get_units_raw(offset, want)
    if not units:
        return None
    cl = s.commit_log
    return _native.read_runs(units, offset, want, MAX_PULL_MSG_SIZE, cl.get_max_offset() - total_ram * ratio // 100,
                             *limits, cl.get_min_offset(), s._file_span)


def both(s: MessageStore, queue_id: int, offset: int, want: int, total_ram: int = 1 << 34, ratio: int = 40,
         limits: tuple[int, int, int, int] = (256 * 1024, 256, 64 * 1024, 32)) -> tuple | None:
    cq = s.find_consume_queue("jobs", queue_id, create=False)
    ref = reference(s, cq, offset, want, total_ram, ratio, limits)
    got = _native.pop_read(cq, offset, want, s.commit_log, MAX_PULL_MSG_SIZE, total_ram, ratio, *limits)
    assert got == ref, (queue_id, offset, want, total_ram, ratio, limits)
    return got


def test_every_offset_and_batch(store: MessageStore) -> None:
    cq0 = store.find_consume_queue("jobs", 0, create=False)
    assert len(cq0.mapped_file_queue.mapped_files) >= 3 and len(store.commit_log.mapped_file_queue.mapped_files) >= 3
    found = 0
    for q in (0, 1):
        top = store.find_consume_queue("jobs", q, create=False).get_max_offset_in_queue()
        for offset in range(-1, top + 2):
            for want in (1, 2, 3, 32, 1024):
                r = both(store, q, offset, want)
                found += r is not None and r[0] == 2
    assert found > 1000


@settings(max_examples=300, deadline=None)
@given(q=st.sampled_from([0, 1]), offset=st.integers(-5, 420), want=st.integers(1, 300),
       total_ram=st.sampled_from([0, 1000, 50_000, 120_000, 1 << 34]), ratio=st.integers(0, 100),
       mem=st.tuples(st.integers(1, 40_000), st.integers(1, 300)), disk=st.tuples(st.integers(1, 40_000),
                                                                                  st.integers(1, 300)))
def test_limits(store: MessageStore, q: int, offset: int, want: int, total_ram: int, ratio: int,
                mem: tuple[int, int], disk: tuple[int, int]) -> None:
    """Count and byte limits in memory and on disk (the memory floor moved by total_ram * ratio)."""
    both(store, q, offset, want, total_ram, ratio, (*mem, *disk))


def test_first_file_unavailable_and_transient(store: MessageStore) -> None:
    """min_phy rolled past an unavailable first commitlog file (MESSAGE_WAS_REMOVING for its records); a last file
    read up to its committed position (a write buffer), in the consume queue and in the commitlog."""
    cl_files = store.commit_log.mapped_file_queue.mapped_files
    first = cl_files[0]
    first.available = False
    try:
        for offset in (0, 1, 5, 100, 150, 300):
            r = both(store, 0, offset, 32)
            assert r is not None
        assert both(store, 0, 0, 32)[0] == 1
    finally:
        first.available = True
    cq = store.find_consume_queue("jobs", 0, create=False)
    for mf in (cq.mapped_file_queue.mapped_files[-1], cl_files[-1]):
        mf.transient = True
        mf.committed_position = mf.wrote_position - 200
        try:
            for offset in (0, 150, 300, 360, 370, 380, 385):
                both(store, 0, offset, 64)
        finally:
            mf.transient = False
            mf.committed_position = mf.wrote_position


def test_declines(store: MessageStore) -> None:
    """What the C does not take is None (the caller then takes read_for_pop): arguments that are not exact ints,
    consume-queue fields of another type, a released view; and what the reference finds no units for."""
    cq = store.find_consume_queue("jobs", 0, create=False)
    cl = store.commit_log
    args = [MAX_PULL_MSG_SIZE, 1 << 34, 40, 256 * 1024, 256, 64 * 1024, 32]
    assert _native.pop_read(cq, 3, 4, cl, *args) is not None
    assert _native.pop_read(cq, 3.0, 4, cl, *args) is None
    assert _native.pop_read(cq, True, 4, cl, *args) is None
    assert _native.pop_read(cq, 3, 4, cl, MAX_PULL_MSG_SIZE, 1 << 34, 101, *args[3:]) is None
    assert _native.pop_read(cq, 3, 0, cl, *args) is None and cq.get_units_raw(3, 0) == b""
    assert _native.pop_read(cq, 10_000, 4, cl, *args) is None and cq.get_units_raw(10_000, 4) == b""
    saved = cq._min_logic_offset
    try:
        cq._min_logic_offset = 20 * 10
        assert _native.pop_read(cq, 9, 4, cl, *args) is None and cq.get_units_raw(9, 4) == b""
        assert _native.pop_read(cq, 10, 4, cl, *args) == reference(store, cq, 10, 4, 1 << 34, 40, tuple(args[3:]))
        cq._min_logic_offset = float(saved)
        assert _native.pop_read(cq, 10, 4, cl, *args) is None
    finally:
        cq._min_logic_offset = saved
    mf = cq.mapped_file_queue.mapped_files[0]
    view = mf.view
    try:
        mf.view = memoryview(b"")  # a closed file's view: the reference's units are b"" too
        assert _native.pop_read(cq, 3, 4, cl, *args) is None and cq.get_units_raw(3, 4) == b""
        mf.view = memoryview(bytes(view[:20 * 5 + 7]))  # shorter than the read position: the slice stops there
        both(store, 0, 2, 10)
        released = memoryview(b"x" * 4000)
        released.release()
        mf.view = released
        assert _native.pop_read(cq, 3, 4, cl, *args) is None
    finally:
        mf.view = view
    with pytest.raises(TypeError):
        _native.pop_read(cq, 3, 4, cl)


def test_queue_max(store: MessageStore, tmp_path: Path) -> None:
    """`_native.queue_max` against ConsumeQueue.get_max_offset_in_queue: several files, a last file read up to its
    committed position, a queue without files, and fields it does not take (None: the caller calls the method)."""
    for q in (0, 1):
        cq = store.find_consume_queue("jobs", q, create=False)
        assert _native.queue_max(cq) == cq.get_max_offset_in_queue() > 0
    cq = store.find_consume_queue("jobs", 0, create=False)
    last = cq.mapped_file_queue.mapped_files[-1]
    last.transient = True
    last.committed_position = last.wrote_position - 60
    try:
        assert _native.queue_max(cq) == cq.get_max_offset_in_queue() == store.find_consume_queue(
            "jobs", 0, create=False).get_max_offset_in_queue()
        last.committed_position = 7  # not a whole unit: floor division, as the method
        assert _native.queue_max(cq) == cq.get_max_offset_in_queue()
        last.transient = 1  # not a bool: the method decides
        assert _native.queue_max(cq) is None
    finally:
        last.transient = False
        last.committed_position = last.wrote_position
    with MessageStore.open(tmp_path / "empty", **SMALL) as empty:
        ecq = empty.find_consume_queue("jobs", 0)
        assert ecq.mapped_file_queue.mapped_files == []
        assert _native.queue_max(ecq) == ecq.get_max_offset_in_queue() == 0
    files = cq.mapped_file_queue.mapped_files
    try:
        cq.mapped_file_queue.mapped_files = tuple(files)  # not a list: the method decides
        assert _native.queue_max(cq) is None
    finally:
        cq.mapped_file_queue.mapped_files = files
    assert _native.queue_max(object()) is None


def test_queue_live(store: MessageStore, tmp_path: Path) -> None:
    """`_native.queue_live` against `queue_live_py` (pop_now's list of the queues to read): every rotation of plans
    over present, empty, missing queues and topics, with a retry entry first or last; declines before anything."""
    from rmq_eventstore.broker.pop_service import queue_live_py

    with MessageStore.open(tmp_path / "other", **SMALL) as other:
        other.put_messages([Message("jobs", b"x", queue_id=3), Message("%RETRY%g_jobs", b"r", queue_id=0)])
        assert other.wait_for_dispatch()
        other.find_consume_queue("jobs", 5)  # a queue the store made, empty
        for s in (store, other):
            table = s.consume_queue_table
            normal = [("jobs", i, False) for i in range(8)]
            for plan in (normal, [("%RETRY%g_jobs", 0, True), *normal], [*normal, ("%RETRY%g_jobs", 0, True)],
                         [("gone", 0, False), ("jobs", 1, False)], [], [("jobs", 0, False)]):
                for first in range(max(len(plan), 1)):
                    got = _native.queue_live(table, plan, first)
                    assert got == queue_live_py(table, plan, first)
                    assert all(entry[3] is table[entry[0]][entry[1]] for entry in got)
            assert [e[:2] for e in _native.queue_live(table, normal, 2)] == [
                e[:2] for e in queue_live_py(table, normal, 2)] != []
    table = store.consume_queue_table
    for bad in ((table, (("jobs", 0, False),), 0), (table, [["jobs", 0, False]], 0), (table, [("jobs", 0)], 0),
                (table, [("jobs", "0", False)], 0), (dict(table).items(), [("jobs", 0, False)], 0),
                (table, [("jobs", 0, False)], 1), (table, [("jobs", 0, False)], -1), (table, [], 1),
                (table, [("jobs", 0, False)], 0.0), ({"jobs": list(table["jobs"].values())}, [("jobs", 0, False)], 0)):
        assert _native.queue_live(*bad) is None


@settings(max_examples=200, deadline=None)
@given(start=st.one_of(st.integers(0, 2000), st.sampled_from([9, 90, 95, 99, 990, 999, 9990, 99_990, 10**12 - 7,
                                                              10**15 - 3])),
       n=st.integers(1, 40))
def test_register_and_settle_texts(tmp_path_factory: pytest.TempPathFactory, start: int, n: int) -> None:
    """The offsets' texts pop_register and ack_settle write (msgOffsetInfo, the journal's C and A lines) are
    `",".join(map(str, range(...)))`, their digits counted up across every 9 -> 10 carry."""
    import os
    from collections import deque

    from rmq_eventstore.broker.pop_buffer import _Entry
    from rmq_eventstore.common.pop import PopCheckPoint

    path = tmp_path_factory.mktemp("texts") / "journal"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        by_key: dict = {}
        got = _native.pop_register(PopCheckPoint, _Entry, deque, by_key, {}, ("g", "t", 1), fd, "g", "t", 1, start,
                                   start + n, 5, 60_000, "b", 2, 10_000, 500, True)
        run = ",".join(map(str, range(start, start + n)))
        assert got[2:] == (f"1 1 {start}", f"1 1 {run}")
        line = f"C g t 1 {start} 5 60000 2 {start + n} {','.join(map(str, range(n)))}\n"
        assert path.read_text() == line
        if n <= 62:
            assert _native.ack_settle(by_key, ("g", "t", 1, start, 5), start, start + n, fd) == (
                len(f"A g t 1 {start} 5 {run}\n"), True)
            assert path.read_text() == line + f"A g t 1 {start} 5 {run}\n"
    finally:
        os.close(fd)


class _SlotEntry:
    """pop_buffer's pure-Python `_Entry` layout (its __slots__, no PopEntry base): what pop_register fills by name."""

    __slots__ = ("ck", "revive_qid", "next_offset", "acked", "full", "stored", "flush_at", "contiguous")


def _fields(e: object) -> tuple:
    vals = tuple(getattr(e, f) for f in ("next_offset", "acked", "full", "stored", "contiguous", "revive_qid",
                                         "flush_at", "ck"))
    return vals, [type(v).__name__ for v in vals], [type(v).__name__ for v in vars(vals[-1]).values()]


@settings(max_examples=150, deadline=None)
@given(start=st.integers(0, 10**12), n=st.integers(1, 70), pop_time=st.integers(0, 2**41),
       invisible=st.integers(1, 10**6), retry=st.booleans(),
       acks=st.lists(st.tuples(st.integers(-3, 72), st.integers(1, 8)), max_size=12), touch=st.booleans())
def test_pop_entry_is_the_slot_entry(tmp_path_factory: pytest.TempPathFactory, start: int, n: int, pop_time: int,
                                     invisible: int, retry: bool, acks: list, touch: bool) -> None:
    """THE POP ENTRY: pop_register with pop_buffer's `_Entry` on the native PopEntry (the checkpoint kept as its
    fields, made when first read) and with the pure layout (a PopCheckPoint and every field set by name) registers
    the same: same answer, journal bytes, _by_key keys, queue, field values and types, checkpoint; then ack_settle
    settles both alike, whether or not the checkpoint was read (made) first."""
    import os
    from collections import deque

    from rmq_eventstore.common.pop import PopCheckPoint

    if not hasattr(_native, "PopEntry"):
        pytest.skip("the native core has no PopEntry")

    class CEntry(_native.PopEntry):
        __slots__ = ()

    d = tmp_path_factory.mktemp("pop-entry")
    fds = [os.open(d / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) for name in ("c", "py")]
    try:
        states = []
        for cls, fd in zip((CEntry, _SlotEntry), fds, strict=True):
            by_key: dict = {}
            queues: dict = {}
            got = _native.pop_register(PopCheckPoint, cls, deque, by_key, queues, ("g", "t", 1), fd, "g", "t", 1,
                                       start, start + n, pop_time, invisible, "b", 2, 10_000, 500, retry)
            states.append((got, by_key, queues))
        (gc, kc, qc), (gp, kp, qp) = states
        assert gc == gp and kc.keys() == kp.keys()
        key = next(iter(kc))
        ec, ep = kc[key], kp[key]
        assert type(ec) is CEntry and list(qc[("g", "t", 1)]) == [ec] and list(qp[("g", "t", 1)]) == [ep]
        if touch:
            assert _fields(ec) == _fields(ep)
        for first, length in acks:
            a, b = start + first, start + first + length
            assert _native.ack_settle(kc, key, a, b, fds[0]) == _native.ack_settle(kp, key, a, b, fds[1])
            assert kc.keys() == kp.keys()
        assert _fields(ec) == _fields(ep)
        assert (d / "c").read_bytes() == (d / "py").read_bytes()
    finally:
        for fd in fds:
            os.close(fd)


def test_pop_entry_fields() -> None:
    """PopEntry's slots as __slots__ behave (unset: AttributeError), `ck` set by hand is the one kept (the made
    one's fields dropped: ack_settle then reads it as any entry), and it cannot be deleted."""
    from rmq_eventstore.common.pop import PopCheckPoint

    if not hasattr(_native, "PopEntry"):
        pytest.skip("the native core has no PopEntry")

    class CEntry(_native.PopEntry):
        __slots__ = ()

    e = CEntry()
    for name in ("ck", "revive_qid", "next_offset", "acked", "full", "stored", "flush_at", "contiguous"):
        with pytest.raises(AttributeError):
            getattr(e, name)
    with pytest.raises(AttributeError):
        e.other = 1  # type: ignore[attr-defined]
    ck = PopCheckPoint(5, 1, 2, 1, 0, "t", "g", "b", [0])
    e.ck = ck
    assert e.ck is ck
    with pytest.raises(AttributeError):
        del e.ck
    e.stored, e.contiguous, e.acked, e.full = False, True, 0, 1
    by_key = {("g", "t", 0, 5, 1): e}
    import os
    r, w = os.pipe()
    try:
        assert _native.ack_settle(by_key, ("g", "t", 0, 5, 1), 5, 6, w) == (len(b"A g t 0 5 1 5\n"), True)
        assert os.read(r, 100) == b"A g t 0 5 1 5\n" and not by_key and e.acked == 1
    finally:
        os.close(r)
        os.close(w)
