"""StoreCheckpoint: the 4096-byte `<root>/checkpoint` file (spec §8).

Five big-endian longs at 0/8/16/24/32: physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp,
masterFlushedOffset (5.0.0+) and confirmPhyOffset (5.1.1+); the rest of the page is zero. The values are
read once at load, updated in memory, and written back and forced by `flush()`.
"""

from __future__ import annotations

import logging
import os
import struct
import threading

log = logging.getLogger(__name__)

CHECKPOINT_FILE_SIZE = 4096  # OS_PAGE_SIZE: RocketMQ maps exactly one page
_FIELDS = struct.Struct(">qqqqq")


class StoreCheckpoint:
    """RocketMQ's `StoreCheckpoint`: how far the commitlog, consume queues and index are known durable.

    Recovery uses the timestamps to decide where an abnormal recovery may start, and 5.1.x keeps the
    confirmed commitlog offset here. `read_only` never creates, extends or writes the file.
    """

    def __init__(self, path: str, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.Lock()
        self._fd = -1
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        data = b""
        if read_only:
            try:
                with open(path, "rb") as f:
                    data = f.read(_FIELDS.size)
            except FileNotFoundError:
                data = b""
        else:
            existed = os.path.exists(path)
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            size = os.fstat(self._fd).st_size
            if size < CHECKPOINT_FILE_SIZE:
                os.ftruncate(self._fd, CHECKPOINT_FILE_SIZE)
            if not existed:
                os.fsync(self._fd)
                log.info("store checkpoint file %s created", path)
            data = os.pread(self._fd, _FIELDS.size, 0)
        # A shorter (pre-5.x) or missing file reads its absent fields as zero.
        data = data + bytes(_FIELDS.size - len(data))
        (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
         self.master_flushed_offset, self.confirm_phy_offset) = _FIELDS.unpack(data)
        log.info("store checkpoint physicMsgTimestamp=%d logicsMsgTimestamp=%d indexMsgTimestamp=%d "
                 "masterFlushedOffset=%d confirmPhyOffset=%d", self.physic_msg_timestamp,
                 self.logics_msg_timestamp, self.index_msg_timestamp, self.master_flushed_offset,
                 self.confirm_phy_offset)

    def _pack(self) -> bytes:
        return _FIELDS.pack(self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
                            self.master_flushed_offset, self.confirm_phy_offset)

    def flush(self) -> None:
        """Write the five values at offset 0 and force them to disk."""
        if self.read_only:
            return
        with self._lock:
            if self._fd < 0:
                return
            os.pwrite(self._fd, self._pack(), 0)
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                log.error("failed to force the store checkpoint %s: %s", self.path, e)

    def get_min_timestamp(self) -> int:
        """`max(0, min(physic, logics) - 3000)`: the store time recovery can trust (3 s safety margin)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def get_min_timestamp_index(self) -> int:
        """Like `get_min_timestamp` but also bounded by the index's flushed timestamp."""
        return min(self.get_min_timestamp(), self.index_msg_timestamp)

    def shutdown(self) -> None:
        """Flush the values and close the file."""
        self.flush()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __repr__(self) -> str:
        return (f"StoreCheckpoint(physic={self.physic_msg_timestamp}, logics={self.logics_msg_timestamp}, "
                f"index={self.index_msg_timestamp}, masterFlushed={self.master_flushed_offset}, "
                f"confirmPhy={self.confirm_phy_offset})")
