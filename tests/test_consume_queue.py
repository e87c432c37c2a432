"""ConsumeQueueTest scenarios (spec §6, §15) on real files."""

from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.store.consume_queue import BLANK_UNIT_SIZE, ConsumeQueue
from rmq_eventstore.store.mapped_file import offset_to_file_name

TOPIC = "T1"
UNITS_PER_FILE = 10
SMALL = UNITS_PER_FILE * 20  # 200-byte files: 10 units each
DEFAULT_CQ_FILE = 300_000 * 20


def _cq(root, file_size: int = SMALL, read_only: bool = False, topic: str = TOPIC, qid: int = 0) -> ConsumeQueue:
    cq = ConsumeQueue(topic, qid, str(root), file_size, read_only=read_only)
    assert cq.load()
    cq.recover()
    return cq


def _put_range(cq: ConsumeQueue, start: int, count: int, size: int = 100, base: int = 1000) -> None:
    for i in range(start, start + count):
        assert cq.put_message_position_info(base + i * size, size, i * 7, i)


def _queue_dir(root, topic: str = TOPIC, qid: int = 0):
    return root / topic / str(qid)


def _files(root, topic: str = TOPIC, qid: int = 0) -> list[str]:
    d = _queue_dir(root, topic, qid)
    return sorted(os.listdir(d)) if d.exists() else []


def test_layout_and_unit_bytes(tmp_path) -> None:
    cq = _cq(tmp_path)
    assert cq.topic == TOPIC and cq.queue_id == 0
    assert cq.put_message_position_info(0x0102030405060708, 0x11223344, -2, 0)
    assert cq.get_max_offset_in_queue() == 1
    cq.flush(0)
    data = (_queue_dir(tmp_path) / offset_to_file_name(0)).read_bytes()
    assert len(data) == SMALL
    assert data[:20] == bytes.fromhex("0102030405060708" "11223344" "fffffffffffffffe")
    assert cq.get_unit(0) == (0x0102030405060708, 0x11223344, -2)
    cq.shutdown()


def test_rejects_file_size_not_multiple_of_unit(tmp_path) -> None:
    with pytest.raises(ValueError):
        ConsumeQueue(TOPIC, 0, str(tmp_path), 1001)


def test_put_message_position_info_build_cq_repeatedly(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 5)
    before = (_queue_dir(tmp_path) / offset_to_file_name(0)).read_bytes()
    # the same dispatch again (offset + size <= maxPhysicOffset): a successful no-op
    for i in range(5):
        assert cq.put_message_position_info(1000 + i * 100, 100, i * 7, i)
    # an expected logic offset below the current one is skipped too
    assert cq.put_message_position_info(99_999, 100, 0, 2)
    assert cq.get_max_offset_in_queue() == 5
    assert cq.max_physic_offset == 1500
    assert (_queue_dir(tmp_path) / offset_to_file_name(0)).read_bytes() == before
    cq.shutdown()


def test_units_roll_across_small_files(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 95)
    assert _files(tmp_path) == [offset_to_file_name(SMALL * k) for k in range(10)]
    assert cq.get_max_offset_in_queue() == 95
    assert cq.get_min_offset_in_queue() == 0
    for i in (0, 9, 10, 11, 94):
        assert cq.get_unit(i) == (1000 + i * 100, 100, i * 7)
    assert cq.get_unit(95) is None and cq.get_unit(-1) is None
    # get_units reads one file only, and stops at the readable end
    assert [u[0] for u in cq.get_units(7, 32)] == [1000 + i * 100 for i in (7, 8, 9)]
    assert len(cq.get_units(90, 32)) == 5
    assert cq.get_units(95, 32) == []
    assert cq.get_units(3, 2) == [(1300, 100, 21), (1400, 100, 28)]
    assert cq.roll_next_file(7) == 10 and cq.roll_next_file(10) == 20
    assert cq.get_last_offset() == 1000 + 94 * 100 + 100
    assert cq.get_total_size() == 10 * SMALL
    cq.shutdown()


