"""MappedFileQueueTest / MappedFileTest scenarios (spec §5, §15) on real files."""

from __future__ import annotations

import os
import random
import struct
import time

import pytest

from rmq_eventstore.store.mapped_file import (
    MappedFile,
    MappedFileQueue,
    StoreLoadError,
    offset_to_file_name,
)

FIXED_MSG = b"0123456789abcdef"  # 16 bytes, as RocketMQ's tests


def _fill(mfq: MappedFileQueue, count: int, data: bytes = FIXED_MSG) -> None:
    for _ in range(count):
        mf = mfq.get_last_mapped_file(0)
        assert mf is not None
        assert mf.append_message(data)


def test_offset_to_file_name() -> None:
    assert offset_to_file_name(0) == "00000000000000000000"
    assert offset_to_file_name(1073741824) == "00000000001073741824"


def test_get_last_mapped_file(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "a"), 1024)
    for _ in range(1024):
        mf = mfq.get_last_mapped_file(0)
        assert mf is not None
        assert mf.append_message(FIXED_MSG)
    assert len(mfq.mapped_files) == 16
    assert [f.file_from_offset for f in mfq.mapped_files] == [i * 1024 for i in range(16)]
    assert sorted(os.listdir(tmp_path / "a")) == [offset_to_file_name(i * 1024) for i in range(16)]
    assert all(os.path.getsize(tmp_path / "a" / n) == 1024 for n in os.listdir(tmp_path / "a"))
    assert mfq.mapped_files[0].first_create_in_queue
    assert not mfq.mapped_files[1].first_create_in_queue
    assert mfq.get_max_offset() == 16 * 1024
    mfq.shutdown()


def test_get_last_mapped_file_start_offset(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "a"), 1000)
    mf = mfq.get_last_mapped_file(2500)
    assert mf is not None and mf.file_from_offset == 2000
    assert mfq.get_last_mapped_file(0) is mf  # not full: the same file
    assert mfq.get_last_mapped_file(0, need_create=False) is mf
    mfq.shutdown()


def test_find_mapped_file_by_offset(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "b"), 1024)
    _fill(mfq, 1024, b"abcd")  # 4 files
    assert mfq.get_mapped_memory_size() == 4096
    mf = mfq.find_mapped_file_by_offset(0)
    assert mf is not None and mf.file_from_offset == 0
    mf = mfq.find_mapped_file_by_offset(100)
    assert mf is not None and mf.file_from_offset == 0
    mf = mfq.find_mapped_file_by_offset(1024)
    assert mf is not None and mf.file_from_offset == 1024
    mf = mfq.find_mapped_file_by_offset(1024 * 2 + 100)
    assert mf is not None and mf.file_from_offset == 2048
    mf = mfq.find_mapped_file_by_offset(4095)
    assert mf is not None and mf.file_from_offset == 3072
    assert mfq.find_mapped_file_by_offset(4096) is None
    assert mfq.find_mapped_file_by_offset(4096, return_first_on_not_found=True) is mfq.mapped_files[0]
    mfq.shutdown()


def test_find_mapped_file_by_offset_start_offset_is_non_zero(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "c"), 1024)
    mf = mfq.get_last_mapped_file(1024)
    assert mf is not None and mf.file_from_offset == 1024
    assert mfq.find_mapped_file_by_offset(0) is None
    assert mfq.find_mapped_file_by_offset(0, True) is mf
    assert mfq.find_mapped_file_by_offset(1024) is mf
    assert mfq.find_mapped_file_by_offset(1500) is mf
    assert mfq.get_min_offset() == 1024
    mfq.shutdown()


def test_append_message_flush_advances_one_file(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "d"), 1024)
    _fill(mfq, 1024)  # 16 full files
    for i in range(1, 17):
        assert mfq.flush(0) is False
        assert mfq.flushed_where == 1024 * i
    assert mfq.flush(0) is True  # nothing left
    assert mfq.flushed_where == 16 * 1024
    assert mfq.remain_how_many_data_to_flush() == 0
    mfq.shutdown()


def test_flush_least_pages(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "d2"), 4096 * 4)
    mf = mfq.get_last_mapped_file(0)
    assert mf is not None
    mf.append_message(b"x" * 5000)  # 1 page boundary crossed
    assert mfq.flush(2) is True and mfq.flushed_where == 0
    assert mfq.flush(1) is False and mfq.flushed_where == 5000
    mf.append_message(b"y" * 10)
    assert mfq.flush(0) is False and mfq.flushed_where == 5010
    mfq.shutdown()


