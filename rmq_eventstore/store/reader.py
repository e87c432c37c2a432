"""StoreReader: a read-only view of a store directory, for offline tools and readers beside a live writer.

It never takes the lock, never writes a byte and never truncates: it maps what is on disk, reads only
complete records, and stops at zeroed space, a BLANK record or damage. It opens directories written by
Apache RocketMQ itself (4.x and 5.x) as well as ours, inferring segment sizes from the files, so an
operator can inspect, query and dump a broker's store without starting one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..common import codec
from ..common.message import MessageExt
from ..common.topic import is_valid_topic
from .checkpoint import StoreCheckpoint
from .config import CQ_STORE_UNIT_SIZE
from .consume_queue import ConsumeQueue
from .index import IndexService
from .mapped_file import MappedFile, MappedFileQueue

DEFAULT_CQ_FILE_SIZE = 300_000 * CQ_STORE_UNIT_SIZE


def _segment_size(directory: str) -> int | None:
    """The segment size of a directory of 20-digit files: the gap between names, else the file size."""
    try:
        names = sorted((n for n in os.listdir(directory) if n.isdigit()), key=int)
    except FileNotFoundError:
        return None
    if not names:
        return None
    if len(names) >= 2:
        gap = int(names[1]) - int(names[0])
        if gap > 0:
            return gap
    return os.path.getsize(os.path.join(directory, names[0])) or None


@dataclass
class SegmentInfo:
    """One commitlog segment as found on disk."""

    name: str
    from_offset: int
    file_size: int
    valid_end: int  # absolute offset just after the last complete record
    records: int
    ends_with_blank: bool
    damage: str


class StoreReader:
    """Read-only access to a store root (or to a bare commitlog directory).

    `path` may be a store root (with `commitlog/`, `consumequeue/`, `index/`, `checkpoint`) or a directory
    holding commitlog segment files directly.
    """

    def __init__(self, path: str | os.PathLike[str], commit_log_file_size: int | None = None,
                 hash_slot_num: int | None = None, index_num: int | None = None) -> None:
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no store directory at {path}")
        if os.path.isdir(os.path.join(path, "commitlog")):
            self.root = path
            self.commit_log_path = os.path.join(path, "commitlog")
        elif any(n.isdigit() and len(n) >= 20 for n in os.listdir(path)):
            self.root = None
            self.commit_log_path = path
        else:
            raise FileNotFoundError(f"{path} holds neither a commitlog/ directory nor commitlog segment files")
        size = commit_log_file_size or _segment_size(self.commit_log_path) or 1024 * 1024 * 1024
        self.file_size = size
        self.commit_log = MappedFileQueue(self.commit_log_path, size, read_only=True)
        self.commit_log.load()
        self._valid_end: int | None = None
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._index: IndexService | None = None
        self._index_geometry = (hash_slot_num, index_num) if hash_slot_num and index_num else None

    # -- layout ----------------------------------------------------------------------------------
    @property
    def consume_queue_path(self) -> str | None:
        return os.path.join(self.root, "consumequeue") if self.root else None

    @property
    def index_path(self) -> str | None:
        return os.path.join(self.root, "index") if self.root else None

    def refresh(self) -> None:
        """Pick up what a live writer appended since the last look."""
        self.commit_log.refresh_read_only()
        self._valid_end = None
        for cq in self._cqs.values():
            cq.refresh()
        if self._index is not None:
            self._index.refresh_read_only()

    def segments(self, check_crc: bool = False) -> list[SegmentInfo]:
        """Scan every segment: where its valid records end, how many, and any damage found."""
        return [scan_segment(mf, check_crc) for mf in self.commit_log.mapped_files]

    def min_offset(self) -> int:
        mf = self.commit_log.get_first_mapped_file()
        return mf.file_from_offset if mf else 0

    def valid_end(self) -> int:
        """Offset just after the last complete record of the log (the recovered max offset)."""
        if self._valid_end is None:
            end = self.min_offset()
            for seg in self.segments():
                end = seg.valid_end
                if not seg.ends_with_blank:
                    break
            self._valid_end = end
        return self._valid_end

    # -- commitlog --------------------------------------------------------------------------------
    def iter_records(self, start: int | None = None, end: int | None = None,
                     check_crc: bool = False) -> Iterator[tuple[int, codec.CheckResult]]:
        """(offset, check result) for every record from `start`, rolling over BLANK records."""
        offset = self.min_offset() if start is None else start
        stop = end if end is not None else float("inf")
        while offset < stop:
            mf = self.commit_log.find_mapped_file_by_offset(offset)
            if mf is None:
                return
            pos = offset - mf.file_from_offset
            rolled = False
            for p, r in codec.iter_records(mf.view, pos, mf.mapped_size, check_crc):
                abs_off = mf.file_from_offset + p
                if abs_off >= stop:
                    return
                if r.success and r.size > 0:
                    yield abs_off, r
                elif r.success:
                    offset = mf.file_from_offset + self.file_size
                    rolled = True
                    break
                else:
                    if not is_zero(mf.view, p):
                        yield abs_off, r
                    return
            if not rolled:
                return

    def iter_messages(self, topic: str | None = None, queue_id: int | None = None,
                      start: int | None = None, end: int | None = None) -> Iterator[MessageExt]:
        for off, r in self.iter_records(start, end):
            if not r.success:
                return
            req = r.request
            if topic is not None and req.topic != topic:
                continue
            if queue_id is not None and req.queue_id != queue_id:
                continue
            msg = self.look_message_by_offset(off, r.size)
            if msg is not None:
                yield msg

    def look_message_by_offset(self, offset: int, size: int | None = None) -> MessageExt | None:
        mf = self.commit_log.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        try:
            return codec.decode_message(mf.view, pos, limit=mf.mapped_size)
        except codec.CorruptRecordError:
            return None

    def view_message_by_id(self, msg_id: str) -> MessageExt | None:
        _h, _p, offset = codec.decode_message_id(msg_id)
        return self.look_message_by_offset(offset)

    # -- consume queues ---------------------------------------------------------------------------
    def topics(self) -> list[str]:
        """Topics that have consume queue directories (or, for a bare commitlog, appear in records)."""
        cqp = self.consume_queue_path
        if cqp and os.path.isdir(cqp):
            return sorted(t for t in os.listdir(cqp) if os.path.isdir(os.path.join(cqp, t)) and is_valid_topic(t))
        return sorted({r.request.topic for _, r in self.iter_records() if r.success})

    def queue_ids(self, topic: str) -> list[int]:
        cqp = self.consume_queue_path
        if not cqp or not is_valid_topic(topic):
            return []
        tdir = os.path.join(cqp, topic)
        if not os.path.isdir(tdir):
            return []
        return sorted(int(q) for q in os.listdir(tdir) if q.isdigit())

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None:
            if queue_id not in self.queue_ids(topic):
                return None
            qdir = os.path.join(self.consume_queue_path or "", topic, str(queue_id))
            size = _segment_size(qdir) or DEFAULT_CQ_FILE_SIZE
            cq = ConsumeQueue(topic, queue_id, self.consume_queue_path or "", size, read_only=True)
            cq.load()
            self._cqs[key] = cq
        return cq

    def iter_queue(self, topic: str, queue_id: int, start: int = 0) -> Iterator[tuple[int, MessageExt | None]]:
        """(queue offset, message) along a consume queue; None where the commitlog no longer has it."""
        cq = self.consume_queue(topic, queue_id)
        if cq is None:
            return
        offset = max(start, cq.get_min_offset_in_queue())
        end = cq.get_max_offset_in_queue()
        while offset < end:
            units = cq.get_units(offset, 4096)
            if not units:
                offset = cq.roll_next_file(offset)
                continue
            for i, (phy, size, _tags) in enumerate(units):
                if size <= 0 or size == 0x7FFFFFFF:
                    continue
                yield offset + i, self.look_message_by_offset(phy, size)
            offset += len(units)

    # -- index ------------------------------------------------------------------------------------
    def index_service(self) -> IndexService | None:
        if self._index is None:
            ip = self.index_path
            if not ip or not os.path.isdir(ip) or not os.listdir(ip):
                return None
            slots, num = self._index_geometry or infer_index_geometry(ip)
            self._index = IndexService(ip, slots, num, read_only=True)
            self._index.load(True)
        return self._index

    def query_message(self, topic: str, key: str, max_num: int = 64,
                      begin: int = 0, end: int = 2**62) -> tuple[list[MessageExt], str]:
        """Messages of `topic` with KEYS or UNIQ_KEY `key`; uses the index when present, else a scan.

        Returns (messages, how) where how is "index" or "scan".
        """
        idx = self.index_service()
        out: list[MessageExt] = []
        if idx is not None:
            r = idx.query_offset(topic, key, max_num, begin, end)
            for off in sorted(set(r.phy_offsets)):
                m = self.look_message_by_offset(off)
                if (m is not None and m.topic == topic and (key in m.keys_list() or m.uniq_key == key)
                        and begin <= m.store_timestamp <= end):
                    out.append(m)
            return out, "index"
        for off, r in self.iter_records():
            if not r.success:
                break
            req = r.request
            if req.topic != topic or not (req.uniq_key == key or (req.keys and key in req.keys.split(" "))):
                continue
            if begin <= req.store_timestamp <= end:
                m = self.look_message_by_offset(off, r.size)
                if m is not None:
                    out.append(m)
                    if len(out) >= max_num:
                        break
        return out, "scan"

    def checkpoint(self) -> StoreCheckpoint | None:
        if not self.root:
            return None
        path = os.path.join(self.root, "checkpoint")
        if not os.path.exists(path):
            return None
        return StoreCheckpoint(path, read_only=True)

    def close(self) -> None:
        self.commit_log.shutdown()
        for cq in self._cqs.values():
            cq.shutdown()
        if self._index is not None:
            self._index.shutdown()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan_segment(mf: MappedFile, check_crc: bool = False,
                 on_record: Callable[[codec.DispatchRequest], None] | None = None,
                 on_progress: Callable[[int], None] | None = None) -> SegmentInfo:
    """Walk one segment's records: where the valid ones end, how many, a BLANK, damage.

    `on_record` sees each valid record's dispatch request; `on_progress(n)` is told how many more bytes
    were scanned (for progress bars). Zeroed space after the last record is not damage.
    """
    pos = records = reported = 0
    blank = False
    damage = ""
    for p, r in codec.iter_records(mf.view, 0, mf.mapped_size, check_crc):
        if r.success and r.size > 0:
            records += 1
            pos = p + r.size
            if on_record is not None:
                on_record(r.request)
            if on_progress is not None and pos - reported >= 1 << 20:
                on_progress(pos - reported)
                reported = pos
        elif r.success:
            blank = True
            pos = p
        else:
            pos = p
            if not is_zero(mf.view, p):
                damage = r.reason or "unreadable record"
    if on_progress is not None:
        on_progress(mf.mapped_size - reported)
    return SegmentInfo(mf.file_name, mf.file_from_offset, mf.file_size, mf.file_from_offset + pos, records,
                       blank, damage)


def infer_index_geometry(index_dir: str) -> tuple[int, int]:
    """(hash slots, index entries) of the index files in `index_dir`, from their size.

    RocketMQ's default geometry (5 M slots, 20 M entries) is tried first, then any geometry with
    RocketMQ's 1:4 slot-to-entry ratio (size = 40 + 84 * slots).
    """
    names = sorted(n for n in os.listdir(index_dir) if n.isdigit())
    if not names:
        return 5_000_000, 20_000_000
    size = max(os.path.getsize(os.path.join(index_dir, n)) for n in names)
    if size == 40 + 5_000_000 * 4 + 20_000_000 * 20:
        return 5_000_000, 20_000_000
    if size > 40 and (size - 40) % 84 == 0:
        slots = (size - 40) // 84
        return slots, slots * 4
    raise ValueError(
        f"cannot infer the geometry of index files of {size} bytes in {index_dir}: "
        "pass the store's max_hash_slot_num and max_index_num")


def is_zero(view: memoryview, pos: int) -> bool:
    """True when the bytes at `pos` look like never-written space (zeroed TOTALSIZE and MAGIC)."""
    chunk = bytes(view[pos:pos + 8])
    return not chunk.strip(b"\x00")