def test_roll_next_file_default_size(tmp_path) -> None:
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path), DEFAULT_CQ_FILE)
    assert cq.roll_next_file(0) == 300_000
    assert cq.roll_next_file(299_999) == 300_000
    assert cq.roll_next_file(300_000) == 600_000


def test_fill_pre_blank_on_first_file(tmp_path) -> None:
    cq = _cq(tmp_path)
    assert cq.put_message_position_info(5000, 100, 1, 25)  # queue created at offset 25 → file 400
    assert _files(tmp_path) == [offset_to_file_name(400)]
    assert cq.get_min_offset_in_queue() == 25 and cq.min_logic_offset == 500
    assert cq.get_max_offset_in_queue() == 26
    data = (_queue_dir(tmp_path) / offset_to_file_name(400)).read_bytes()
    blank = struct.pack(">qiq", 0, BLANK_UNIT_SIZE, 0)
    assert data[:100] == blank * 5
    assert data[100:120] == struct.pack(">qiq", 5000, 100, 1)
    assert cq.get_unit(24) is None  # below the min offset
    assert cq.get_unit(25) == (5000, 100, 1)
    cq.shutdown()


def test_gap_is_logged_and_appended(tmp_path, caplog) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 3)
    assert cq.put_message_position_info(9000, 100, 0, 7)  # expected 3: not filled, appended at 3
    assert "logic queue order maybe wrong" in caplog.text
    assert cq.get_max_offset_in_queue() == 4
    assert cq.get_unit(3) == (9000, 100, 0)
    cq.shutdown()


def test_correct_min_offset(tmp_path) -> None:
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path), DEFAULT_CQ_FILE)
    assert cq.load()
    cq.recover()
    max_units, message_size = 10_000, 100
    for i in range(max_units):
        assert cq.put_message_position_info(message_size * i, message_size, 0, i)

    cq.min_logic_offset = 0
    cq.correct_min_offset(0)
    assert cq.get_min_offset_in_queue() == 0

    cq.min_logic_offset = 100
    cq.correct_min_offset(2000)
    assert cq.get_min_offset_in_queue() == 20

    cq.min_logic_offset = (max_units - 1) * 20
    cq.correct_min_offset(max_units * message_size)
    assert cq.min_logic_offset == max_units * 20

    cq.min_logic_offset = max_units * 20
    cq.correct_min_offset(max_units * message_size)
    assert cq.min_logic_offset == max_units * 20
    cq.destroy()
    assert not _queue_dir(tmp_path).exists()


def test_correct_min_offset_binary_search_variants(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 45, base=0)  # phy = 100 i
    cq.correct_min_offset(0)
    assert cq.get_min_offset_in_queue() == 0
    cq.correct_min_offset(1)  # first unit >= 1 is unit 1
    assert cq.get_min_offset_in_queue() == 1
    cq.correct_min_offset(550)
    assert cq.get_min_offset_in_queue() == 6
    cq.correct_min_offset(100)  # the min never moves backwards
    assert cq.get_min_offset_in_queue() == 6
    cq.correct_min_offset(2500)  # beyond the first file (not yet deleted)
    assert cq.get_min_offset_in_queue() == 25
    cq.correct_min_offset(4400)
    assert cq.get_min_offset_in_queue() == 44
    cq.correct_min_offset(4401)  # beyond the data: empty, keeps its max
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 45
    cq.shutdown()


def test_correct_min_offset_empty_queue(tmp_path) -> None:
    cq = _cq(tmp_path)
    cq.min_logic_offset = 400
    cq.max_physic_offset = 10
    cq.correct_min_offset(100)
    assert cq.min_logic_offset == 0 and cq.max_physic_offset == -1


