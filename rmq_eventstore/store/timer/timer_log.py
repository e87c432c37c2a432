"""`TimerLog`: the timer log, RocketMQ 5's `store/timer/TimerLog.java` layout.

Mapped files under `<root>/timerlog/` of 52-byte units, big-endian:

    size i (52) | prev pos q | magic i | write time q | delay i | commitlog offset q | size q-py i |
    hash of the real topic i | reserved q

`prev pos` chains the units of one wheel slot, newest to oldest; `delay` is the delivery time minus the
write time; magic DEFAULT 1, ROLL 2, DELETE 4. A unit never straddles two files: the rest of a file that
cannot hold one more is a blank unit (size = the rest, magic `BLANK_MAGIC_CODE`). The log is also the redo
log of the wheel: recovery replays the units written after the checkpoint onto the wheel.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

from ..mapped_file import MappedFileQueue

UNIT_SIZE = 52
UNIT = struct.Struct(">iqiqiqiiq")
MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE = 1, 2, 4
BLANK_MAGIC_CODE = -875286124  # 0xBBCCDDEE ^ (1880681586 + 8) as Java computes it: the commitlog's BLANK
_HEAD = struct.Struct(">iqi")


class TimerUnit(NamedTuple):
    """One unit of the timer log."""

    size: int
    prev_pos: int
    magic: int
    write_time: int
    delay: int
    offset_py: int
    size_py: int
    hash_topic: int
    reserved: int

    @property
    def deliver_ms(self) -> int:
        return self.write_time + self.delay


class TimerLog:
    """Append-only timer units in mapped files (see the module docstring)."""

    def __init__(self, store_path: str, file_size: int) -> None:
        if file_size < UNIT_SIZE * 2:
            raise ValueError(f"timer log files must hold at least two units, not {file_size} bytes")
        self.queue = MappedFileQueue(store_path, file_size)
        self.file_size = file_size

    def load(self) -> None:
        """Map the files and find the end: the first zeroed unit of the last file."""
        os.makedirs(self.queue.store_path, exist_ok=True)
        self.queue.load()
        last = self.queue.get_last_mapped_file_or_none()
        if last is None:
            return
        pos = 0
        view = last.view
        while pos + UNIT_SIZE <= self.file_size:
            size, _, magic = _HEAD.unpack_from(view, pos)
            if size == UNIT_SIZE and magic in (MAGIC_DEFAULT, MAGIC_ROLL, MAGIC_DELETE, MAGIC_DEFAULT | MAGIC_ROLL):
                pos += UNIT_SIZE
            elif magic == BLANK_MAGIC_CODE and 0 < size <= self.file_size - pos:
                pos += size
                break
            else:
                break
        last.set_positions(pos)
        for f in self.queue.mapped_files[:-1]:
            f.set_positions(self.file_size)

    def append(self, unit: TimerUnit) -> int:
        """Write a unit; its absolute position."""
        data = UNIT.pack(*unit)
        mf = self.queue.get_last_mapped_file()
        assert mf is not None
        rest = self.file_size - mf.wrote_position
        if rest < UNIT_SIZE:
            if rest > 0:
                blank = bytearray(rest)
                if rest >= _HEAD.size:
                    _HEAD.pack_into(blank, 0, rest, 0, BLANK_MAGIC_CODE)
                mf.append_message(blank)
            mf = self.queue.get_last_mapped_file()
            assert mf is not None
        pos = mf.file_from_offset + mf.wrote_position
        if not mf.append_message(data):
            raise OSError(f"could not append to the timer log file {mf.file_name}")
        return pos

    def read(self, pos: int) -> TimerUnit | None:
        mf = self.queue.find_mapped_file_by_offset(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel + UNIT_SIZE > self.file_size:
            return None
        unit = TimerUnit(*UNIT.unpack_from(mf.view, rel))
        return unit if unit.size == UNIT_SIZE else None

    def iter_from(self, pos: int) -> Iterator[tuple[int, TimerUnit]]:
        """The units from `pos` to the end, blanks skipped."""
        end = self.max_offset()
        while pos < end:
            mf = self.queue.find_mapped_file_by_offset(pos)
            if mf is None:
                return
            rel = pos - mf.file_from_offset
            if rel + UNIT_SIZE > self.file_size:
                pos = mf.file_from_offset + self.file_size
                continue
            unit = TimerUnit(*UNIT.unpack_from(mf.view, rel))
            if unit.magic == BLANK_MAGIC_CODE or unit.size != UNIT_SIZE:
                pos = mf.file_from_offset + self.file_size
                continue
            yield pos, unit
            pos += UNIT_SIZE

    def max_offset(self) -> int:
        return self.queue.get_max_offset()

    def flush(self) -> None:
        self.queue.flush(0)

    def shutdown(self) -> None:
        self.queue.flush(0)
        self.queue.shutdown()
