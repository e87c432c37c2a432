"""`TimerWheel`: the timer wheel file, RocketMQ 5's `store/timer/TimerWheel.java` layout.

`<root>/timerwheel`: `slots_total * 2` slots of 32 bytes, big-endian: time (ms / precision) q, first pos q,
last pos q, number of units i, magic i. The slot of a delivery time is `(time / precision) % (2 *
slots_total)`; a slot whose stored time is another time is empty for this one (the wheel turns). First
and last pos point into the timer log, where the units of a slot are chained newest to oldest.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

from ..fsutil import fsync_directory

SLOT_SIZE = 32
SLOT = struct.Struct(">qqqii")


class Slot(NamedTuple):
    """One slot: its time and the chain of units in the timer log (-1 when empty)."""

    time_ms: int
    first_pos: int
    last_pos: int
    num: int
    magic: int


class TimerWheel:
    """The slots, memory-mapped (see the module docstring); nothing per timer is kept in Python memory."""

    def __init__(self, path: str, slots_total: int, precision_ms: int) -> None:
        self.path = path
        self.slots_total = slots_total
        self.precision_ms = precision_ms
        self.size = slots_total * 2 * SLOT_SIZE
        existed = os.path.exists(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        actual = os.fstat(self._fd).st_size
        if actual == 0:
            os.ftruncate(self._fd, self.size)
        elif actual != self.size:
            os.close(self._fd)
            raise ValueError(f"{path} is {actual} bytes, not the {self.size} of {slots_total} slots x 2 x 32: "
                             "open it with the slot count it was written with")
        if not existed:
            fsync_directory(os.path.dirname(path))
        self.mm = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_WRITE)

    def index(self, time_ms: int) -> int:
        return (time_ms // self.precision_ms) % (self.slots_total * 2)

    def get(self, time_ms: int) -> Slot:
        """The slot of `time_ms`, or an empty one when the stored slot belongs to another time."""
        slot = Slot(*SLOT.unpack_from(self.mm, self.index(time_ms) * SLOT_SIZE))
        if slot.time_ms != time_ms // self.precision_ms or slot.num <= 0:
            return Slot(time_ms // self.precision_ms, -1, -1, 0, 0)
        return slot

    def put(self, time_ms: int, first_pos: int, last_pos: int, num: int, magic: int = 0) -> None:
        SLOT.pack_into(self.mm, self.index(time_ms) * SLOT_SIZE, time_ms // self.precision_ms, first_pos, last_pos,
                       num, magic)

    def flush(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        self.flush()
        self.mm.close()
        os.close(self._fd)