def test_fill_blank_then_correct_min_offset(tmp_path) -> None:
    cq = ConsumeQueue(TOPIC, 0, str(tmp_path), DEFAULT_CQ_FILE)
    assert cq.load()
    cq.recover()
    cq.initialize_with_offset(100, 100)
    assert cq.get_min_offset_in_queue() == 100
    assert cq.get_max_offset_in_queue() == 100
    cq.shutdown()

    cq = ConsumeQueue(TOPIC, 0, str(tmp_path), DEFAULT_CQ_FILE)
    assert cq.load()
    cq.recover()
    cq.correct_min_offset(1)
    assert cq.get_min_offset_in_queue() == 100
    assert cq.get_max_offset_in_queue() == 100
    # blank units are not records: the next real unit is not mistaken for a repeat
    assert cq.max_physic_offset == -1
    assert cq.get_last_offset() == -1
    assert cq.put_message_position_info(0, 50, 0, 100)
    assert cq.get_max_offset_in_queue() == 101
    assert cq.get_unit(100) == (0, 50, 0)
    cq.destroy()


def test_recover_after_reopen(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 35)
    cq.flush(0)
    cq.shutdown()

    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 35
    assert cq.max_physic_offset == 1000 + 34 * 100 + 100
    assert cq.mapped_file_queue.flushed_where == 35 * 20
    assert cq.get_unit(34) == (1000 + 3400, 100, 34 * 7)
    # the queue continues where it was
    assert cq.put_message_position_info(1000 + 35 * 100, 100, 0, 35)
    assert cq.get_max_offset_in_queue() == 36
    cq.shutdown()


def test_recover_drops_torn_last_unit(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 25)
    cq.shutdown()
    path = _queue_dir(tmp_path) / offset_to_file_name(400)
    data = bytearray(path.read_bytes())
    data[100:108] = struct.pack(">q", 1000 + 25 * 100)  # only the offset of unit 25 reached the disk
    path.write_bytes(bytes(data))

    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 25
    assert cq.max_physic_offset == 1000 + 25 * 100
    assert cq.get_unit(25) is None
    assert path.read_bytes()[100:] == bytes(100)  # the torn bytes are gone
    cq.shutdown()


def test_recover_stops_at_negative_offset_and_drops_later_files(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 35)
    cq.shutdown()
    path = _queue_dir(tmp_path) / offset_to_file_name(200)
    data = bytearray(path.read_bytes())
    data[60:80] = struct.pack(">qiq", -5, 100, 0)  # unit 13 invalid
    path.write_bytes(bytes(data))
    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 13
    assert _files(tmp_path) == [offset_to_file_name(0), offset_to_file_name(200)]
    assert cq.max_physic_offset == 1000 + 12 * 100 + 100
    cq.shutdown()


def test_recover_empty_last_file(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 20)
    assert len(_files(tmp_path)) == 2  # the second file is full but no third one yet
    cq.mapped_file_queue.get_last_mapped_file(0)  # roll: an empty third file
    cq.shutdown()
    assert len(_files(tmp_path)) == 3
    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 20
    assert cq.put_message_position_info(1000 + 2000, 100, 0, 20)
    assert cq.get_unit(20) == (3000, 100, 0)
    cq.shutdown()


@pytest.mark.parametrize(
    ("phy_offset", "max_offset", "files", "max_physic"),
    [
        (10**9, 35, 4, 1000 + 3500),
        (4400, 34, 4, 1000 + 3400),  # unit 34 starts at 4400: dropped
        (4401, 35, 4, 1000 + 3500),
        (3050, 21, 3, 1000 + 2100),  # ends one unit into file 400
        (3000, 20, 2, 1000 + 2000),  # unit 20 is the first of file 400: the whole file goes
        (1950, 10, 1, 1000 + 1000),  # file 200 emptied too; file 0 is full
        (1000, 0, 0, 1000),          # everything is dirty
        (0, 0, 0, 0),
    ],
)
def test_truncate_dirty_logic_files(tmp_path, phy_offset, max_offset, files, max_physic) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 35)
    cq.truncate_dirty_logic_files(phy_offset)
    assert cq.get_max_offset_in_queue() == max_offset
    assert len(_files(tmp_path)) == files
    assert cq.max_physic_offset == max_physic
    if max_offset:
        assert cq.get_unit(max_offset - 1) == (1000 + (max_offset - 1) * 100, 100, (max_offset - 1) * 7)
    assert cq.get_unit(max_offset) is None
    # the queue continues from there, and a restart agrees
    assert cq.put_message_position_info(10**6, 100, 0, max_offset)
    cq.shutdown()
    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == max_offset + 1
    assert cq.get_unit(max_offset) == (10**6, 100, 0)
    cq.shutdown()