def test_get_mapped_memory_size(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "e"), 1024)
    _fill(mfq, 1024, b"abcd")
    assert mfq.get_mapped_memory_size() == 1024 * 4
    mfq.shutdown()


def _fill_units(mfq: MappedFileQueue, count: int) -> None:
    for i in range(count):
        mf = mfq.get_last_mapped_file(0)
        assert mf is not None
        # a consume-queue-like unit whose physical offset is its own logical offset
        assert mf.append_message(struct.pack(">qiq", i * 20, 20, 0))


def test_delete_expired_file_by_offset(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "f"), 5120)
    _fill_units(mfq, 2048)  # 40960 bytes = 8 files of 256 units
    assert len(mfq.mapped_files) == 8
    # file k's last unit points at (k+1)*5120 - 20: files 0..3 are all below 20480
    assert mfq.delete_expired_file_by_offset(20480, 20) == 4
    assert [f.file_from_offset for f in mfq.mapped_files] == [5120 * k for k in range(4, 8)]
    assert len(os.listdir(tmp_path / "f")) == 4
    # the last file is never deleted, even when everything is expired
    assert mfq.delete_expired_file_by_offset(10**9, 20) == 3
    assert len(mfq.mapped_files) == 1 and mfq.mapped_files[0].file_from_offset == 5120 * 7
    mfq.shutdown()


def test_delete_expired_file_by_time(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "g"), 1024)
    _fill(mfq, 50 * 1024 // 16)  # 50 files
    assert len(mfq.mapped_files) == 50
    expired_time = 100 * 1000
    now = time.time()
    for i, mf in enumerate(mfq.mapped_files):
        if i < 5 or i > 20:
            old = now - 2 * expired_time / 1000
            os.utime(mf.path, (old, old))
    deleted = mfq.delete_expired_file_by_time(expired_time, 0, False, delete_file_batch_max=50)
    assert deleted == 5  # stops at file 5, the first one still live
    assert len(mfq.mapped_files) == 45
    assert mfq.mapped_files[0].file_from_offset == 5 * 1024
    assert len(os.listdir(tmp_path / "g")) == 45
    mfq.shutdown()


def test_delete_expired_file_by_time_batch_max_and_clean_immediately(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "g2"), 1024)
    _fill(mfq, 30 * 1024 // 16)
    assert mfq.delete_expired_file_by_time(10**9, clean_immediately=True, delete_file_batch_max=10) == 10
    assert len(mfq.mapped_files) == 20
    assert mfq.delete_expired_file_by_time(10**9, clean_immediately=True, delete_file_batch_max=100) == 19
    assert len(mfq.mapped_files) == 1  # never the last
    mfq.shutdown()


def test_find_mapped_file_by_iteration(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "h"), 1024)
    _fill(mfq, 1024, b"abcd")
    files = list(mfq.mapped_files)
    first, last = files[0], files[-1]
    middle = files[1:-1]
    random.Random(7).shuffle(middle)
    mfq.mapped_files = [first, *middle, last]  # out of order: the index guess misses, the scan finds
    for offset in (0, 1024, 1500, 2048, 3000, 4095):
        mf = mfq.find_mapped_file_by_offset(offset)
        assert mf is not None
        assert mf.file_from_offset <= offset < mf.file_from_offset + 1024
    mfq.shutdown()


def test_truncate_dirty_files(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "i"), 1024)
    _fill(mfq, 300)  # 4800 bytes: files 0..4, last has 704 bytes
    assert len(mfq.mapped_files) == 5
    mfq.truncate_dirty_files(2100)
    assert [f.file_from_offset for f in mfq.mapped_files] == [0, 1024, 2048]
    assert mfq.mapped_files[-1].wrote_position == 2100 - 2048
    assert mfq.get_max_offset() == 2100
    assert sorted(os.listdir(tmp_path / "i")) == [offset_to_file_name(o) for o in (0, 1024, 2048)]
    # on a file boundary: the file starting there stays, empty
    mfq.truncate_dirty_files(2048)
    assert [f.file_from_offset for f in mfq.mapped_files] == [0, 1024, 2048]
    assert mfq.mapped_files[-1].wrote_position == 0
    assert mfq.get_max_offset() == 2048
    mfq.shutdown()


def test_delete_last_mapped_file(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "j"), 1024)
    _fill(mfq, 100)
    n = len(mfq.mapped_files)
    mfq.delete_last_mapped_file()
    assert len(mfq.mapped_files) == n - 1
    assert len(os.listdir(tmp_path / "j")) == n - 1
    mfq.shutdown()


