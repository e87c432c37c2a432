"""ConsumeQueue: the per-(topic, queueId) index of 20-byte units pointing into the commitlog (spec §6).

Directory `consumequeue/<topic>/<queueId>/`, files of `mapped_file_size` bytes (a multiple of 20) named by
their logical byte offset. Unit q lives at logical byte `q * 20`:
`[long commitLogOffset][int size][long tagsCode]`, big-endian.

One writer thread (the dispatcher) appends; any number of reader threads read. A unit's bytes are copied
into the mapping before the file's `wrote_position` moves past them, so a reader bounded by the read
position never sees a half-written unit.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from ..common import codec
from .config import CQ_STORE_UNIT_SIZE
from .mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger(__name__)

UNIT = struct.Struct(">qiq")
MSG_TAG_OFFSET_INDEX = 12
BLANK_UNIT_SIZE = 0x7FFFFFFF  # Integer.MAX_VALUE: the size field of a fillPreBlank unit
BLANK_UNIT = UNIT.pack(0, BLANK_UNIT_SIZE, 0)
UNIT_DTYPE = np.dtype([("o", ">i8"), ("s", ">i4"), ("t", ">i8")])
_LONG = struct.Struct(">q")
_OFFSET_SIZE = struct.Struct(">qi")

assert UNIT.size == CQ_STORE_UNIT_SIZE and UNIT_DTYPE.itemsize == CQ_STORE_UNIT_SIZE

_SMALL_BATCH = 256  # up to this many units, an in-order batch is packed with struct instead of numpy
_MIN_FAST_RUN = 8  # a shorter in-order run in a batch ...
_SLOW_STRETCH = 16  # ... makes the next this-many units go one by one (bounds the numpy overhead)

CqUnit = tuple[int, int, int]
PositionInfo = tuple[int, int, int, int]


def _is_blank(offset: int, size: int) -> bool:
    return offset == 0 and size == BLANK_UNIT_SIZE


class ConsumeQueue:
    """One consume queue `consumequeue/<topic>/<queueId>/`: RocketMQ's `ConsumeQueue` (simple CQ type).

    Maps a queue offset to the commitlog position, size and tags hash of a message, so consumers can
    read a queue in order and filter by tag without touching the commitlog.
    """

    # the fields `_native.dispatch_singles` reads and writes are slots (by offset, not by attribute look-up)
    __slots__ = ("read_only", "_max_physic_offset", "mapped_file_queue", "__dict__", "__weakref__")

    def __init__(self, topic: str, queue_id: int, store_path: str, mapped_file_size: int,
                 read_only: bool = False) -> None:
        if mapped_file_size <= 0 or mapped_file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"consume queue file size {mapped_file_size} must be a positive multiple of 20")
        self._topic = topic
        self._queue_id = queue_id
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.read_only = read_only
        self.queue_dir = os.path.join(store_path, topic, str(queue_id))
        self.mapped_file_queue = MappedFileQueue(self.queue_dir, mapped_file_size, read_only=read_only)
        self._max_physic_offset = -1
        self._min_logic_offset = 0
        # file_from_offset -> store time of the file's last unit (immutable once a later file exists)
        self._stop_timestamps: dict[int, int] = {}

    # -- properties ------------------------------------------------------------------------------
    @property
    def topic(self) -> str:
        return self._topic

    @property
    def queue_id(self) -> int:
        return self._queue_id

    @property
    def max_physic_offset(self) -> int:
        """End (offset + size) of the last commitlog record this queue points at; -1 when none."""
        return self._max_physic_offset

    @max_physic_offset.setter
    def max_physic_offset(self, value: int) -> None:
        self._max_physic_offset = value

    @property
    def min_logic_offset(self) -> int:
        """Logical byte offset of the first unit that points at a live commitlog record."""
        return self._min_logic_offset

    @min_logic_offset.setter
    def min_logic_offset(self, value: int) -> None:
        self._min_logic_offset = value

    # -- load / recover --------------------------------------------------------------------------
    def load(self) -> bool:
        """Map the queue's files (`ConsumeQueue.load`). In read-only mode also find where the data ends."""
        result = self.mapped_file_queue.load()
        log.info("load consume queue %s-%d %s", self._topic, self._queue_id, "OK" if result else "Failed")
        if result and self.read_only:
            self._scan_read_only()
        return result

    def refresh(self) -> None:
        """Read-only mode: pick up the units and files the writing process added since the last look.

        Positions only ever move forward, and a new file is published with its positions already set,
        so reader threads never see unscanned bytes as units."""
        if not self.read_only:
            return
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        # List first: a file the writer has rolled past is complete before the next one exists.
        names = mfq.list_segment_files()
        known = files[-1].file_from_offset if files else -1
        if files:
            last = files[-1]
            last.refresh_read_only()
            begin = last.wrote_position
            end = self._valid_end(last, begin, last.mapped_size)
            if end > begin:
                self._track_max_physic(last, end)
                last.set_positions(end)
        added: list[MappedFile] = []
        for name in names:
            if int(name) <= known:
                continue
            mf = MappedFile(os.path.join(mfq.store_path, name), self.mapped_file_size, read_only=True)
            end = self._valid_end(mf, 0, mf.mapped_size)
            mf.set_positions(end)
            if end:
                self._track_max_physic(mf, end)
            added.append(mf)
        if added:
            mfq.mapped_files = files + added
        if mfq.mapped_files and self._min_logic_offset < mfq.mapped_files[0].file_from_offset:
            self._min_logic_offset = mfq.mapped_files[0].file_from_offset

    def _scan_read_only(self) -> None:
        """Set every file's positions to the end of its valid units: a live writer's unwritten space is
        zero, so its size field is 0 and the unit is invalid."""
        files = self.mapped_file_queue.mapped_files
        for mf in files:
            end = self._valid_end(mf, 0, mf.mapped_size)
            mf.set_positions(end)
            if end:
                self._track_max_physic(mf, end)
        if files and self._min_logic_offset < files[0].file_from_offset:
            self._min_logic_offset = files[0].file_from_offset

    @staticmethod
    def _valid_end(mf: MappedFile, start: int, limit: int) -> int:
        """Position just after the last valid unit (offset >= 0 and size > 0) of the run starting at
        `start`, reading at most up to `limit`."""
        limit = min(limit, mf.mapped_size)
        n = max(0, (limit - start) // CQ_STORE_UNIT_SIZE)
        if n == 0:
            return start
        arr = np.frombuffer(mf.mm, dtype=UNIT_DTYPE, count=n, offset=start)
        try:
            bad = (arr["o"] < 0) | (arr["s"] <= 0)
            idx = int(np.argmax(bad)) if bad.any() else n
        finally:
            del arr
        return start + idx * CQ_STORE_UNIT_SIZE

    def _zero_stale_tail(self, mf: MappedFile, pos: int) -> bool:
        """Zero the bytes left behind a truncation point up to the last non-zero byte, so later scans
        (recovery, read-only readers) stop at `pos`. RocketMQ leaves them; only the unused region differs.
        True when there was something to clear."""
        if self.read_only or mf.mm is None or pos >= mf.mapped_size:
            return False
        tail = np.frombuffer(mf.mm, dtype=np.uint8, count=mf.mapped_size - pos, offset=pos)
        try:
            nz = np.flatnonzero(tail)
            if nz.size:
                tail_end = pos + int(nz[-1]) + 1
            else:
                return False
        finally:
            del tail
        mf.write_at(pos, bytes(tail_end - pos))
        return True

    def recover(self) -> bool:
        """Find the end of valid units from file index max(0, n-3) and truncate the rest (§6.4).

        True when non-zero bytes were dropped after that end (units after a hole or an invalid unit, or
        later files): the queue lost units that recovery must dispatch again."""
        if self.read_only:
            return False  # load() already found the end of the data
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        if not files:
            return False
        index = max(0, len(files) - 3)
        size = self.mapped_file_size
        while True:
            mf = files[index]
            end = self._valid_end(mf, 0, size)
            if end:
                self._track_max_physic(mf, end)
            process_offset = mf.file_from_offset + end
            if end == size:
                index += 1
                if index >= len(files):
                    log.info("recover last consume queue file over, last mapped file %s", mf.file_name)
                    break
                continue
            log.info("recover current consume queue over %s %d", mf.file_name, process_offset)
            break
        mfq.flushed_where = process_offset
        mfq.committed_where = process_offset
        dropped_files = sum(1 for f in files if f.file_from_offset > process_offset)
        mfq.truncate_dirty_files(process_offset)
        last = mfq.get_last_mapped_file_or_none()
        cleared = False
        if last is not None:
            cleared = self._zero_stale_tail(last, last.wrote_position)
        return cleared or dropped_files > 0

    def _track_max_physic(self, mf: MappedFile, end: int) -> None:
        """Set max_physic_offset from the last non-blank unit before `end` in this file (blank units
        point nowhere; counting them, as RocketMQ does, would make later real units look repeated)."""
        if end < CQ_STORE_UNIT_SIZE:
            return
        offset, size = _OFFSET_SIZE.unpack_from(mf.view, end - CQ_STORE_UNIT_SIZE)
        if not _is_blank(offset, size):
            self._max_physic_offset = offset + size
            return
        arr = np.frombuffer(mf.mm, dtype=UNIT_DTYPE, count=end // CQ_STORE_UNIT_SIZE)
        try:
            real = np.flatnonzero((arr["o"] != 0) | (arr["s"] != BLANK_UNIT_SIZE))
            if real.size:
                k = int(real[-1])
                self._max_physic_offset = int(arr["o"][k]) + int(arr["s"][k])
        finally:
            del arr

    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Drop units whose commitlog offset is at or beyond `phy_offset`, from the last file backwards
        (`truncateDirtyLogicFiles`; the comparison uses the unit's start offset)."""
        if self.read_only:
            return
        mfq = self.mapped_file_queue
        self._max_physic_offset = phy_offset
        self._stop_timestamps.clear()  # the last kept file's tail changes
        size = self.mapped_file_size
        while True:
            mf = mfq.get_last_mapped_file_or_none()
            if mf is None:
                break
            mf.set_positions(0)
            arr = np.frombuffer(mf.mm, dtype=UNIT_DTYPE, count=size // CQ_STORE_UNIT_SIZE)
            try:
                bad = (arr["o"] < 0) | (arr["s"] <= 0) | (arr["o"] >= phy_offset)
                keep = int(np.argmax(bad)) if bad.any() else len(arr)
            finally:
                del arr
            if keep == 0:
                log.info("on recover, destroy a logic mapped file %s", mf.file_name)
                mfq.delete_last_mapped_file()
                continue
            pos = keep * CQ_STORE_UNIT_SIZE
            mf.set_positions(pos)
            self._track_max_physic(mf, pos)
            self._zero_stale_tail(mf, pos)
            break
        if mfq.flushed_where > mfq.get_max_offset():
            mfq.flushed_where = mfq.committed_where = mfq.get_max_offset()

    def truncate_to_units(self, units: int) -> None:
        """Recovery: keep the first `units` queue offsets and drop the rest (a tail whose units do not
        match the commitlog records they point at)."""
        if self.read_only:
            return
        mfq = self.mapped_file_queue
        logical = units * CQ_STORE_UNIT_SIZE
        mfq.truncate_dirty_files(logical)
        self._stop_timestamps.clear()
        self._max_physic_offset = -1
        last = mfq.get_last_mapped_file_or_none()
        if last is not None:
            self._zero_stale_tail(last, last.wrote_position)
            for mf in reversed(mfq.mapped_files):
                if mf.wrote_position:
                    self._track_max_physic(mf, mf.wrote_position)
                    break
        if mfq.flushed_where > mfq.get_max_offset():
            mfq.flushed_where = mfq.committed_where = mfq.get_max_offset()
        if self._min_logic_offset > logical:
            self._min_logic_offset = logical

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        """Move min_logic_offset to the first unit pointing at or beyond `min_commit_log_offset` (§6.4)."""
        mfq = self.mapped_file_queue
        last = mfq.get_last_mapped_file_or_none()
        if last is None:
            self._min_logic_offset = 0
            self._max_physic_offset = -1
            return
        if self._min_logic_offset > mfq.get_max_offset():
            log.warning("ConsumeQueue[%s-%d] contains no valid entries", self._topic, self._queue_id)
            return
        max_index = self.get_max_offset_in_queue()
        last_unit = self._read_unit(max_index - 1)
        if last_unit is not None and last_unit[0] < min_commit_log_offset:
            # The queue has no live entry but keeps its max: min points at the next slot.
            self._min_logic_offset = max_index * CQ_STORE_UNIT_SIZE
            return
        files = mfq.mapped_files
        for mf in files:
            start = self._min_logic_offset - mf.file_from_offset
            intact = start >= 0  # searching from the previous min; it may still be right
            if start < 0:
                start = 0
            read_pos = mf.get_read_position()
            if start >= mf.file_size:
                continue
            if start > read_pos:
                log.error("[Bug][InconsistentState] ConsumeQueue file %s should have been deleted", mf.file_name)
                return
            n = (read_pos - start) // CQ_STORE_UNIT_SIZE
            if n <= 0:
                return
            view = mf.view

            def key(k: int, view: memoryview = view, start: int = start) -> int:
                return _LONG.unpack_from(view, start + k * CQ_STORE_UNIT_SIZE)[0]

            if intact and key(0) >= min_commit_log_offset:
                return  # the previous min is still valid
            k = bisect.bisect_left(range(n), min_commit_log_offset, key=key)
            if k < n:
                self._min_logic_offset = mf.file_from_offset + start + k * CQ_STORE_UNIT_SIZE
                log.info("Compute logical min offset: %d, topic: %s, queueId: %d",
                         self.get_min_offset_in_queue(), self._topic, self._queue_id)
                return
            if read_pos < mf.file_size:
                return

    def get_last_offset(self) -> int:
        """End (offset + size) of the commitlog record the last unit points at; -1 when there is none."""
        unit = self._read_unit(self.get_max_offset_in_queue() - 1)
        if unit is None or unit[0] < 0 or unit[1] <= 0 or _is_blank(unit[0], unit[1]):
            return -1
        return unit[0] + unit[1]

    # -- writing ---------------------------------------------------------------------------------
    def put_message_position_info(self, offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """Append one unit with RocketMQ's rules (§6.3). True also for a repeated build (a no-op)."""
        if self.read_only:
            return False
        if offset + size <= self._max_physic_offset:
            log.debug("Maybe try to build consume queue repeatedly maxPhysicOffset=%d phyOffset=%d",
                      self._max_physic_offset, offset)
            return True
        expect_logic_offset = cq_offset * CQ_STORE_UNIT_SIZE
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file(expect_logic_offset)
        if mf is None:
            return False
        if mf.first_create_in_queue and cq_offset != 0 and mf.wrote_position == 0:
            self._min_logic_offset = expect_logic_offset
            mfq.flushed_where = expect_logic_offset
            mfq.committed_where = expect_logic_offset
            self._fill_pre_blank(mf, expect_logic_offset)
            log.info("fill pre blank space %s %d %d", mf.file_name, expect_logic_offset, mf.wrote_position)
        if cq_offset != 0:
            current_logic_offset = mf.file_from_offset + mf.wrote_position
            if expect_logic_offset < current_logic_offset:
                log.warning("Build consume queue repeatedly, expectLogicOffset: %d currentLogicOffset: %d "
                            "Topic: %s QID: %d", expect_logic_offset, current_logic_offset,
                            self._topic, self._queue_id)
                return True
            if expect_logic_offset != current_logic_offset:
                log.warning("[BUG]logic queue order maybe wrong, expectLogicOffset: %d currentLogicOffset: %d "
                            "Topic: %s QID: %d Diff: %d", expect_logic_offset, current_logic_offset,
                            self._topic, self._queue_id, expect_logic_offset - current_logic_offset)
        self._max_physic_offset = offset + size
        return mf.append_message(UNIT.pack(offset, size, tags_code))

    def _fill_pre_blank(self, mf: MappedFile, until_where: int) -> None:
        until = until_where % self.mapped_file_size
        if until:
            mf.append_message(BLANK_UNIT * (until // CQ_STORE_UNIT_SIZE))

    def put_message_position_infos(self, units: Sequence[PositionInfo] | np.ndarray) -> int:
        """Append many `(commitLogOffset, size, tagsCode, cqOffset)` units for this queue at once.

        Same rules as `put_message_position_info`, unit by unit, but a run of in-order units is packed
        with numpy and copied with one write per file. Returns how many units were handled (written or
        skipped as repeats), stopping at the first that could not be written; `len(units)` on success.
        """
        n = len(units)
        if n == 0 or self.read_only:
            return 0
        if isinstance(units, np.ndarray):
            arr = np.asarray(units, dtype=np.int64).reshape(n, 4)
            if codec.native is not None and self._put_in_order_native(arr):
                return n
        else:
            if n <= _SMALL_BATCH and self._put_small_in_order(units):
                return n
            if n < 4:
                return self._put_slowly(units, 0)
            arr = np.fromiter(chain.from_iterable(units), dtype=np.int64, count=4 * n).reshape(n, 4)
        o, s, t, q = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
        end = o + s
        mfq = self.mapped_file_queue
        i = 0
        while i < n:
            last = mfq.get_last_mapped_file_or_none()
            current = last.file_from_offset + last.wrote_position if last is not None else -1
            fresh = last is None or (last.first_create_in_queue and last.wrote_position == 0)
            # 1. Leading repeats: nothing changes while units are skipped, so this is exact.
            built = end[i:] <= self._max_physic_offset
            repeat = built
            if not fresh:
                repeat = built | ((q[i:] != 0) & (q[i:] * CQ_STORE_UNIT_SIZE < current))
            if repeat[0]:
                skipped = len(repeat) if repeat.all() else int(np.argmin(repeat))
                if last is not None and last.is_full() and not built[:skipped].all():
                    # A unit skipped for its queue offset has already asked for the file to write to,
                    # which rolls a full last file (as RocketMQ's getLastMappedFile does).
                    mfq.get_last_mapped_file(current)
                i += skipped
                if i == n:
                    return n
            # 2. A unit that needs the full rules (new queue, fillPreBlank, gap) goes the slow way.
            if fresh or q[i] * CQ_STORE_UNIT_SIZE != current:
                if not self.put_message_position_info(int(o[i]), int(s[i]), int(t[i]), int(q[i])):
                    return i
                i += 1
                continue
            # 3. The in-order run: consecutive queue offsets from `current`, strictly growing record
            # ends (unit i itself qualifies: it is not a repeat and sits at `current`).
            seg_end = end[i:]
            seg_q = q[i:]
            good = seg_q == seg_q[0] + np.arange(len(seg_q), dtype=np.int64)
            good[1:] &= seg_end[1:] > seg_end[:-1]
            k = len(good) if good.all() else int(np.argmin(good))
            packed = np.empty(k, dtype=UNIT_DTYPE)
            packed["o"] = o[i:i + k]
            packed["s"] = s[i:i + k]
            packed["t"] = t[i:i + k]
            written = self._append_run(packed.view(np.uint8), current) // CQ_STORE_UNIT_SIZE
            if written:
                self._max_physic_offset = int(end[i + written - 1])
            if written < k:
                return i + written
            i += k
            if k < _MIN_FAST_RUN and i < n:
                # An irregular stretch: a few units the plain way before trying numpy again.
                upto = min(n, i + _SLOW_STRETCH)
                for j in range(i, upto):
                    if not self.put_message_position_info(int(o[j]), int(s[j]), int(t[j]), int(q[j])):
                        return j
                i = upto
        return n

    def _put_small_in_order(self, units: Sequence[PositionInfo]) -> bool:
        """A small batch that is entirely in order and fits in the current file, without numpy: one
        write. False (nothing written) when any unit needs the full rules."""
        last = self.mapped_file_queue.get_last_mapped_file_or_none()
        if last is None or (last.first_create_in_queue and last.wrote_position == 0):
            return False
        wrote = last.wrote_position
        if wrote + len(units) * CQ_STORE_UNIT_SIZE > last.file_size:
            return False
        expect_q = (last.file_from_offset + wrote) // CQ_STORE_UNIT_SIZE
        prev_end = self._max_physic_offset
        pack = UNIT.pack
        parts = []
        for offset, size, tags_code, cq_offset in units:
            end = offset + size
            if cq_offset != expect_q or end <= prev_end:
                return False
            parts.append(pack(offset, size, tags_code))
            prev_end = end
            expect_q += 1
        self._max_physic_offset = prev_end
        return last.append_message(b"".join(parts))

    def put_units_packed(self, units: bytes) -> int:
        """`put_message_position_infos` of units given as native int64 rows in a bytes object (what the
        native `group_units` and `codec.DispatchColumns` hand over): checked and packed in C straight from
        the bytes when they go in order into the current file, else through the array path."""
        n = len(units) // 32
        if n == 0 or self.read_only:
            return 0
        if codec.native is not None and self._put_in_order_native(units, n):
            return n
        return self.put_message_position_infos(np.frombuffer(units, dtype=np.int64).reshape(n, 4))

    def _put_in_order_native(self, arr: np.ndarray | bytes, n: int | None = None) -> bool:
        """`_put_small_in_order` for an int64 `(n, 4)` array (or its `n` rows as bytes), checked and packed
        in C (any size that fits in the current file). False (nothing written) when any unit needs the
        full rules."""
        last = self.mapped_file_queue.get_last_mapped_file_or_none()
        if last is None or (last.first_create_in_queue and last.wrote_position == 0):
            return False
        wrote = last.wrote_position
        if wrote + (len(arr) if n is None else n) * CQ_STORE_UNIT_SIZE > last.file_size:
            return False
        packed = codec.native.cq_pack(arr if n is not None else np.ascontiguousarray(arr),
                                      (last.file_from_offset + wrote) // CQ_STORE_UNIT_SIZE, self._max_physic_offset)
        if packed is None:
            return False
        self._max_physic_offset = packed[1]
        return last.append_message(packed[0])

    def _append_run(self, data: np.ndarray, logic_offset: int) -> int:
        """Copy whole units into the last file(s) starting at `logic_offset`, rolling files as they fill;
        returns the bytes written."""
        mfq = self.mapped_file_queue
        mv = memoryview(data)
        total = len(mv)
        done = 0
        try:
            while done < total:
                mf = mfq.get_last_mapped_file(logic_offset + done)
                if mf is None:
                    break
                room = mf.file_size - mf.wrote_position
                chunk = min(room, total - done)
                if chunk <= 0 or not mf.append_message(mv[done:done + chunk]):
                    break
                done += chunk
        finally:
            mv.release()
        return done

    def _put_slowly(self, units: Sequence[PositionInfo] | np.ndarray, start: int) -> int:
        for i in range(start, len(units)):
            o, s, t, q = (int(v) for v in units[i])
            if not self.put_message_position_info(o, s, t, q):
                return i
        return len(units)

    def initialize_with_offset(self, offset: int, min_phy_offset: int = 0) -> None:
        """Restart this queue empty at queue offset `offset` (`initializeWithOffset`): the files are
        destroyed and the new first file is blank-filled up to the offset."""
        self.destroy()
        logic = offset * CQ_STORE_UNIT_SIZE
        self._min_logic_offset = logic
        mf = self.mapped_file_queue.get_last_mapped_file(logic)
        if mf is not None:
            self._fill_pre_blank(mf, logic)
        self.flush(0)

    # -- offsets ---------------------------------------------------------------------------------
    def get_max_offset_in_queue(self) -> int:
        """One past the last unit's queue offset."""
        return self.mapped_file_queue.get_max_offset() // CQ_STORE_UNIT_SIZE

    def get_min_offset_in_queue(self) -> int:
        return self._min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_message_total_in_queue(self) -> int:
        return self.get_max_offset_in_queue() - self.get_min_offset_in_queue()

    def roll_next_file(self, index: int) -> int:
        """The first queue offset of the file after the one holding `index`."""
        units_per_file = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        return index + units_per_file - index % units_per_file

    # -- reading ---------------------------------------------------------------------------------
    def get_unit(self, index: int) -> CqUnit | None:
        """The `(commitLogOffset, size, tagsCode)` unit at queue offset `index`, or None when it is below
        the min offset or not readable."""
        if index * CQ_STORE_UNIT_SIZE < self._min_logic_offset:
            return None
        return self._read_unit(index)

    def _read_unit(self, index: int) -> CqUnit | None:
        if index < 0:
            return None
        logic = index * CQ_STORE_UNIT_SIZE
        mf = self.mapped_file_queue.find_mapped_file_by_offset(logic)
        if mf is None:
            return None
        pos = logic % self.mapped_file_size
        if pos + CQ_STORE_UNIT_SIZE > mf.get_read_position():
            return None
        try:
            return UNIT.unpack_from(mf.view, pos)
        except (ValueError, struct.error):  # the file was closed under us
            return None

    def get_units(self, start_index: int, max_count: int) -> list[CqUnit]:
        """Up to `max_count` units from `start_index` on, from the one file holding it, stopping at the
        readable end (like RocketMQ's iterator over one consume queue file)."""
        if start_index < 0 or max_count <= 0:
            return []
        logic = start_index * CQ_STORE_UNIT_SIZE
        if logic < self._min_logic_offset:
            return []
        mf = self.mapped_file_queue.find_mapped_file_by_offset(logic)
        if mf is None:
            return []
        pos = logic % self.mapped_file_size
        end = min(mf.get_read_position(), pos + max_count * CQ_STORE_UNIT_SIZE)
        if end <= pos:
            return []
        try:
            return list(UNIT.iter_unpack(mf.view[pos:end]))
        except (ValueError, struct.error):
            return []

    def get_units_raw(self, start_index: int, max_count: int) -> bytes:
        """`get_units` as the stored bytes (20 per unit, big-endian offset / size / tags code): what the
        native pull read (`_native.read_runs`) walks, without a tuple per unit."""
        if start_index < 0 or max_count <= 0:
            return b""
        logic = start_index * CQ_STORE_UNIT_SIZE
        if logic < self._min_logic_offset:
            return b""
        mf = self.mapped_file_queue.find_mapped_file_by_offset(logic)
        if mf is None:
            return b""
        pos = logic % self.mapped_file_size
        end = min(mf.get_read_position(), pos + max_count * CQ_STORE_UNIT_SIZE)
        if end <= pos or (end - pos) % CQ_STORE_UNIT_SIZE:  # get_units' iter_unpack fails on a partial unit
            return b""
        try:
            return bytes(mf.view[pos:end])
        except ValueError:  # the file was closed under us
            return b""

    def get_offset_in_queue_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int]) -> int:
        """The first queue offset whose message was stored at or after `timestamp` (`getOffsetInQueueByTime`,
        lower boundary); the max offset when every message is older, 0 for an empty queue.

        `store_time_of(phy_offset, size)` returns the commitlog store time, or -1 when the record is gone
        (units pointing at deleted records count as older than any timestamp).
        """
        files = self.mapped_file_queue.mapped_files
        if not files:
            return 0
        size = self.mapped_file_size
        chosen = files[-1]
        for mf in files[:-1]:
            stop = self._stop_timestamps.get(mf.file_from_offset)
            if stop is None:
                try:
                    offset, usize = _OFFSET_SIZE.unpack_from(mf.view, size - CQ_STORE_UNIT_SIZE)
                except (ValueError, struct.error):
                    continue
                stop = store_time_of(offset, usize)
                if stop > 0:
                    self._stop_timestamps[mf.file_from_offset] = stop
            if stop >= timestamp:
                chosen = mf
                break
        mf = chosen
        low = max(0, self._min_logic_offset - mf.file_from_offset)
        read_pos = mf.get_read_position()
        n = (read_pos - low) // CQ_STORE_UNIT_SIZE
        if n <= 0:
            return (mf.file_from_offset + max(low, read_pos)) // CQ_STORE_UNIT_SIZE
        view = mf.view

        def store_time(k: int) -> int:
            offset, usize = _OFFSET_SIZE.unpack_from(view, low + k * CQ_STORE_UNIT_SIZE)
            return -1 if _is_blank(offset, usize) else store_time_of(offset, usize)

        try:
            if store_time(n - 1) < timestamp:
                return (mf.file_from_offset + low) // CQ_STORE_UNIT_SIZE + n
            k = bisect.bisect_left(range(n), timestamp, key=store_time)
        except (ValueError, struct.error):
            return 0
        return (mf.file_from_offset + low) // CQ_STORE_UNIT_SIZE + k

    # -- maintenance -----------------------------------------------------------------------------
    def flush(self, least_pages: int) -> bool:
        """Flush one file's written pages (`MappedFileQueue.flush`); True when nothing moved."""
        if self.read_only:
            return True
        return self.mapped_file_queue.flush(least_pages)

    def delete_expired_file(self, min_commit_log_offset: int) -> int:
        """Delete files whose every unit points below the commitlog min offset, then correct the min."""
        if self.read_only:
            return 0
        count = self.mapped_file_queue.delete_expired_file_by_offset(min_commit_log_offset, CQ_STORE_UNIT_SIZE)
        self.correct_min_offset(min_commit_log_offset)
        return count

    def get_total_size(self) -> int:
        return self.mapped_file_queue.get_mapped_memory_size()

    def destroy(self) -> None:
        """Delete every file of this queue and reset the in-memory offsets."""
        self._max_physic_offset = -1
        self._min_logic_offset = 0
        self._stop_timestamps.clear()
        if self.read_only:
            self.mapped_file_queue.shutdown()
            self.mapped_file_queue.mapped_files = []
            return
        self.mapped_file_queue.destroy()

    def shutdown(self) -> None:
        self.mapped_file_queue.shutdown()

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self._topic}-{self._queue_id}, min={self.get_min_offset_in_queue()}, "
                f"max={self.get_max_offset_in_queue()}, maxPhysic={self._max_physic_offset})")