def test_delete_expired_file(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 35, base=0)  # phy = 100 i
    assert cq.delete_expired_file(2000) == 2  # files 0 and 200 end below 2000
    assert _files(tmp_path) == [offset_to_file_name(400), offset_to_file_name(600)]
    assert cq.get_min_offset_in_queue() == 20
    assert cq.get_unit(19) is None and cq.get_unit(20) == (2000, 100, 140)
    assert cq.get_units(10, 5) == []
    assert cq.delete_expired_file(10**9) == 1  # never the last file
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 35
    cq.shutdown()


def test_flush_and_destroy(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 15)
    assert cq.flush(0) is False  # file 0 flushed
    assert cq.flush(0) is False  # file 200
    assert cq.flush(0) is True
    assert cq.mapped_file_queue.flushed_where == 300
    cq.destroy()
    assert cq.get_max_offset_in_queue() == 0 and cq.max_physic_offset == -1
    assert not _queue_dir(tmp_path).exists()


# -- batched put ------------------------------------------------------------------------------------


def test_batched_put_in_order(tmp_path) -> None:
    cq = _cq(tmp_path)
    units = [(1000 + i * 100, 100, i, i) for i in range(95)]
    assert cq.put_message_position_infos(units) == 95
    assert cq.get_max_offset_in_queue() == 95
    assert cq.max_physic_offset == 1000 + 9500
    assert len(_files(tmp_path)) == 10
    assert cq.get_units(90, 10) == [u[:3] for u in units[90:]]
    assert cq.put_message_position_infos(units) == 95  # all repeats
    assert cq.get_max_offset_in_queue() == 95
    more = [(1000 + i * 100, 100, i, i) for i in range(90, 120)]  # overlapping repeats, then new
    assert cq.put_message_position_infos(more) == 30
    assert cq.get_max_offset_in_queue() == 120
    assert cq.put_message_position_infos([]) == 0
    arr = np.array([(1000 + i * 100, 100, i, i) for i in range(120, 130)], dtype=np.int64)
    assert cq.put_message_position_infos(arr) == 10
    assert cq.get_unit(129) == (1000 + 12900, 100, 129)
    cq.shutdown()


def test_batched_put_first_unit_fills_pre_blank(tmp_path) -> None:
    cq = _cq(tmp_path)
    units = [(5000 + i * 10, 10, 0, 25 + i) for i in range(30)]
    assert cq.put_message_position_infos(units) == 30
    assert cq.get_min_offset_in_queue() == 25 and cq.get_max_offset_in_queue() == 55
    assert _files(tmp_path)[0] == offset_to_file_name(400)
    cq.shutdown()


def _write_units_one_by_one(cq: ConsumeQueue, units) -> list[bool]:
    return [cq.put_message_position_info(*u) for u in units]


def _queue_bytes(root) -> dict[str, bytes]:
    d = _queue_dir(root)
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))} if d.exists() else {}


