"""Warming the commitlog ahead of the writer (`MappedFile.warm`, `CommitLog.warm_ahead`, `_native.populate`):
pages past the write position are faulted in for writing by the flush service, so that a put writing a fresh
page does not fault it in (and zero it) inside the put lock. No byte of the file changes."""

from __future__ import annotations

import mmap
import resource
import time
from pathlib import Path

import pytest

from rmq_eventstore.store import Message, PutMessageStatus, StoreConfig
from rmq_eventstore.store import mapped_file as mapped_file_module
from rmq_eventstore.store.mapped_file import MappedFile
from tests.conftest import import_native

native = import_native()
MIB = 1 << 20
PAGE = resource.getpagesize()


def _kernel_has_populate() -> bool:
    """Asked of the kernel directly (an anonymous mapping), not through the code under test, so that a
    broken `MappedFile.warm` fails these tests instead of skipping them."""
    m = mmap.mmap(-1, PAGE)
    try:
        return native.populate(memoryview(m), 0, PAGE) == PAGE
    finally:
        m.close()


HAS_POPULATE = _kernel_has_populate()
needs_populate = pytest.mark.skipif(not HAS_POPULATE, reason="this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")


def _faults_writing(mf: MappedFile, start: int, end: int) -> int:
    """Minor page faults of this thread while one byte of each page of [start, end) is written."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    view = mf.view
    for pos in range(start, end, PAGE):
        view[pos] = 0x55
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


@pytest.fixture
def fresh(tmp_path: Path):  # noqa: ANN201
    mf = MappedFile(str(tmp_path / "00000000000000000000"), 8 * MIB)
    yield mf
    mf.close()


@needs_populate
def test_warm_pages_take_no_fault_when_written(fresh: MappedFile) -> None:
    assert fresh.warm(PAGE) == PAGE
    cold = _faults_writing(fresh, 4 * MIB, 5 * MIB)  # never warmed: a fault per page
    assert fresh.warm(2 * MIB) == 2 * MIB - PAGE
    warm = _faults_writing(fresh, 0, 2 * MIB)
    assert cold >= (MIB // PAGE) // 2, cold
    assert warm <= cold // 10, (warm, cold)


@needs_populate
def test_warm_changes_no_byte_and_moves_forward_only(fresh: MappedFile) -> None:
    data = bytes(range(256)) * 64
    assert fresh.append_message(data)
    snapshot = bytes(fresh.view[: 2 * MIB])
    done = fresh.warm(MIB)
    assert done == MIB - len(data)  # from the write position
    assert fresh.warmed_position == MIB
    assert bytes(fresh.view[: 2 * MIB]) == snapshot  # the record and the zeros after it are untouched
    assert fresh.warm(MIB) == 0 and fresh.warm(MIB // 2) == 0  # already warm
    assert fresh.warm(100 * MIB) == 7 * MIB  # never past the file's end
    assert fresh.warmed_position == 8 * MIB


def test_populate_checks_its_range(fresh: MappedFile) -> None:
    with pytest.raises(ValueError, match="not inside the buffer"):
        native.populate(fresh.view, 0, 9 * MIB)
    with pytest.raises(ValueError, match="not inside the buffer"):
        native.populate(fresh.view, 10, 5)
    with pytest.raises(TypeError):
        native.populate(b"read-only bytes", 0, 4)


def test_a_read_only_file_is_not_warmed(fresh: MappedFile, tmp_path: Path) -> None:
    fresh.append_message(b"x" * 100)
    fresh.flush(0)
    ro = MappedFile(fresh.path, 8 * MIB, read_only=True)
    try:
        assert ro.warm(MIB) == 0
    finally:
        ro.close()


@needs_populate
def test_the_warm_service_keeps_the_store_warm_ahead(open_store) -> None:  # noqa: ANN001
    assert mapped_file_module._populate is not None  # the native core is on and no warm failed before
    store = open_store(mapped_file_size_commit_log=16 * MIB, warm_ahead_bytes=2 * MIB)
    for i in range(200):
        r = store.put_message(Message(topic="Warm", body=b"%d" % i * 50))
        assert r.status == PutMessageStatus.PUT_OK
    mf = store.commit_log.mapped_file_queue.get_last_mapped_file_or_none()
    deadline = time.monotonic() + 5
    while mf.warmed_position <= mf.wrote_position and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mf.warmed_position - mf.wrote_position > MIB  # warmed by WarmAheadService, woken by the dispatch thread
    assert store.commit_log.warm_ahead() == 0  # more than half the window is still warm


def test_warm_ahead_off(open_store) -> None:  # noqa: ANN001
    store = open_store(warm_ahead_bytes=0)
    store.put_message(Message(topic="Cold", body=b"x"))
    assert store.commit_log.warm_ahead() == 0
    assert store.commit_log.mapped_file_queue.get_last_mapped_file_or_none().warmed_position == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "4M"])
def test_warm_ahead_bytes_is_checked(bad: object) -> None:
    with pytest.raises(ValueError, match="warm_ahead_bytes must be an int >= 0"):
        StoreConfig(store_path_root_dir="/nonexistent", warm_ahead_bytes=bad)  # type: ignore[arg-type]
