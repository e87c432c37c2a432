"""The `rocketmq` Spark data source: `spark.read.format("rocketmq").load(store_path)` (Spark 4 Python
Data Source API), read-only and in parallel.

Planning is O(files): one input partition per commitlog segment (a large segment is cut into byte
ranges, each reader re-synchronising on the first record boundary of its range by magic code and
PHYSICALOFFSET). With a topic filter (the `topic`/`topics` option, or a pushed-down `topic = / IN`)
and a store root that has consume queues, the partitions are that topic's consume queue files and only
the records they point to are read (as a consumer sees the topic: what the broker has dispatched;
records a live broker has not dispatched yet, and legacy PREPARED/ROLLBACK transaction records, which
RocketMQ never dispatches, are not in a consume queue; `useConsumeQueue=false` scans instead).

Tasks map files read-only (`mmap` ACCESS_READ), never lock, never write, and stop at zeroed space, a
BLANK record or a record that fails the size/magic checks, so a live broker may be appending to the
same store. Each segment (or split) is read independently: records after damage in one segment are
not read, later segments are (`rmq-eventstore spark verify` reports damage). Known limit: a record a
writer has copied up to inside its properties has consistent lengths and is read (RocketMQ's own
`checkMessageAndReturnSize` accepts it too); `verifyCrc` catches a cut inside the body. Rows are decoded
in batches (`decode`: in C by `_spark_native`, else numpy) and yielded as Arrow record batches matching
`decode.ARROW_SCHEMA`, which Spark's Python data source passes to the JVM as they are.

Options (all optional): `topic`/`topics` (comma-separated), `queueIds` (comma-separated), `startTime`
(inclusive) / `endTime` (exclusive) as epoch milliseconds or ISO-8601, `startOffset` (inclusive) /
`endOffset` (exclusive) commitlog offsets of the record start, `verifyCrc` (true: a BODYCRC mismatch
fails the task naming the offset), `splitSize` (bytes per partition, default 64 MiB),
`useConsumeQueue` (default true), `commitLogFileSize` (default: inferred from the file names),
`pushdown` (`auto`, `true`, `false`; see `RocketMQDataSource.reader`).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..common import codec
from ..store.consume_queue import UNIT_DTYPE
from . import decode

FORMAT = "rocketmq"
DEFAULT_SPLIT = 64 << 20
TIME_PRUNE_SLACK_MS = 10_000  # segments are pruned by time only this far beyond their neighbours' first record
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


class SourceError(ValueError):
    """A bad option or store path given to the `rocketmq` source."""


# -- options ------------------------------------------------------------------------------------------
def normalise_options(options: Any) -> dict[str, str]:
    """Options with lower-case names (Spark hands them over lower-cased, users write camelCase)."""
    return {str(k).lower(): v for k, v in dict(options).items()}


def _get(options: dict[str, str], name: str) -> Any:
    v = options.get(name.lower())
    return options.get(name) if v is None else v


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    v = _get(options, name)
    if v is None:
        return default
    if str(v).lower() in ("true", "1", "yes", "on"):
        return True
    if str(v).lower() in ("false", "0", "no", "off"):
        return False
    raise SourceError(f"option {name}={v!r}: expected true or false")


def _int(options: dict[str, str], name: str) -> int | None:
    v = _get(options, name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise SourceError(f"option {name}={v!r}: expected an integer") from None


def parse_time_ms(value: str | int) -> int:
    """Epoch milliseconds from an int, a digit string or an ISO-8601 time (naive means UTC)."""
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise SourceError(f"time {value!r}: expected epoch milliseconds or ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def _csv(options: dict[str, str], *names: str) -> list[str] | None:
    for name in names:
        v = _get(options, name)
        if v is not None and v != "":
            return [t.strip() for t in str(v).split(",") if t.strip()]
    return None


def filters_from_options(options: dict[str, str]) -> decode.Filters:
    """The row filters the options ask for."""
    f = decode.Filters()
    topics = _csv(options, "topics", "topic")
    if topics is not None:
        f.topics = frozenset(topics)
    qids = _csv(options, "queueIds", "queueId")
    if qids is not None:
        try:
            f.queue_ids = frozenset(int(q) for q in qids)
        except ValueError:
            raise SourceError(f"option queueIds={_get(options, 'queueIds')!r}: expected integers") from None
    if _get(options, "startTime"):
        f.min_ts = parse_time_ms(_get(options, "startTime"))
    if _get(options, "endTime"):
        f.max_ts = parse_time_ms(_get(options, "endTime")) - 1
    f.min_offset = _int(options, "startOffset")
    f.max_offset = _int(options, "endOffset")
    return f


# -- store layout ---------------------------------------------------------------------------------------
def commit_log_dir(path: str) -> tuple[str, str | None]:
    """(commitlog directory, store root or None) for a store root or a bare commitlog directory."""
    if not os.path.isdir(path):
        raise SourceError(f"no store directory at {path!r}")
    cl = os.path.join(path, "commitlog")
    if os.path.isdir(cl):
        return cl, path
    if any(n.isdigit() and len(n) >= 20 for n in os.listdir(path)):
        return path, None
    raise SourceError(f"{path!r} holds neither a commitlog/ directory nor commitlog segment files")


def list_segments(directory: str, file_size: int | None = None) -> tuple[list[tuple[str, int, int]], int]:
    """([(path, start offset, bytes on disk)], segment size) of a commitlog directory, in offset order."""
    names = sorted((n for n in os.listdir(directory) if n.isdigit()), key=int)
    segs = []
    for n in names:
        p = os.path.join(directory, n)
        segs.append((p, int(n), os.path.getsize(p)))
    if file_size is None:
        if len(segs) >= 2 and segs[1][1] > segs[0][1]:
            file_size = segs[1][1] - segs[0][1]
        else:
            file_size = (segs[0][2] if segs else 0) or 1 << 30
    return [(p, o, min(s, file_size)) for p, o, s in segs], file_size


def first_store_timestamp(path: str) -> int | None:
    """STORETIMESTAMP of a segment's first record (one small read), None if it does not start with one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(96)
    except OSError:
        return None
    if len(head) < 64:
        return None
    _total, magic = struct.unpack_from(">ii", head, 0)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
        return None
    sys_flag = struct.unpack_from(">i", head, codec.SYSFLAG_POSITION)[0]
    return struct.unpack_from(">q", head, codec.store_timestamp_position(sys_flag))[0]