@st.composite
def unit_streams(draw):
    """Dispatch-like streams: mostly in order, with repeats of earlier units, gaps and a random start."""
    start = draw(st.sampled_from([0, 0, 1, 7, 10, 23]))
    phy = draw(st.integers(0, 10_000))
    q = start
    units: list[tuple[int, int, int, int]] = []
    regular = draw(st.sampled_from([2, 8, 40]))  # how many in-order units per irregular one
    kinds = ["next"] * regular + ["repeat", "gap", "stale_q", "zero_q"]
    for _ in range(draw(st.integers(1, 150))):
        kind = draw(st.sampled_from(kinds))
        if kind == "repeat" and units:
            units.append(units[draw(st.integers(0, len(units) - 1))])
            continue
        size = draw(st.integers(1, 500))
        if kind == "gap":
            q += draw(st.integers(1, 12))
        elif kind == "stale_q" and q > 0:
            q -= draw(st.integers(1, q))
        elif kind == "zero_q":
            q = 0
        units.append((phy, size, draw(st.integers(-(2**63), 2**63 - 1)), q))
        phy += size + draw(st.integers(0, 50))
        q += 1
    cuts = sorted(draw(st.lists(st.integers(0, len(units)), max_size=6)))
    return units, cuts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(unit_streams())
def test_batched_put_equals_unit_by_unit(tmp_path_factory, stream) -> None:
    units, cuts = stream
    a_root = tmp_path_factory.mktemp("single")
    b_root = tmp_path_factory.mktemp("batched")
    a = _cq(a_root)
    b = _cq(b_root)
    results = _write_units_one_by_one(a, units)
    assert all(results)
    bounds = [0, *cuts, len(units)]
    for n, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        batch = units[lo:hi]
        if n % 2 and batch:  # the dispatcher may also hand over an (n, 4) int64 array
            assert b.put_message_position_infos(np.array(batch, dtype=np.int64)) == hi - lo
        else:
            assert b.put_message_position_infos(batch) == hi - lo
    assert b.get_max_offset_in_queue() == a.get_max_offset_in_queue()
    assert b.get_min_offset_in_queue() == a.get_min_offset_in_queue()
    assert b.max_physic_offset == a.max_physic_offset
    a.shutdown()
    b.shutdown()
    assert _queue_bytes(b_root) == _queue_bytes(a_root)


# -- lookup by time ---------------------------------------------------------------------------------


def _times_cq(tmp_path, times: list[int], size: int = 100) -> tuple[ConsumeQueue, dict[int, int]]:
    cq = _cq(tmp_path)
    by_phy: dict[int, int] = {}
    for i, t in enumerate(times):
        phy = i * size
        by_phy[phy] = t
        assert cq.put_message_position_info(phy, size, 0, i)
    return cq, by_phy


def test_get_offset_in_queue_by_time(tmp_path) -> None:
    times = [1000 + 10 * i for i in range(35)]  # 4 files
    cq, by_phy = _times_cq(tmp_path, times)
    calls: list[int] = []

    def store_time_of(phy: int, size: int) -> int:
        calls.append(phy)
        return by_phy.get(phy, -1)

    assert cq.get_offset_in_queue_by_time(0, store_time_of) == 0
    assert cq.get_offset_in_queue_by_time(1000, store_time_of) == 0
    assert cq.get_offset_in_queue_by_time(1001, store_time_of) == 1
    assert cq.get_offset_in_queue_by_time(1090, store_time_of) == 9
    assert cq.get_offset_in_queue_by_time(1095, store_time_of) == 10  # across a file boundary
    assert cq.get_offset_in_queue_by_time(1100, store_time_of) == 10
    assert cq.get_offset_in_queue_by_time(1245, store_time_of) == 25
    assert cq.get_offset_in_queue_by_time(1340, store_time_of) == 34
    assert cq.get_offset_in_queue_by_time(1341, store_time_of) == 35  # beyond: the max offset
    assert cq.get_offset_in_queue_by_time(10**12, store_time_of) == 35
    for ts in range(990, 1360, 3):
        expected = next((i for i, t in enumerate(times) if t >= ts), len(times))
        assert cq.get_offset_in_queue_by_time(ts, store_time_of) == expected, ts
    calls.clear()
    cq.get_offset_in_queue_by_time(1245, store_time_of)
    assert len(calls) < 12  # binary search, and full files' last store times are cached
    cq.shutdown()


