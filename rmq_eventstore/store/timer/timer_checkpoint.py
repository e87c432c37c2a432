"""`TimerCheckpoint`: `<root>/config/timercheck`, RocketMQ 5's layout: last read time q, last timer-log flush
position q, last timer queue offset q, master timer queue offset q, then the data version (state version q,
timestamp q, counter q). Written whole to a temporary file, fsynced and renamed: old or new, never torn."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from ..fsutil import fsync_directory

_LAYOUT = struct.Struct(">qqqqqqq")


@dataclass
class TimerCheckpoint:
    """Where the timer store's two services are: the dequeue's next time and the enqueue's positions."""

    path: str
    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    master_timer_queue_offset: int = 0
    counter: int = 0

    @classmethod
    def load(cls, path: str) -> TimerCheckpoint:
        cp = cls(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read(_LAYOUT.size)
        except FileNotFoundError:
            return cp
        if len(data) == _LAYOUT.size:
            (cp.last_read_time_ms, cp.last_timer_log_flush_pos, cp.last_timer_queue_offset,
             cp.master_timer_queue_offset, _, _, cp.counter) = _LAYOUT.unpack(data)
        return cp

    def flush(self) -> None:
        self.counter += 1
        data = _LAYOUT.pack(self.last_read_time_ms, self.last_timer_log_flush_pos, self.last_timer_queue_offset,
                            self.master_timer_queue_offset, 0, int(time.time() * 1000), self.counter)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_directory(os.path.dirname(self.path))