# -- partitions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SegmentRange(InputPartition):
    """Records of one commitlog segment that start in [lo, hi) (positions in the file)."""

    path: str
    file_from: int
    lo: int
    hi: int
    exact_start: bool = True  # lo is a known record start (else re-synchronise on the first record >= lo)


@dataclass(frozen=True)
class QueueFile(InputPartition):
    """One consume queue file: read its units, then the commitlog records they point to."""

    cq_path: str
    commit_log_dir: str
    commit_log_file_size: int


@dataclass
class ReadSpec:
    """What every task needs (pickled into the read function, never recomputed from `self`)."""

    filters: decode.Filters
    check_crc: bool


def plan_scan(directory: str, file_size: int | None, filters: decode.Filters,
              split: int = DEFAULT_SPLIT) -> list[SegmentRange]:
    """Byte-range partitions over the commitlog, pruned by offset and (with slack) store time."""
    segs, size = list_segments(directory, file_size)
    first_ts: list[int | None] = [None] * len(segs)
    if filters.min_ts is not None or filters.max_ts is not None:
        first_ts = [first_store_timestamp(p) for p, _o, _s in segs]
    out: list[SegmentRange] = []
    for i, (path, start, on_disk) in enumerate(segs):
        if on_disk <= 0:
            continue
        if filters.max_offset is not None and start >= filters.max_offset:
            continue
        if filters.min_offset is not None and start + size <= filters.min_offset:
            continue
        ts = first_ts[i]
        nxt = first_ts[i + 1] if i + 1 < len(segs) else None
        if filters.max_ts is not None and ts is not None and ts - TIME_PRUNE_SLACK_MS > filters.max_ts:
            continue
        if filters.min_ts is not None and nxt is not None and nxt + TIME_PRUNE_SLACK_MS < filters.min_ts:
            continue
        lo = 0
        if filters.min_offset is not None and filters.min_offset > start:
            lo = filters.min_offset - start  # not necessarily a record start: re-synchronise
        hi = on_disk if filters.max_offset is None else min(on_disk, filters.max_offset - start)
        pos = lo
        while pos < hi:
            end = min(hi, pos + split)
            out.append(SegmentRange(path, start, pos, end, exact_start=pos == 0))
            pos = end
    return out