def test_get_offset_in_queue_by_time_equal_timestamps(tmp_path) -> None:
    times = [100] * 3 + [200] * 15 + [300] * 4 + [400]  # the 200s span files 0 and 200
    cq, by_phy = _times_cq(tmp_path, times)

    def store_time_of(phy: int, size: int) -> int:
        return by_phy.get(phy, -1)

    assert cq.get_offset_in_queue_by_time(200, store_time_of) == 3
    assert cq.get_offset_in_queue_by_time(150, store_time_of) == 3
    assert cq.get_offset_in_queue_by_time(300, store_time_of) == 18
    assert cq.get_offset_in_queue_by_time(400, store_time_of) == 22
    assert cq.get_offset_in_queue_by_time(401, store_time_of) == 23
    cq.shutdown()


def test_get_offset_in_queue_by_time_with_deleted_records_and_empty_queue(tmp_path) -> None:
    times = [1000 + 10 * i for i in range(35)]
    cq, by_phy = _times_cq(tmp_path, times)

    def store_time_of(phy: int, size: int) -> int:  # records below 1500 were deleted from the commitlog
        return by_phy[phy] if phy >= 1500 else -1

    cq.correct_min_offset(1500)
    assert cq.get_min_offset_in_queue() == 15
    assert cq.get_offset_in_queue_by_time(0, store_time_of) == 15
    assert cq.get_offset_in_queue_by_time(1200, store_time_of) == 20
    cq.shutdown()
    empty = _cq(tmp_path / "empty")
    assert empty.get_offset_in_queue_by_time(12345, store_time_of) == 0


# -- read-only and concurrent readers ---------------------------------------------------------------


def test_read_only_on_a_directory_being_written(tmp_path) -> None:
    writer = _cq(tmp_path)
    _put_range(writer, 0, 25)  # files 0, 200 full; 400 half
    reader = _cq(tmp_path, read_only=True)
    assert reader.get_max_offset_in_queue() == 25
    assert reader.max_physic_offset == 1000 + 2500
    assert reader.get_unit(24) == (1000 + 2400, 100, 24 * 7)
    assert reader.get_unit(25) is None
    assert len(reader.get_units(20, 32)) == 5

    _put_range(writer, 25, 12)  # into a new file
    assert reader.get_max_offset_in_queue() == 25  # not seen until refreshed
    reader.refresh()
    assert reader.get_max_offset_in_queue() == 37
    assert reader.get_unit(36) == (1000 + 3600, 100, 36 * 7)
    assert [u[0] for u in reader.get_units(30, 32)] == [1000 + i * 100 for i in range(30, 37)]

    # the reader never writes, creates or deletes
    before = _queue_bytes(tmp_path)
    assert reader.put_message_position_info(10**7, 1, 0, 37) is False
    assert reader.put_message_position_infos([(10**7, 1, 0, 37)] * 5) == 0
    reader.truncate_dirty_logic_files(0)
    assert reader.delete_expired_file(10**9) == 0
    reader.destroy()
    writer.flush(0)
    assert _queue_bytes(tmp_path) == before
    writer.shutdown()


def test_read_only_missing_queue_and_short_last_file(tmp_path) -> None:
    reader = _cq(tmp_path, read_only=True)
    assert reader.get_max_offset_in_queue() == 0 and reader.get_unit(0) is None
    assert not (tmp_path / TOPIC).exists()
    d = _queue_dir(tmp_path)
    d.mkdir(parents=True)
    (d / offset_to_file_name(0)).write_bytes(struct.pack(">qiq", 5, 6, 7) * 3 + b"\x00" * 10)
    reader = _cq(tmp_path, read_only=True)
    assert reader.get_max_offset_in_queue() == 3
    assert reader.get_unit(2) == (5, 6, 7)
    reader.shutdown()


