"""verify / recover / rebuild: the store's repair tools as library functions (CLI: `rmq-eventstore`).

* `verify(path)` is read-only (a `StoreReader`: no lock, no writes), so it runs beside a live writer. It
  checks the body CRC and structure of every commitlog record (and the `__CRC32#` trailer of those that
  end with one), every consume queue unit against the
  record it points at (offset, size, topic, queue id, queue offset, tags code) and every index entry
  (it must point at a record carrying a key with that hash), and reports each problem with its offset.
* `recover(path)` takes the store's lock (a store open elsewhere is refused), runs the load-time
  recovery (`recovery.recover_store`) and reports what it truncated, cut and re-dispatched.
* `rebuild(path)` takes the lock, deletes the consume queues and the index and rebuilds them from the
  commitlog.

Each takes `progress(n)`, told about every `n` commitlog bytes processed, and returns a dataclass report
with `as_dict()` for `--json`.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..common import codec
from ..common.codec import _SKIM_STATES, CRC32_RESERVED_LEN, SKIM_BLANK, SKIM_DAMAGE, SKIM_OK
from .config import CQ_STORE_UNIT_SIZE
from .consume_queue import BLANK_UNIT_SIZE, ConsumeQueue
from .index import INDEX_ENTRY_DTYPE, index_key_hash, record_index_keys
from .mapped_file import StoreLoadError
from .message_store import MessageStore
from .reader import StoreReader, _segment_size, infer_index_geometry
from .recovery import _TRAILER_HEAD, prop_crc_damage
from .topic_deletion import read_cutoffs

Progress = Callable[[int], None]
_INT = struct.Struct(">i")
MAX_PROBLEMS = 1000  # problems listed per report (all are counted)


@dataclass
class Problem:
    """One piece of damage: what kind, where (a file or queue), the commitlog offset, details."""

    kind: str
    where: str
    offset: int
    detail: str


@dataclass
class VerifyReport:
    """What `verify` found."""

    path: str
    commit_log_min: int = 0
    commit_log_end: int = 0
    commit_log_bytes: int = 0
    records: int = 0
    queues: int = 0
    units: int = 0
    index_files: int = 0
    index_entries: int = 0
    problem_count: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def add(self, kind: str, where: str, offset: int, detail: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(kind, where, offset, detail))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _tick(progress: Progress | None, n: int) -> None:
    if progress is not None and n > 0:
        progress(n)


def commit_log_size(path: str) -> int:
    """Bytes of commitlog segment files under a store root (the total for a progress bar)."""
    d = os.path.join(path, "commitlog")
    try:
        return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.isdigit())
    except OSError:
        return 0


def _native_verify() -> Any:
    """The C loops of `verify` (`_native.verify_*`), None on the pure-Python path (`RMQ_EVENTSTORE_PURE=1`
    or no extension): each only passes what is intact and hands every other item back to the reference
    checks below, so both paths report the same problems in the same order."""
    nat = codec.native
    return nat if nat is not None and hasattr(nat, "verify_scan") else None


_SCAN_CHUNK = 16384  # records per native walk call (about 20 MB of 1.2 KB records: the progress step)
_SPAN = 16384  # consume queue units / index entries per native call
_CACHE_MAX = 4096  # records remembered by the index check (entries of one record are neighbours)


class _IndexFusion:
    """The index entries the native walk checks while each record is at hand (`_native.verify_scan`): the
    record was just walked (structure and body CRC), so an entry pointing at it with one of its keys' hashes
    is what the index pass would pass, and the pass then skips it. This reads each record once instead of
    twice (the index pass's reads went through the whole log again). The entries it passes are kept as
    ranges per index file (one range per file on an intact store), so memory does not grow with the store.
    Not used beside a live writer (the index would be loaded before the walk instead of after it)."""

    def __init__(self, files: list[tuple[Any, int, int]]) -> None:
        self.files = files  # [(mapped file or None, entries position, count)] in the index pass's order
        self.cursor: tuple[int, int] = (0, 1)  # (file, entry) the walk reached
        self.confirmed: dict[int, list[list[int]]] = {}  # file -> [[start, end), ...] passed, ascending

    def add(self, ranges: list[tuple[int, int, int]]) -> None:
        for f, a, b in ranges:
            runs = self.confirmed.setdefault(f, [])
            if runs and runs[-1][1] == a:
                runs[-1][1] = b
            else:
                runs.append([a, b])

    def gaps(self, f: int, count: int) -> list[tuple[int, int]]:
        """The entries of file `f` (1..count-1) the walk did not pass, as [start, end) ranges."""
        out = []
        at = 1
        for a, b in self.confirmed.get(f, []):
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < count:
            out.append((at, count))
        return out


def _index_fusion(reader: StoreReader, hash_slot_num: int | None, index_num: int | None) -> _IndexFusion | None:
    """An `_IndexFusion` over the index files `_verify_index` will check, None when it would stop early or
    report a problem first (it then checks everything itself, as before)."""
    ip = reader.index_path
    if not ip or not os.path.isdir(ip):
        return None
    names = sorted(n for n in os.listdir(ip) if n.isdigit())
    if not names or (len(names) == 1 and os.path.getsize(os.path.join(ip, names[0])) == 0):
        return None
    try:
        if not (hash_slot_num and index_num):
            infer_index_geometry(ip)
        svc = reader.index_service()
    except (ValueError, OSError, StoreLoadError):
        return None  # the index pass reports it
    if svc is None:
        return None
    files: list[tuple[Any, int, int]] = []
    for f in svc.files:
        base = 40 + f.hash_slot_num * 4
        count = f.index_count
        whole = f.mm is not None and f.mapped_size >= f.file_size and 0 < count and base + count * 20 <= len(f.mm)
        files.append((f.mm, base, count) if whole else (None, 0, 0))
    return _IndexFusion(files)


class _QueueFusion:
    """The consume queue units the native walk checks while each record is at hand (`_native.verify_scan`):
    the unit at the record's queue offset passes when it points at the record with its size and tags code
    (the record was just walked, structure and CRC: what `_check_record` would find), and the unit pass then
    skips it, so the pass no longer reads the log again in queue order. The queues are opened before the
    walk (read-only; `_open_queue` keeps them for the pass) and the units passed are kept as ranges per
    queue (one per queue on an intact store). Not used beside a live writer."""

    def __init__(self, queues: dict[tuple[bytes, int], list[tuple[int, Any, int, int]]]) -> None:
        self.queues = queues  # (topic, qid) -> [(first unit, mapped file, position, units)]
        self.confirmed: dict[tuple[bytes, int], list[list[int]]] = {}
        self._sorted: dict[tuple[bytes, int], tuple[list[int], list[list[int]]]] = {}

    def add(self, ranges: list[tuple[bytes, int, int, int]]) -> None:
        for topic, qid, a, b in ranges:
            runs = self.confirmed.setdefault((topic, qid), [])
            if runs and runs[-1][1] == a:
                runs[-1][1] = b
            else:
                runs.append([a, b])

    def gaps(self, key: tuple[bytes, int], lo: int, hi: int) -> list[tuple[int, int]]:
        """The units lo..hi-1 of a queue the walk did not pass, as [start, end) ranges."""
        got = self._sorted.get(key)
        if got is None:
            runs = sorted(self.confirmed.get(key, []))
            got = self._sorted[key] = ([b for _a, b in runs], runs)
        ends, runs = got
        out = []
        at = lo
        for a, b in runs[bisect.bisect_right(ends, lo):]:
            if a >= hi:
                break
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return out


def _queue_fusion(reader: StoreReader) -> _QueueFusion:
    """A `_QueueFusion` over the queues `_verify_consume_queues` will read, span by span as it reads them
    (a queue that does not open is left to the pass, which reports it)."""
    queues: dict[tuple[bytes, int], list[tuple[int, Any, int, int]]] = {}
    for topic in reader.topics():
        topic_b = _encoded(topic)
        for qid in reader.queue_ids(topic):
            try:
                cq = _open_queue(reader, topic, qid)
            except (StoreLoadError, OSError, ValueError):
                continue
            if cq is None or topic_b is None:
                continue
            spans = queues[(topic_b, qid)] = []
            k, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            while k < hi:
                span = _cq_span(cq, k, hi - k)
                if span is None:  # what the pass's reference loop reads there (or rolls over)
                    units = cq.get_units(k, 4096)
                    k = k + len(units) if units else cq.roll_next_file(k)
                    continue
                buf, pos, n = span
                spans.append((k, buf, pos, n))
                k += n
    return _QueueFusion(queues)


def _verify_commit_log(reader: StoreReader, report: VerifyReport, progress: Progress | None,
                       fusion: _IndexFusion | None = None, qfusion: _QueueFusion | None = None
                       ) -> dict[tuple[str, int], tuple[int, int]]:
    """CRC and structure of every record, and the `__CRC32#` trailer of every record that ends with one
    (written with `enabled_append_prop_crc`); returns each queue's record count and last record offset.
    With `fusion` / `qfusion` the C walk also passes the index entries and the consume queue unit of each
    record it walks (`_IndexFusion`, `_QueueFusion`)."""
    counts: dict[tuple[bytes, int], list[int]] = {}
    # records of a deleted topic from before its deletion have no consume queue (topic_deletion.py)
    cut = ({t.encode(): d for t, d in read_cutoffs(os.path.join(reader.root, "config")).items()}
           if reader.root is not None else {})
    nat = _native_verify()
    files = reader.commit_log.mapped_files
    report.commit_log_min = files[0].file_from_offset if files else 0
    end = report.commit_log_min
    live: bool | None = None
    for i, mf in enumerate(files):
        pos = 0
        limit = mf.mapped_size
        last = i == len(files) - 1
        buf = mf.mm if mf.mm is not None else mf.view
        base = mf.file_from_offset
        while True:
            if nat is None:
                got = None
            elif fusion is None and qfusion is None:
                got = nat.verify_scan(buf, pos, limit, base, _SCAN_CHUNK, cut, counts, _SKIM_STATES)
            else:
                got = nat.verify_scan(buf, pos, limit, base, _SCAN_CHUNK, cut, counts, _SKIM_STATES,
                                      fusion.files if fusion is not None else None,
                                      *(fusion.cursor if fusion is not None else (0, 1)),
                                      qfusion.queues if qfusion is not None else None)
                if got is not None:
                    if fusion is not None:
                        fusion.cursor = got[5:7]
                        fusion.add(got[7])
                    if qfusion is not None:
                        qfusion.add(got[8])
            if got is not None:  # the C walk: counts merged, the trailers it could not pass listed
                nxt, state, reason, n, undecided = got[:5]
                for rpos in undecided:
                    why = prop_crc_damage(mf.view, rpos, _INT.unpack_from(mf.view, rpos)[0])
                    if why:
                        report.add("commitlog_record", mf.file_name, base + rpos, why)
                report.records += n
            else:
                recs, nxt, state, reason = codec.skim_records(buf, pos, limit, True)
                _count_records(mf, recs, cut, counts, report)
                report.records += len(recs)
            _tick(progress, nxt - pos)
            report.commit_log_bytes += nxt - pos
            pos = nxt
            if state == SKIM_OK:
                continue
            if state == SKIM_DAMAGE:
                at = mf.file_from_offset + pos
                if last:
                    if live is None:
                        live = reader.root is not None and _live(reader.root)
                    if live and _record_arrived(mf, pos, limit):
                        continue  # a record half copied in by a live writer, whole now
                report.add("commitlog_record", mf.file_name, at, reason)
                # a record whose lengths are intact (a CRC mismatch) is skipped; otherwise the rest of
                # this file cannot be walked
                one, nxt2, _s, _r = codec.skim_records(mf.view, pos, limit, False, max_records=1)
                if one:
                    report.records += 1
                    _tick(progress, nxt2 - pos)
                    report.commit_log_bytes += nxt2 - pos
                    pos = nxt2
                    continue
                end = at
                break
            if state == SKIM_BLANK:
                end = mf.file_from_offset + (pos if last else mf.file_size)
                break
            # zeroed space: the end of the log, damage when a later file follows
            end = mf.file_from_offset + pos
            if not last:
                report.add("commitlog_hole", mf.file_name, end,
                           "zeroed space before the end of a segment that is not the last one")
            elif pos < limit and not reader_is_zero_tail(mf, pos):
                if live is None:
                    live = reader.root is not None and _live(reader.root)
                if live and _record_arrived(mf, pos, limit):
                    continue  # a live writer was copying a record here: walk on
                if not live:
                    report.add("commitlog_tail", mf.file_name, end, "bytes after the end of the log")
            break
        _tick(progress, mf.mapped_size - pos)
    report.commit_log_end = end
    return {(t.decode("utf-8", "replace"), q): (n, last) for (t, q), (n, last) in counts.items()}


def _count_records(mf: Any, recs: list[tuple], cut: dict[bytes, int], counts: dict[tuple[bytes, int], list[int]],
                   report: VerifyReport) -> None:
    """The reference of `verify_scan`'s per-record work: the `__CRC32#` trailer of a record ending with one,
    and the count and last offset of its queue (not for a prepared transaction or a record before its
    topic's deletion)."""
    base = mf.file_from_offset
    for rpos, size, queue_id, _qoff, sys_flag, _ts, topic in recs:
        if mf.view[rpos + size - CRC32_RESERVED_LEN:rpos + size - 11] == _TRAILER_HEAD:
            why = prop_crc_damage(mf.view, rpos, size)
            if why:
                report.add("commitlog_record", mf.file_name, base + rpos, why)
        if not sys_flag & codec.TRANSACTION_PREPARED_TYPE:
            if cut and topic in cut and base + rpos < cut[topic]:
                continue
            c = counts.get((topic, queue_id))
            if c is None:
                c = counts[(topic, queue_id)] = [0, 0]
            c[0] += 1
            c[1] = base + rpos

def _record_arrived(mf: Any, pos: int, limit: int, wait: float = 1.0) -> bool:
    """Beside a live writer, bytes after the end are a record being copied in: wait (bounded) until a whole
    record starts at `pos`; False when none does (the writer is still inside it, or died there)."""
    deadline = time.monotonic() + wait
    while True:
        one, _nxt, _s, _r = codec.skim_records(mf.view, pos, limit, True, max_records=1)
        if one:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def reader_is_zero_tail(mf: Any, pos: int, window: int = 4096) -> bool:
    """True when the bytes following the end of the log (a page's worth) are zero."""
    chunk = bytes(mf.view[pos:pos + window])
    return not chunk.strip(b"\x00")


def _check_record(reader: StoreReader, offset: int, size: int | None = None
                  ) -> tuple[codec.DispatchRequest | None, str]:
    mf = reader.commit_log.find_mapped_file_by_offset(offset)
    if mf is None:
        return None, "no commitlog file holds this offset"
    pos = offset - mf.file_from_offset
    r = codec.check_message_and_return_size(mf.view, pos, True, mf.mapped_size)
    if not r.success or r.request is None:
        return None, r.reason or "no record starts here"
    if size is not None and r.size != size:
        return None, f"unit size {size} but the record is {r.size} bytes"
    return r.request, ""


def _live(root: str) -> bool:
    """Is a process running the store (its `abort` file names a live process)?"""
    try:
        with open(os.path.join(root, "abort")) as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _record_at(reader: StoreReader, offset: int, size: int | None = None
               ) -> tuple[codec.DispatchRequest | None, str]:
    """The record at `offset`, re-mapping files a live writer has grown since the scan if needed."""
    got = _check_record(reader, offset, size)
    if got[0] is None:
        reader.commit_log.refresh_read_only()
        got = _check_record(reader, offset, size)
    return got


def _open_queue(reader: StoreReader, topic: str, qid: int) -> ConsumeQueue | None:
    """A read-only consume queue sized from its own files (None while its first file is being created)."""
    key = (topic, qid)
    cq = _QUEUES.get(id(reader), {}).get(key)
    if cq is not None:
        return cq
    qdir = os.path.join(reader.consume_queue_path or "", topic, str(qid))
    size = _segment_size(qdir)
    if not size:
        return None
    cq = ConsumeQueue(topic, qid, reader.consume_queue_path or "", size, read_only=True)
    cq.load()
    _QUEUES.setdefault(id(reader), {})[key] = cq
    return cq


_QUEUES: dict[int, dict[tuple[str, int], ConsumeQueue]] = {}


def _verify_consume_queues(reader: StoreReader, report: VerifyReport,
                           counts: dict[tuple[str, int], tuple[int, int]], qfusion: _QueueFusion | None = None
                           ) -> None:
    seen: set[tuple[str, int]] = set()
    nat = _native_verify()
    live = reader.root is not None and _live(reader.root)
    held_by_queue: dict[tuple[str, int], int] = {}
    # A live writer keeps dispatching, one batch at a time and queue by queue within a batch, so a queue
    # may already hold units past records another queue is still waiting for. What is certainly
    # dispatched is everything before the OLDEST of the queues' newest units (read before the queues are
    # checked): a queue whose newest unit is older than the batch in progress bounds it from below, and a
    # queue with a unit in that batch has all of its units of the batch written.
    dispatched_before = -1
    bounded: set[tuple[str, int]] = set()  # queues with units when the bound was taken: the ones checked
    if live:
        newest: list[int] = []
        for topic in reader.topics():
            for qid in reader.queue_ids(topic):
                try:
                    cq = _open_queue(reader, topic, qid)
                except (StoreLoadError, OSError, ValueError):
                    continue
                if cq is not None and cq.get_max_offset_in_queue() > 0:
                    u = cq.get_unit(cq.get_max_offset_in_queue() - 1)
                    if u is not None and u[1] != BLANK_UNIT_SIZE:
                        newest.append(u[0])
                        bounded.add((topic, qid))
        dispatched_before = min(newest, default=-1)
    for topic in reader.topics():
        for qid in reader.queue_ids(topic):
            where = f"consumequeue/{topic}/{qid}"
            try:
                cq = _open_queue(reader, topic, qid)
            except (StoreLoadError, OSError, ValueError) as e:
                report.add("cq_file", where, -1, str(e))
                continue
            if cq is None:
                if not live:  # (live: its first file is being created right now)
                    report.add("cq_file", where, -1, "a consume queue directory without files")
                continue
            seen.add((topic, qid))
            report.queues += 1
            qdir = os.path.join(reader.consume_queue_path or "", topic, str(qid))
            names = sorted((n for n in os.listdir(qdir) if n.isdigit()), key=int)
            for name in names:
                size = os.path.getsize(os.path.join(qdir, name))
                if size == 0 and name == names[-1]:
                    continue  # being created (or a crash while creating it): load deletes it
                if size % CQ_STORE_UNIT_SIZE or size != cq.mapped_file_size:
                    report.add("cq_file", f"{where}/{name}", -1,
                               f"{size} bytes (the queue's files are {cq.mapped_file_size}, a multiple of 20)")
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            k = lo
            held = 0
            topic_b = _encoded(topic) if nat is not None else None
            while k < hi:
                span = _cq_span(cq, k, _SPAN) if topic_b is not None else None
                if span is not None:  # the C loop: passes the intact units, hands the others back
                    buf, pos, n = span
                    report.units += n
                    gaps = qfusion.gaps((topic_b, qid), k, k + n) if qfusion is not None else [(k, k + n)]
                    held += n - sum(b - a for a, b in gaps)  # (the units the walk passed)
                    for a, b in gaps:
                        n_held, deferred = nat.verify_units(
                            buf, pos + (a - k) * CQ_STORE_UNIT_SIZE, b - a, a, _cl_files(reader),
                            reader.commit_log.mapped_file_size, report.commit_log_min, report.commit_log_end,
                            topic_b, qid)
                        held += n_held
                        for q, off, size, tags in deferred:
                            _check_unit(reader, report, where, topic, qid, q, off, size, tags)
                    k += n
                    continue
                units = cq.get_units(k, 4096)
                if not units:
                    k = cq.roll_next_file(k)
                    continue
                for i, (off, size, tags) in enumerate(units):
                    report.units += 1
                    if off == 0 and size == BLANK_UNIT_SIZE:
                        continue
                    held += 1
                    _check_unit(reader, report, where, topic, qid, k + i, off, size, tags)
                k += len(units)
            held_by_queue[(topic, qid)] = held
    for (topic, qid), (n, last) in counts.items():
        if live and (last >= dispatched_before or (topic, qid) not in bounded):
            continue  # not dispatched yet, perhaps, or its queue (directory or first file) is being created
        if (topic, qid) not in seen:
            report.add("cq_missing", f"consumequeue/{topic}/{qid}", last,
                       f"no consume queue for {n} records of {topic}-{qid}")
        elif held_by_queue[(topic, qid)] < n:
            report.add("cq_missing", f"consumequeue/{topic}/{qid}", last,
                       f"the commitlog holds {n} records of this queue, the consume queue "
                       f"{held_by_queue[(topic, qid)]}")


def _check_unit(reader: StoreReader, report: VerifyReport, where: str, topic: str, qid: int, q: int, off: int,
                size: int, tags: int) -> None:
    """The reference check of consume queue unit `q` (not a blank fill unit) against its record."""
    if off < report.commit_log_min:
        return  # expired: the commitlog file was deleted, RocketMQ skips these too
    if off >= report.commit_log_end:
        req, why = _record_at(reader, off, size)  # appended since the scan?
        if req is None:
            report.add("cq_unit", where, off, f"unit {q} points past the commitlog end {report.commit_log_end}")
            return
    else:
        req, why = _check_record(reader, off, size)
    if req is None:
        report.add("cq_unit", where, off, f"unit {q}: {why}")
    elif req.topic != topic or req.queue_id != qid or req.consume_queue_offset != q:
        report.add("cq_unit", where, off, f"unit {q} points at a record of {req.topic}-"
                   f"{req.queue_id} queue offset {req.consume_queue_offset}")
    elif req.tags_code != tags:
        report.add("cq_unit", where, off, f"unit {q}: tags code {tags} but the record's is {req.tags_code}")


def _encoded(topic: str) -> bytes | None:
    try:
        return topic.encode()
    except UnicodeEncodeError:  # a directory name that is not UTF-8: the reference compares it
        return None


def _cl_files(reader: StoreReader) -> list[tuple[int, Any, int]]:
    """The commitlog files for the C loops (taken again per call: `_record_at` may re-map them)."""
    return [(mf.file_from_offset, mf.mm if mf.mm is not None else mf.view, mf.mapped_size)
            for mf in reader.commit_log.mapped_files]


def _cq_span(cq: ConsumeQueue, start_index: int, max_count: int) -> tuple[Any, int, int] | None:
    """Where `cq.get_units(start_index, max_count)` would read: (buffer, position, units), None where it
    returns nothing (then the caller's reference loop rolls to the next file)."""
    logic = start_index * CQ_STORE_UNIT_SIZE
    if start_index < 0 or logic < cq._min_logic_offset:
        return None
    mf = cq.mapped_file_queue.find_mapped_file_by_offset(logic)
    if mf is None:
        return None
    pos = logic % cq.mapped_file_size
    end = min(mf.get_read_position(), pos + max_count * CQ_STORE_UNIT_SIZE)
    buf = mf.mm if mf.mm is not None else mf.view
    if end <= pos or (end - pos) % CQ_STORE_UNIT_SIZE or end > len(buf):
        return None
    return buf, pos, (end - pos) // CQ_STORE_UNIT_SIZE


def _verify_index(reader: StoreReader, report: VerifyReport, hash_slot_num: int | None,
                  index_num: int | None, fusion: _IndexFusion | None = None) -> None:
    ip = reader.index_path
    if not ip or not os.path.isdir(ip):
        return
    names = sorted(n for n in os.listdir(ip) if n.isdigit())
    if not names:
        return
    if len(names) == 1 and os.path.getsize(os.path.join(ip, names[0])) == 0:
        return  # the first index file is being created (or a crash came while creating it: load deletes it)
    if not (hash_slot_num and index_num):
        try:
            infer_index_geometry(ip)
        except ValueError as e:
            report.add("index_file", "index", -1, str(e))
            return
    svc = reader.index_service()
    if svc is None:
        return

    nat = _native_verify()
    cache: dict[int, tuple[codec.DispatchRequest | None, str]] = {}
    files = svc.files
    for fi, f in enumerate(files):
        report.index_files += 1
        where = f"index/{f.file_name}"
        if f.mm is None or f.mapped_size < f.file_size:
            if f is files[-1] and f.mapped_size == 0:
                continue  # being created by a live writer (or a crash while creating it)
            report.add("index_file", where, -1, f"{f.mapped_size} bytes, an index file of this geometry is "
                       f"{f.file_size}")
            continue
        count = f.index_count
        base = 40 + f.hash_slot_num * 4
        if nat is not None and 0 < count and base + count * 20 <= len(f.mm):
            report.index_entries += count - 1
            # the C loop passes the intact entries (those the walk passed are skipped)
            for a, b in (fusion.gaps(fi, count) if fusion is not None else [(1, count)]):
                for start in range(a, b, _SPAN):
                    for i, h, phy in nat.verify_index(f.mm, base, start, min(b, start + _SPAN), _cl_files(reader),
                                                      reader.commit_log.mapped_file_size, report.commit_log_min,
                                                      report.commit_log_end):
                        _check_entry(reader, report, where, i, h, phy, cache)
            continue
        entries = np.frombuffer(f.mm, dtype=INDEX_ENTRY_DTYPE, count=count, offset=base)
        try:
            for i in range(1, count):
                report.index_entries += 1
                _check_entry(reader, report, where, i, int(entries["h"][i]), int(entries["p"][i]), cache)
        finally:
            del entries


def _check_entry(reader: StoreReader, report: VerifyReport, where: str, i: int, h: int, phy: int,
                 cache: dict[int, tuple[codec.DispatchRequest | None, str]]) -> None:
    """The reference check of index entry `i`: a record at `phy` carrying a key that hashes to `h`."""
    if phy < report.commit_log_min:
        return
    got = cache.get(phy)
    if got is None:
        if len(cache) >= _CACHE_MAX:
            cache.clear()  # bounded: an index file's entries of one record are neighbours
        got = cache[phy] = (_record_at(reader, phy) if phy >= report.commit_log_end
                            else _check_record(reader, phy))
    if got[0] is None and phy >= report.commit_log_end:
        report.add("index_entry", where, phy, f"entry {i} points past the commitlog end")
        return
    req, why = got
    if req is None:
        report.add("index_entry", where, phy, f"entry {i}: {why}")
        return
    keys = record_index_keys(req)
    if not any(index_key_hash(f"{req.topic}#{k}") == h for k in keys):
        report.add("index_entry", where, phy, f"entry {i}: hash {h} is none of the record's keys")


def verify(path: str | os.PathLike[str], progress: Progress | None = None, *, check_queues: bool = True,
           check_index: bool = True, commit_log_file_size: int | None = None, hash_slot_num: int | None = None,
           index_num: int | None = None) -> VerifyReport:
    """Check a store read-only (safe beside a live writer); see the module docstring."""
    path = os.fspath(path)
    report = VerifyReport(path)
    reader = StoreReader(path, commit_log_file_size=commit_log_file_size, hash_slot_num=hash_slot_num,
                         index_num=index_num)
    try:
        # beside the walk (native, no live writer): the index entries and the consume queue units
        fuse = reader.root is not None and _native_verify() is not None and not _live(reader.root)
        fusion = _index_fusion(reader, hash_slot_num, index_num) if fuse and check_index else None
        qfusion = _queue_fusion(reader) if fuse and check_queues else None
        counts = _verify_commit_log(reader, report, progress, fusion, qfusion)
        if check_queues and reader.root is not None:
            _verify_consume_queues(reader, report, counts, qfusion)
        if check_index and reader.root is not None:
            _verify_index(reader, report, hash_slot_num, index_num, fusion)
    finally:
        for cq in _QUEUES.pop(id(reader), {}).values():
            cq.shutdown()
        reader.close()
    return report


# -- recover / rebuild -----------------------------------------------------------------------------------
def store_geometry(path: str) -> dict[str, int]:
    """The segment sizes a store was written with, read from its files (for opening it as it is)."""
    geo: dict[str, int] = {}
    cl = _segment_size(os.path.join(path, "commitlog"))
    if cl:
        geo["mapped_file_size_commit_log"] = cl
    cqroot = os.path.join(path, "consumequeue")
    if os.path.isdir(cqroot):
        sizes: dict[int, int] = {}
        for topic in os.listdir(cqroot):
            tdir = os.path.join(cqroot, topic)
            if not os.path.isdir(tdir):
                continue
            for q in os.listdir(tdir):
                qdir = os.path.join(tdir, q)
                if q.isdigit() and os.path.isdir(qdir):
                    for n in os.listdir(qdir):
                        if n.isdigit():
                            s = os.path.getsize(os.path.join(qdir, n))
                            if s and s % CQ_STORE_UNIT_SIZE == 0:
                                sizes[s] = sizes.get(s, 0) + 1
        if sizes:
            geo["mapped_file_size_consume_queue"] = max(sizes, key=lambda s: sizes[s])
    ip = os.path.join(path, "index")
    if os.path.isdir(ip) and any(n.isdigit() for n in os.listdir(ip)):
        try:
            geo["max_hash_slot_num"], geo["max_index_num"] = infer_index_geometry(ip)
        except ValueError:
            pass
    return geo


@dataclass
class RepairReport:
    """What `recover` or `rebuild` did: the recovery report plus the resulting queue and index totals."""

    path: str
    action: str
    recovery: dict[str, Any]
    queues: int = 0
    units: int = 0
    index_entries: int = 0
    abort_cleared: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clear_abort(path: str) -> bool:
    """Remove `abort` after a completed repair, under the store lock (refused when someone holds it)."""
    abort = os.path.join(path, "abort")
    if not os.path.exists(abort):
        return False
    fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            return False
        try:
            os.unlink(abort)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)  # closing drops both locks


def _repair(path: str | os.PathLike[str], action: str, progress: Progress | None,
            config: dict[str, Any]) -> RepairReport:
    path = os.fspath(path)
    if not os.path.isdir(os.path.join(path, "commitlog")):
        raise FileNotFoundError(f"{path} is not a store root (no commitlog/ directory)")
    cfg = {**store_geometry(path), **config}
    store = MessageStore(store_path_root_dir=path, **cfg)
    store.load(drop_derived=action == "rebuild", progress=progress)  # StoreLockedError when held
    rec = store.recovery_report
    out = RepairReport(path, action, rec.as_dict() if rec is not None else {})
    for cq in store._all_consume_queues():
        out.queues += 1
        out.units += cq.get_max_offset_in_queue() - cq.get_min_offset_in_queue()
    out.index_entries = store.index_service.get_total_entries()
    caught_up = store.reput_message_service.is_caught_up()
    store.shutdown()
    if caught_up:
        out.abort_cleared = _clear_abort(path)
    return out


def recover(path: str | os.PathLike[str], progress: Progress | None = None, **config: Any) -> RepairReport:
    """Run recovery on a store that is not open elsewhere (its lock is taken; `StoreLockedError` if held)."""
    return _repair(path, "recover", progress, config)


def rebuild(path: str | os.PathLike[str], progress: Progress | None = None, **config: Any) -> RepairReport:
    """Delete the consume queues and the index and rebuild them from the commitlog (under the lock)."""
    return _repair(path, "rebuild", progress, config)