def plan_queues(root: str, directory: str, file_size: int, topics: frozenset[str],
                queue_ids: frozenset[int] | None) -> list[QueueFile]:
    """One partition per consume queue file of the topics (and queues) asked for."""
    out: list[QueueFile] = []
    cq_root = os.path.join(root, "consumequeue")
    for topic in sorted(topics):
        tdir = os.path.join(cq_root, topic)
        if not os.path.isdir(tdir):
            continue
        for q in sorted((q for q in os.listdir(tdir) if q.isdigit()), key=int):
            if queue_ids is not None and int(q) not in queue_ids:
                continue
            qdir = os.path.join(tdir, q)
            for name in sorted((n for n in os.listdir(qdir) if n.isdigit()), key=int):
                out.append(QueueFile(os.path.join(qdir, name), directory, file_size))
    return out


# -- reading -------------------------------------------------------------------------------------------
class _Mapped:
    """A read-only mapping of a segment file (closed when the task is done with it)."""

    def __init__(self, path: str, limit: int | None = None) -> None:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.size = size if limit is None else min(size, limit)
            self.mm = mmap.mmap(fh.fileno(), self.size, access=mmap.ACCESS_READ) if self.size else None
        self.a = np.frombuffer(self.mm, dtype=np.uint8) if self.mm is not None else np.zeros(0, np.uint8)

    def close(self) -> None:
        self.a = np.zeros(0, np.uint8)
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # an array still refers to it: the GC unmaps it later
                pass


def _crc_error(path: str, file_from: int, bad: list[int]) -> RuntimeError:
    offs = ", ".join(str(file_from + b) for b in bad[:10])
    return RuntimeError(f"BODYCRC mismatch in {path} at commitlog offset(s) {offs}"
                        f"{' ...' if len(bad) > 10 else ''} ({len(bad)} record(s))")


def read_segment_range(part: SegmentRange, spec: ReadSpec, file_size: int | None = None
                       ) -> Iterator[Any]:
    """Arrow batches of the records in a `SegmentRange`."""
    seg = _Mapped(part.path, file_size)
    try:
        if seg.size == 0:
            return
        buf = memoryview(seg.mm)
        pos = part.lo
        if not part.exact_start:
            found = decode.resync(buf, seg.mm, pos, seg.size, part.file_from, part.hi)
            if found is None:
                return
            pos = found
        for d in decode.iter_batches(buf, seg.a, part.file_from, pos, min(part.hi, seg.size), spec.filters,
                                     spec.check_crc):
            if d.crc_bad:
                raise _crc_error(part.path, part.file_from, d.crc_bad)
            if d.batch is not None and d.batch.num_rows:
                yield d.batch
        del buf
    finally:
        seg.close()


def read_queue_file(part: QueueFile, spec: ReadSpec) -> Iterator[Any]:
    """Arrow batches of the records one consume queue file points to."""
    try:
        units = np.fromfile(part.cq_path, dtype=UNIT_DTYPE)
    except OSError:
        return
    sizes = units["s"].astype(np.int64)
    offs = units["o"].astype(np.int64)
    empty = np.flatnonzero((sizes == 0) & (offs == 0))
    if len(empty):  # preallocated zeros: the queue's data ends here
        units_end = int(empty[0])
        sizes, offs = sizes[:units_end], offs[:units_end]
    live = (sizes > 0) & (sizes != 0x7FFFFFFF)
    sizes, offs = sizes[live], offs[live]
    if len(offs) == 0:
        return
    fsize = part.commit_log_file_size
    seg_from = offs - offs % fsize
    for base in np.unique(seg_from).tolist():
        path = os.path.join(part.commit_log_dir, codec_file_name(base))
        if not os.path.exists(path):  # deleted by retention: the queue outlives it
            continue
        sel = np.flatnonzero(seg_from == base)
        seg = _Mapped(path, fsize)
        try:
            pos = offs[sel] - base
            size = sizes[sel]
            fits = (pos + size <= seg.size) & (size >= 88)
            pos, size = pos[fits], size[fits]
            if len(pos) == 0:
                continue
            total = np.ascontiguousarray(seg.a[pos[:, None] + np.arange(4)]).view(">i4").ravel()
            match = total == size
            pos = pos[match]
            buf = memoryview(seg.mm)
            for i in range(0, len(pos), decode.BATCH_ROWS):
                d = decode.decode_batch(seg.a, buf, pos[i:i + decode.BATCH_ROWS], base, spec.filters,
                                        spec.check_crc, skip_bad=True)
                if d.crc_bad:
                    raise _crc_error(path, base, d.crc_bad)
                if d.batch is not None and d.batch.num_rows:
                    yield d.batch
            del buf
        finally:
            seg.close()