def test_load_sets_full_positions_and_deletes_empty_last_file(tmp_path) -> None:
    d = tmp_path / "k"
    mfq = MappedFileQueue(str(d), 1024)
    _fill(mfq, 100)  # 1600 bytes: two files
    mfq.flush(0)
    mfq.shutdown()
    (d / offset_to_file_name(2048)).write_bytes(b"")  # a crash while creating the next file
    mfq = MappedFileQueue(str(d), 1024)
    assert mfq.load()
    assert [f.file_from_offset for f in mfq.mapped_files] == [0, 1024]
    assert all(f.wrote_position == f.flushed_position == 1024 for f in mfq.mapped_files)
    assert not (d / offset_to_file_name(2048)).exists()
    view = mfq.mapped_files[1].select_mapped_buffer(0, 16)
    assert view is not None and bytes(view) == FIXED_MSG
    view.release()
    mfq.shutdown()


def test_load_wrong_size_middle_file(tmp_path) -> None:
    d = tmp_path / "l"
    d.mkdir()
    (d / offset_to_file_name(0)).write_bytes(bytes(1024))
    (d / offset_to_file_name(1024)).write_bytes(bytes(512))
    (d / offset_to_file_name(2048)).write_bytes(bytes(1024))
    mfq = MappedFileQueue(str(d), 1024)
    with pytest.raises(StoreLoadError, match=r"00000000000000001024 is 512 bytes.*1024"):
        mfq.load()
    assert mfq.mapped_files == []


def test_load_ignores_non_numeric_names_and_missing_dir(tmp_path) -> None:
    mfq = MappedFileQueue(str(tmp_path / "missing"), 1024)
    assert mfq.load() and mfq.mapped_files == []
    assert mfq.get_min_offset() == -1 and mfq.get_max_offset() == 0
    d = tmp_path / "m"
    d.mkdir()
    (d / offset_to_file_name(0)).write_bytes(bytes(1024))
    (d / "README").write_text("not a segment")
    mfq = MappedFileQueue(str(d), 1024)
    assert mfq.load() and len(mfq.mapped_files) == 1
    mfq.shutdown()


def test_read_only_load_of_short_last_file(tmp_path) -> None:
    d = tmp_path / "n"
    d.mkdir()
    (d / offset_to_file_name(0)).write_bytes(b"a" * 1024)
    (d / offset_to_file_name(1024)).write_bytes(b"b" * 100)
    mfq = MappedFileQueue(str(d), 1024, read_only=True)
    assert mfq.load()
    assert mfq.get_max_offset() == 1124
    assert mfq.get_last_mapped_file(0) is mfq.mapped_files[-1]  # never creates
    with open(d / offset_to_file_name(1024), "ab") as f:
        f.write(b"c" * 50)
    (d / offset_to_file_name(2048)).write_bytes(b"d" * 10)
    mfq.refresh_read_only()
    assert mfq.get_max_offset() == 2058
    assert os.path.getsize(d / offset_to_file_name(1024)) == 150  # never extended
    mfq.shutdown()


def test_destroy_removes_files_and_dir(tmp_path) -> None:
    d = tmp_path / "o"
    mfq = MappedFileQueue(str(d), 1024)
    _fill(mfq, 200)
    mfq.destroy()
    assert mfq.mapped_files == [] and mfq.flushed_where == 0
    assert not d.exists()


def test_mapped_file_select_mapped_buffer(tmp_path) -> None:
    path = str(tmp_path / offset_to_file_name(0))
    mf = MappedFile(path, 1024 * 64)
    assert mf.append_message(b"0123456789abcdef" * 4)
    view = mf.select_mapped_buffer(0)
    assert view is not None and len(view) == 64
    assert bytes(view[:16]) == b"0123456789abcdef"
    view.release()
    view = mf.select_mapped_buffer(16, 16)
    assert view is not None and bytes(view) == b"0123456789abcdef"
    view.release()
    assert mf.select_mapped_buffer(60, 8) is None  # past the read position
    assert mf.select_mapped_buffer(64) is None
    assert mf.select_mapped_buffer(-1, 4) is None
    assert not mf.is_full()
    assert mf.destroy()
    assert not os.path.exists(path)


def test_mapped_file_rejects_oversized_file(tmp_path) -> None:
    path = tmp_path / offset_to_file_name(0)
    path.write_bytes(bytes(2048))
    with pytest.raises(StoreLoadError):
        MappedFile(str(path), 1024)
    with pytest.raises(StoreLoadError):
        MappedFile(str(tmp_path / "abc"), 1024)