def test_concurrent_readers_never_see_partial_units(tmp_path) -> None:
    cq = _cq(tmp_path, file_size=2000)
    total, batch = 3000, 37
    stop = threading.Event()
    errors: list[str] = []

    def expected(i: int) -> tuple[int, int, int]:
        return (1 + i * 10, 10, i)

    def reader() -> None:
        while not stop.is_set():
            n = cq.get_max_offset_in_queue()
            for start in (max(0, n - 50), n // 2):
                for k, unit in enumerate(cq.get_units(start, 64)):
                    if unit != expected(start + k):
                        errors.append(f"{start + k}: {unit}")
                        return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for lo in range(0, total, batch):
            units = [(*expected(i), i) for i in range(lo, min(total, lo + batch))]
            assert cq.put_message_position_infos(units) == len(units)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert cq.get_max_offset_in_queue() == total
    cq.shutdown()


def test_read_only_reader_follows_a_live_writer(tmp_path) -> None:
    writer = _cq(tmp_path)
    reader = _cq(tmp_path, read_only=True)
    total = 2000
    done = threading.Event()
    errors: list[str] = []

    def write() -> None:
        try:
            for lo in range(0, total, 13):
                units = [(1000 + i * 100, 100, i, i) for i in range(lo, min(total, lo + 13))]
                assert writer.put_message_position_infos(units) == len(units)
        finally:
            done.set()

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    while True:
        finished = done.is_set()
        reader.refresh()
        n = reader.get_max_offset_in_queue()
        if n < seen:
            errors.append(f"max went back from {seen} to {n}")
        for i in range(seen, n):  # no holes: every offset below the max is readable and whole
            if reader.get_unit(i) != (1000 + i * 100, 100, i):
                errors.append(f"{i}: {reader.get_unit(i)}")
                break
        seen = n
        if finished or errors:
            break
    t.join()
    assert not errors, errors[:3]
    assert seen == total
    assert reader.max_physic_offset == writer.max_physic_offset
    reader.shutdown()
    writer.shutdown()


def test_truncate_zeroes_the_dropped_units(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 8)
    cq.truncate_dirty_logic_files(1000 + 5 * 100)
    cq.shutdown()
    data = (_queue_dir(tmp_path) / offset_to_file_name(0)).read_bytes()
    assert data[100:] == bytes(100)
    reader = _cq(tmp_path, read_only=True)  # a reader scanning for the end stops at the truncation point
    assert reader.get_max_offset_in_queue() == 5


def test_correct_min_offset_with_empty_last_file(tmp_path) -> None:
    cq = _cq(tmp_path)
    _put_range(cq, 0, 20, base=0)
    cq.mapped_file_queue.get_last_mapped_file(0)  # an empty third file
    cq.correct_min_offset(10**6)
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 20
    cq.shutdown()


def test_empty_queue_offsets(tmp_path) -> None:
    cq = _cq(tmp_path)
    assert cq.get_max_offset_in_queue() == 0 and cq.get_min_offset_in_queue() == 0
    assert cq.get_last_offset() == -1 and cq.max_physic_offset == -1
    assert cq.get_units(0, 10) == [] and cq.get_unit(0) is None
    assert cq.flush(0) is True
    assert cq.delete_expired_file(100) == 0
    assert not (tmp_path / TOPIC).exists()  # nothing is created until the first put


def test_read_only_zero_length_file_that_grows(tmp_path) -> None:
    d = _queue_dir(tmp_path)
    d.mkdir(parents=True)
    path = d / offset_to_file_name(0)
    path.write_bytes(b"")
    reader = _cq(tmp_path, read_only=True)
    assert reader.get_max_offset_in_queue() == 0
    path.write_bytes(struct.pack(">qiq", 10, 20, 30) * 2 + bytes(40))
    reader.refresh()
    assert reader.get_max_offset_in_queue() == 2
    assert reader.get_units(0, 5) == [(10, 20, 30), (10, 20, 30)]
    assert reader.max_physic_offset == 30
    reader.shutdown()