def codec_file_name(offset: int) -> str:
    """A segment's file name: its start offset in 20 digits."""
    return f"{offset:020d}"


# -- pushdown --------------------------------------------------------------------------------------------
def _us(value: Any) -> int:
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        return (dt - _EPOCH) // _US
    raise TypeError(value)


def push_filters(filters: decode.Filters, pushed: Sequence[Any]) -> list[Any]:
    """Fold what can be applied exactly into `filters`; returns the filters Spark must still apply.

    Taken: `topic` = / IN, `queue_id` = / IN, `store_timestamp` and `commit_log_offset` bounds.
    """
    from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

    rest = []
    for flt in pushed:
        attr = getattr(flt, "attribute", None)
        name = attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None
        if name in ("topic", "queue_id") and isinstance(flt, (EqualTo, In)):
            vals = [flt.value] if isinstance(flt, EqualTo) else list(flt.value)
            if any(v is None for v in vals):
                rest.append(flt)
                continue
            if name == "topic":
                s = frozenset(str(v) for v in vals)
                filters.topics = s if filters.topics is None else filters.topics & s
            else:
                s2 = frozenset(int(v) for v in vals)
                filters.queue_ids = s2 if filters.queue_ids is None else filters.queue_ids & s2
            continue
        if name == "store_timestamp" and isinstance(flt, (GreaterThan, GreaterThanOrEqual, LessThan,
                                                          LessThanOrEqual)):
            try:
                us = _us(flt.value)
            except TypeError:
                rest.append(flt)
                continue
            # Rows hold whole milliseconds (us = ms * 1000); turn each bound into an inclusive ms bound.
            if isinstance(flt, GreaterThan):
                _lower(filters, "min_ts", us // 1000 + 1)
            elif isinstance(flt, GreaterThanOrEqual):
                _lower(filters, "min_ts", -(-us // 1000))
            elif isinstance(flt, LessThan):
                _upper(filters, "max_ts", -(-us // 1000) - 1)
            else:
                _upper(filters, "max_ts", us // 1000)
            continue
        if name == "commit_log_offset" and isinstance(flt, (GreaterThan, GreaterThanOrEqual, LessThan,
                                                            LessThanOrEqual)) and isinstance(flt.value, int):
            v = flt.value
            if isinstance(flt, GreaterThan):
                _lower(filters, "min_offset", v + 1)
            elif isinstance(flt, GreaterThanOrEqual):
                _lower(filters, "min_offset", v)
            elif isinstance(flt, LessThan):
                _upper(filters, "max_offset", v)
            else:
                _upper(filters, "max_offset", v + 1)
            continue
        rest.append(flt)
    return rest


def _lower(f: decode.Filters, name: str, v: int) -> None:
    cur = getattr(f, name)
    setattr(f, name, v if cur is None else max(cur, v))


def _upper(f: decode.Filters, name: str, v: int) -> None:
    cur = getattr(f, name)
    setattr(f, name, v if cur is None else min(cur, v))


# -- the data source --------------------------------------------------------------------------------------
class RocketMQReader(DataSourceReader):
    """Batch reader over a store directory: partitions by segment (or consume queue file), reads in numpy."""

    def __init__(self, path: str, options: dict[str, str]) -> None:
        self.path = path
        self.options = options
        self.filters = filters_from_options(options)
        self.check_crc = _bool(options, "verifyCrc", False)
        self.split = _int(options, "splitSize") or DEFAULT_SPLIT
        if self.split <= 0:
            raise SourceError("option splitSize must be positive")
        self.use_cq = _bool(options, "useConsumeQueue", True)
        self.file_size = _int(options, "commitLogFileSize")
        commit_log_dir(path)  # fail early on a bad path

    def partitions(self) -> Sequence[InputPartition]:
        directory, root = commit_log_dir(self.path)
        segs, size = list_segments(directory, self.file_size)
        self._size = size
        f = self.filters
        if f.topics is not None and self.use_cq and root and os.path.isdir(os.path.join(root, "consumequeue")):
            return plan_queues(root, directory, size, f.topics, f.queue_ids)
        return plan_scan(directory, size, f, self.split)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        spec = ReadSpec(self.filters, self.check_crc)
        if isinstance(partition, QueueFile):
            yield from read_queue_file(partition, spec)
        else:
            yield from read_segment_range(partition, spec, self.file_size)


class RocketMQPushdownReader(RocketMQReader):
    """The batch reader with `pushFilters` (used when Spark's Python filter pushdown is on)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's name
        yield from push_filters(self.filters, filters)
