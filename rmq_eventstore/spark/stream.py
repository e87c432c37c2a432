"""The streaming side of the `rocketmq` source: `spark.readStream.format("rocketmq").load(store_path)`.

Offsets are commitlog physical offsets (`{"offset": N}`, N the log offset just after the last record
handed out). Each micro-batch re-lists the segment files, walks forward from the previous end over
records that pass every size and magic check (a record a live writer has only partly written fails
them and waits for the next batch), rolls over BLANK records into the next segment, and reads
[start, end) as byte ranges of the segments. Read-only: nothing is locked or written; `commit` keeps
nothing because the store itself is the replayable log.

Options: `startingOffsets` (`earliest` (default), `latest`, or a commitlog offset), `maxBytesPerTrigger`
(cap on the bytes of one micro-batch), and the batch options `topic(s)`, `queueIds`, `startTime`,
`endTime`, `verifyCrc`, `commitLogFileSize` as row filters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)

from . import decode
from .source import (
    ReadSpec,
    SegmentRange,
    SourceError,
    _bool,
    _get,
    _int,
    _Mapped,
    commit_log_dir,
    filters_from_options,
    list_segments,
    read_segment_range,
)

_WALK_ROWS = 1 << 16


def complete_end(directory: str, start: int, file_size: int | None = None, max_bytes: int | None = None
                 ) -> int:
    """The log offset just after the last complete record from `start` on (rolling over BLANKs)."""
    segs, size = list_segments(directory, file_size)
    by_from = {o: (p, s) for p, o, s in segs}
    if not segs:
        return start
    if start < segs[0][1]:
        start = segs[0][1]
    budget = None if max_bytes is None else start + max_bytes
    pos = start
    while True:
        base = pos - pos % size
        if base not in by_from:
            return pos
        path, _ = by_from[base]
        seg = _Mapped(path, size)
        try:
            buf = memoryview(seg.mm) if seg.mm is not None else memoryview(b"")
            st = decode.WalkState(pos - base)
            while True:
                stop = seg.size if budget is None else max(min(seg.size, budget - base), 0)
                if st.pos >= stop:
                    return base + st.pos
                starts = decode.walk(buf, st.pos, stop, seg.size, _WALK_ROWS, 1 << 40, st)
                if len(starts):
                    f = decode.record_layout(seg.a, starts)
                    bad = decode.first_invalid(f["ok"])
                    if bad is not None:
                        return base + int(starts[bad])
                if st.reason == "blank":
                    nxt = base + size
                    if nxt not in by_from:
                        return base + st.pos  # the next file is not there yet: wait at the BLANK
                    pos = nxt
                    break
                if st.reason != "more":
                    return base + st.pos
            del buf
        finally:
            seg.close()


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the records appended to a store's commitlog, by commitlog offset.

    `maxBytesPerTrigger` becomes Spark's default `ReadMaxBytes` limit; `Trigger.AvailableNow` reads up
    to the log end found when the query starts.
    """

    def __init__(self, path: str, options: dict[str, str]) -> None:
        self.path = path
        self.directory, _root = commit_log_dir(path)
        self.filters = filters_from_options(options)
        self.check_crc = _bool(options, "verifyCrc", False)
        self.file_size = _int(options, "commitLogFileSize")
        self.max_bytes = _int(options, "maxBytesPerTrigger")
        self.starting = str(_get(options, "startingOffsets") or "earliest").lower()
        if self.starting not in ("earliest", "latest") and not self.starting.isdigit():
            raise SourceError(f"option startingOffsets={self.starting!r}: expected earliest, latest or an offset")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise SourceError("option maxBytesPerTrigger must be positive")
        self._target: int | None = None  # Trigger.AvailableNow: never read past this offset

    def _min_offset(self) -> int:
        segs, _ = list_segments(self.directory, self.file_size)
        return segs[0][1] if segs else 0

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        if self.starting == "earliest":
            return {"offset": self._min_offset()}
        if self.starting == "latest":
            return {"offset": complete_end(self.directory, self._min_offset(), self.file_size)}
        return {"offset": int(self.starting)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        return ReadAllAvailable() if self.max_bytes is None else ReadMaxBytes(self.max_bytes)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = complete_end(self.directory, self._min_offset(), self.file_size)

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:  # noqa: N802
        begin = int(start["offset"]) if start else self.initialOffset()["offset"]
        cap = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if self._target is not None:
            if begin >= self._target:
                return {"offset": begin}
            cap = min(cap, self._target - begin) if cap is not None else self._target - begin
        end = complete_end(self.directory, begin, self.file_size, cap)
        if self._target is not None:
            end = min(end, max(begin, self._target))
        return {"offset": end}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        segs, size = list_segments(self.directory, self.file_size)
        out = []
        for path, base, _on_disk in segs:
            if base + size <= lo or base >= hi:
                continue
            a = max(lo - base, 0)
            b = min(hi - base, size)
            if a < b:
                out.append(SegmentRange(path, base, a, b, exact_start=True))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from read_segment_range(partition, ReadSpec(self.filters, self.check_crc), self.file_size)

    def commit(self, end: dict) -> None:
        """Nothing to do: the source never deletes or marks anything in the store."""
