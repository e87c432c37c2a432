"""StoreCheckpointTest (spec §8, §15) on real files."""

from __future__ import annotations

import os
import struct

from rmq_eventstore.store.checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint


def test_write_and_read(tmp_path) -> None:
    path = str(tmp_path / "store" / "checkpoint")
    cp = StoreCheckpoint(path)
    physic, logics = 0xAABB, 0xCCDD
    cp.physic_msg_timestamp = physic
    cp.logics_msg_timestamp = logics
    cp.flush()
    cp.shutdown()

    cp = StoreCheckpoint(path)
    assert cp.physic_msg_timestamp == physic
    assert cp.logics_msg_timestamp == logics
    assert physic - cp.get_min_timestamp() == 3000
    cp.shutdown()


def test_file_is_one_zero_padded_page(tmp_path) -> None:
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    assert os.path.getsize(path) == CHECKPOINT_FILE_SIZE == 4096
    assert open(path, "rb").read() == bytes(4096)
    cp.physic_msg_timestamp = 1
    cp.logics_msg_timestamp = 2
    cp.index_msg_timestamp = 3
    cp.master_flushed_offset = 4
    cp.confirm_phy_offset = 5
    cp.shutdown()
    data = open(path, "rb").read()
    assert len(data) == 4096
    assert struct.unpack(">5q", data[:40]) == (1, 2, 3, 4, 5)
    assert data[40:] == bytes(4096 - 40)


def test_min_timestamps() -> None:
    cp = StoreCheckpoint.__new__(StoreCheckpoint)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 10_000, 8_000, 1_000
    assert cp.get_min_timestamp() == 5_000
    assert cp.get_min_timestamp_index() == 1_000
    cp.physic_msg_timestamp = 100
    assert cp.get_min_timestamp() == 0
    assert cp.get_min_timestamp_index() == 0


def test_values_only_written_on_flush(tmp_path) -> None:
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp = 123
    assert open(path, "rb").read(8) == bytes(8)
    cp.flush()
    assert struct.unpack(">q", open(path, "rb").read(8))[0] == 123
    cp.shutdown()


def test_read_only(tmp_path) -> None:
    missing = str(tmp_path / "nope" / "checkpoint")
    cp = StoreCheckpoint(missing, read_only=True)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.confirm_phy_offset) == (0, 0, 0)
    cp.physic_msg_timestamp = 5
    cp.flush()
    cp.shutdown()
    assert not os.path.exists(missing)

    path = str(tmp_path / "checkpoint")
    w = StoreCheckpoint(path)
    w.index_msg_timestamp = 77
    w.confirm_phy_offset = 1 << 40
    w.flush()
    before = open(path, "rb").read()
    cp = StoreCheckpoint(path, read_only=True)
    assert cp.index_msg_timestamp == 77 and cp.confirm_phy_offset == 1 << 40
    cp.index_msg_timestamp = 1
    cp.shutdown()
    assert open(path, "rb").read() == before
    w.shutdown()


def test_4x_checkpoint_without_new_fields(tmp_path) -> None:
    """A 4.x file has only three meaningful longs; the 5.x fields read as zero and the page is kept."""
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">3q", 11, 22, 33) + bytes(4096 - 24))
    cp = StoreCheckpoint(str(path))
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (11, 22, 33)
    assert cp.master_flushed_offset == cp.confirm_phy_offset == 0
    cp.shutdown()
    assert os.path.getsize(path) == 4096
