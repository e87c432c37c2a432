"""Store recovery at load: find the commitlog's valid end, cut what lies past it, re-dispatch what is missing.

RocketMQ's rules (spec §9) with three changes that keep a restart cheap and a damaged derived file harmless:

* **Clean restart without a scan.** A clean shutdown records the exact commitlog end in the checkpoint's
  `confirmPhyOffset` (a 5.1.1+ field that a non-controller Java broker only logs and overwrites). At the
  next load that hint is verified instead of rescanning the last three files: the walk starts at the
  last record a consume queue points at and must land exactly on the hint, followed by zeroed space.
  Anything else (a hint from another writer, a store copied in, damage) falls back to RocketMQ's scan.
* **Abnormal recovery costs the tail.** Records are walked with `codec.skim_records` (TOTALSIZE hops,
  body CRC, no string decoding); a `DispatchRequest` is built only for records a consume queue or the
  index does not hold yet (the queue's max physical offset, the index's end offset say where they stop).
  The records of the previous file are included when a crash came right after a roll (RocketMQ #1434).
* **Derived files never stop a start (RocketMQ #10108).** Consume queue tails are checked against the
  records they point at and cut back to the last unit that matches; a queue whose files cannot be
  opened is dropped and rebuilt from the commitlog. After an abnormal exit the newest index files are
  kept when their last entry matches the commitlog (RocketMQ deletes them and rebuilds, #8007), their
  hash chains are relinked when a put was cut short (slots pointing past indexCount), and their entries
  past the recovered end are unlinked.

After a cut the bytes behind the new end are zeroed (RocketMQ leaves them): a copy interrupted by SIGKILL
can leave the later bytes of a record written and its header not, and the next clean restart expects
zeroed space right after the end. A flipped bit in the middle of a log that was shut down cleanly is
not looked for at restart (that would mean rescanning it); `rmq-eventstore verify` reports it.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..common import codec
from ..common.codec import SKIM_BLANK, SKIM_DAMAGE, SKIM_END, SKIM_OK
from .consume_queue import BLANK_UNIT_SIZE, ConsumeQueue
from .index import index_key_hash, record_index_keys

if TYPE_CHECKING:
    from .commitlog import CommitLog
    from .message_store import MessageStore

log = logging.getLogger(__name__)

DISPATCH_BATCH = 8192
CQ_TAIL_CHECK_LIMIT = 1 << 20  # units walked back looking for one that matches its record
Progress = Callable[[int], None]


@dataclass
class RecoveryReport:
    """What a recovery did, for logs, `rmq-eventstore recover` and the benchmarks."""

    mode: str = ""  # empty | normal-fast | normal-scan | abnormal
    last_exit_ok: bool = True
    commit_log_end: int = 0
    scan_start: int = 0
    bytes_scanned: int = 0
    damage_offset: int = -1
    damage: str = ""
    truncated_bytes: int = 0  # non-zero bytes cleared after the recovered end
    commit_log_files_deleted: int = 0
    dispatch_start: int = -1
    records_dispatched: int = 0
    cq_units_dropped: int = 0
    cqs_rebuilt: list[str] = field(default_factory=list)
    index_entries_dropped: int = 0
    index_files_dropped: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WalkResult:
    """Where a commitlog walk stopped and why."""

    end: int
    state: str  # end | damage
    reason: str = ""
    bytes_scanned: int = 0
    records: int = 0


_TRAILER_HEAD = (codec.PROPERTY_CRC32 + codec.NAME_VALUE_SEPARATOR).encode()


def prop_crc_damage(buf: codec.Buffer, pos: int, size: int) -> str:
    """Why the record at `buf[pos:pos + size]` fails `force_verify_prop_crc`, '' when it passes.

    RocketMQ's check (`checkMessageAndReturnSize`): the `__CRC32#` property must be there and equal the CRC
    of the record's bytes before its last 20. One change: a record without the property was written whole
    by a writer without `enabled_append_prop_crc` (a store from before the setting, RocketMQ's default, an
    embedded store) unless its properties (its topic, when it has none) end with a zero byte, and keeps the
    body CRC check where RocketMQ would truncate the log at it. A copy cut short by a kill ends in zeros (a
    commitlog file's space is zero until written, and recovery zeroes what follows the end), while whole
    properties end with 0x02 or a value's character, and topics hold no zero byte.
    """
    end = pos + size
    # The trailer at the end after a 0x02 (what every writer with the setting writes for a broker): the
    # property Java's map would find; compared without parsing the record (the walk's skim checked the rest).
    tail = bytes(buf[end - 21:end]) if size > 112 else b""
    if tail[:1] == b"\x02" and tail[20:] == b"\x02" and tail.startswith(_TRAILER_HEAD, 1):
        digits = tail[10:20]
        if digits.isdigit():
            if int(digits[::-1]) == zlib.crc32(buf[pos:end - codec.CRC32_RESERVED_LEN]) & 0x7FFFFFFF:
                return ""
            return "__CRC32# property mismatch"
    c = codec.check_message_and_return_size(buf, pos, True, end, verify_prop_crc=True)
    if c.success:
        return ""
    if c.reason != codec.PROP_CRC_MISSING:
        return c.reason or "unreadable record"
    r = codec.check_message_and_return_size(buf, pos, False, pos + size)
    if not r.success or r.request is None:
        return r.reason or "unreadable record"
    tail = r.request.properties_string or r.request.topic
    return "" if tail and tail[-1] != "\x00" else codec.PROP_CRC_MISSING


def walk_commit_log(commit_log: CommitLog, start: int, check_crc: bool,
                    on_records: Callable[[int, memoryview, list[tuple]], None] | None = None,
                    progress: Progress | None = None, stop: int | None = None) -> WalkResult:
    """Walk the records from `start` (a record boundary) across files, rolling over BLANK records, until
    zeroed space, damage, the last file's end or `stop`. `on_records(file_from_offset, view, records)`
    sees every chunk of valid records. With `force_verify_prop_crc` configured, a CRC-checked walk also
    checks every record's `__CRC32#` property (`prop_crc_damage`; its trailer test runs in the skim's loop,
    `codec.skim_records_prop_crc`, the full `check_message_and_return_size` only for records without one)."""
    prop_crc = check_crc and commit_log.config.force_verify_prop_crc
    mfq = commit_log.mapped_file_queue
    files = mfq.mapped_files
    if not files:
        return WalkResult(0, SKIM_END)
    size = mfq.mapped_file_size
    mf = mfq.find_mapped_file_by_offset(start)
    if mf is None:
        if start >= files[-1].file_from_offset + size or start < files[0].file_from_offset:
            return WalkResult(start, SKIM_END)
        return WalkResult(start, SKIM_DAMAGE, "no commitlog file holds this offset")
    idx = files.index(mf)
    pos = start - mf.file_from_offset
    scanned = records = 0
    keep = on_records is not None
    while True:
        limit = mf.mapped_size
        if stop is not None and mf.file_from_offset <= stop < mf.file_from_offset + size:
            limit = min(limit, stop - mf.file_from_offset)
        while True:
            buf = mf.mm if mf.mm is not None else mf.view
            if prop_crc:
                # the trailer check runs in the walk's loop (C); the records it leaves get the full one
                recs, nxt, state, reason, undecided = codec.skim_records_prop_crc(buf, pos, limit, check_crc)
                for i in undecided:
                    r = recs[i]
                    why = prop_crc_damage(mf.view, r[0], r[1])
                    if why:
                        recs, nxt, state, reason = recs[:i], r[0], SKIM_DAMAGE, why
                        break
            else:
                recs, nxt, state, reason = codec.skim_records(buf, pos, limit, check_crc, keep=keep)
            scanned += nxt - pos
            if progress is not None and nxt > pos:
                progress(nxt - pos)
            if keep and recs:
                on_records(mf.file_from_offset, mf.view, recs)  # type: ignore[misc]
                records += len(recs)
            pos = nxt
            if state != SKIM_OK:
                break
        end = mf.file_from_offset + pos
        if state == SKIM_DAMAGE:
            return WalkResult(end, SKIM_DAMAGE, reason, scanned, records)
        if stop is not None and end >= stop:
            return WalkResult(end, SKIM_END, "", scanned, records)
        if (state == SKIM_BLANK or pos >= size) and idx + 1 < len(files):
            idx += 1
            mf = files[idx]
            pos = 0
            continue
        return WalkResult(end, SKIM_END, "", scanned, records)


def _last_unit_record(cq: ConsumeQueue) -> tuple[int, int] | None:
    """(offset, size) of the newest non-blank unit of a queue."""
    n = cq.get_max_offset_in_queue()
    lo = cq.get_min_offset_in_queue()
    for k in range(n - 1, max(lo, n - 64) - 1, -1):
        u = cq.get_unit(k)
        if u is None:
            return None
        if u[0] == 0 and u[1] == BLANK_UNIT_SIZE:
            continue
        return u[0], u[1]
    return None


def _unit_matches(commit_log: CommitLog, cq: ConsumeQueue, index: int, unit: tuple[int, int, int],
                  end: int) -> bool:
    """Does CQ unit `index` point at a valid record of this queue, with this size, queue offset and tags
    code? (A unit torn by a kill can have its offset and size and not its tags code.)"""
    offset, size, tags = unit
    if offset == 0 and size == BLANK_UNIT_SIZE:
        return True
    if offset < 0 or size <= 0 or offset + size > end:
        return False
    buf = commit_log.get_message(offset, size)
    if buf is None:
        return False
    try:
        r = codec.check_message_and_return_size(buf, 0, False, size)
    finally:
        buf.release()
    q = r.request
    return (r.success and q is not None and r.size == size and q.queue_id == cq.queue_id
            and q.consume_queue_offset == index and q.topic == cq.topic and q.tags_code == tags)


CQ_TAIL_WINDOW = 16  # newest units checked against their records (one dispatch run can be torn)


def check_cq_tail(commit_log: CommitLog, cq: ConsumeQueue, end: int) -> int:
    """Cut a queue back before the oldest of its newest units that does not match its record (and on
    back to a unit that does); returns the units dropped."""
    n = cq.get_max_offset_in_queue()
    lo = cq.get_min_offset_in_queue()
    first_bad = None
    for k in range(max(lo, n - CQ_TAIL_WINDOW), n):
        u = cq.get_unit(k)
        if u is None or not _unit_matches(commit_log, cq, k, u, end):
            first_bad = k
            break
    if first_bad is None:
        return 0
    k = first_bad - 1
    checked = 0
    while k >= lo and checked < CQ_TAIL_CHECK_LIMIT:
        u = cq.get_unit(k)
        if u is not None and _unit_matches(commit_log, cq, k, u, end):
            break
        k -= 1
        checked += 1
    keep = k + 1
    log.warning("consume queue %s-%d: units %d..%d do not match the commitlog; cutting them", cq.topic,
                cq.queue_id, keep, n - 1)
    cq.truncate_to_units(keep)
    return n - keep


def _zero_after(commit_log: CommitLog, end: int, window: int | None = None) -> int:
    """Clear the non-zero bytes left after `end` in its file (a torn or damaged tail; a copy interrupted by
    SIGKILL can leave a record's later bytes written and its header not), at most `window` bytes on
    (default: the rest of the file); returns the bytes cleared. Later clean restarts then find zeroed
    space right after the end."""
    mf = commit_log.mapped_file_queue.find_mapped_file_by_offset(end)
    if mf is None or mf.mm is None or mf.read_only:
        return 0
    pos = end - mf.file_from_offset
    size = mf.mapped_size if window is None else min(mf.mapped_size, pos + window)
    chunk = 1 << 20
    last = pos
    hi = size
    while hi > pos:
        lo = max(pos, hi - chunk)
        arr = np.frombuffer(mf.mm, dtype=np.uint8, count=hi - lo, offset=lo)
        try:
            nz = np.flatnonzero(arr)
            if nz.size:
                last = lo + int(nz[-1]) + 1
                break
        finally:
            del arr
        hi = lo
    if last > pos:
        mf.write_at(pos, bytes(last - pos))
    return last - pos


def _index_file_matches(store: MessageStore, f: Any, end: int) -> bool:
    """Is the newest entry of an index file a key of the record it points at (below `end`)?"""
    e = f.last_entry()
    if e is None:
        return f.index_count <= 1
    h, phy, _t, _prev = e
    if phy < store.commit_log.get_min_offset() or phy >= end:
        return phy >= end  # entries past the end are cut later; the file itself may be fine
    req = _request_at(store, phy)
    if req is None:
        return False
    keys = record_index_keys(req)
    return any(index_key_hash(f"{req.topic}#{k}") == h for k in keys)


def _recover_index(store: MessageStore, end: int, report: RecoveryReport) -> None:
    svc = store.index_service
    cp = store.checkpoint
    if not store.last_exit_ok and cp is not None:
        # Files written after the checkpoint's indexMsgTimestamp were not necessarily flushed: keep those
        # whose newest entry matches the commitlog, drop the first that does not and everything after it.
        files = svc.files
        bad_from = None
        for i, f in enumerate(files):
            if f.end_timestamp > cp.index_msg_timestamp and not _index_file_matches(store, f, end):
                bad_from = i
                break
        if bad_from is not None:
            for f in files[bad_from:]:
                log.warning("index file %s does not match the commitlog: rebuilding it", f.file_name)
                report.index_files_dropped += 1
            svc.drop_files_from(bad_from)
        prev_phy = prev_ts = 0
        for f in svc.files:
            if f.end_timestamp >= cp.index_msg_timestamp:
                if f.rebuild_chains():
                    log.warning("index file %s: hash chains relinked (killed while writing it)", f.file_name)
                if f.repair_header(prev_phy, prev_ts):
                    log.warning("index file %s: header end offset repaired (killed while writing it)",
                                f.file_name)
            prev_phy, prev_ts = f.end_phy_offset, f.end_timestamp
    # Entries past the recovered end point at records that are gone: unlink them, newest files first.
    for f in reversed(svc.files):
        if f.index_count <= 1 and f.end_phy_offset < end:
            break
        if f.begin_phy_offset >= end and f.index_count > 1 and f is not svc.files[0]:
            report.index_entries_dropped += f.entry_count
            report.index_files_dropped += 1
            svc.drop_files_from(svc.files.index(f))
            continue
        dropped = f.truncate_from(end)
        report.index_entries_dropped += dropped
        if not dropped:
            break


class _Dispatcher:
    """Builds DispatchRequests only for the records the consume queues or the index lack."""

    def __init__(self, store: MessageStore, index_from: int) -> None:
        self.store = store
        self.index_from = index_from  # records at or after this offset go to the index
        self.index_enabled = store.config.message_index_enable
        self.cq_max: dict[tuple[bytes, int], int] = {}
        self.pending: list[codec.DispatchRequest] = []
        self.dispatched = 0

    def _queue_end(self, topic: bytes, queue_id: int) -> int:
        key = (topic, queue_id)
        v = self.cq_max.get(key)
        if v is None:
            cq = self.store.find_consume_queue(topic.decode("utf-8", "replace"), queue_id, create=False)
            v = cq.max_physic_offset if cq is not None else -1
            self.cq_max[key] = v
        return v

    def __call__(self, base: int, view: memoryview, recs: list[tuple]) -> None:
        """One chunk of `codec.skim_records` tuples (`SkimmedRecord` order) of the file at `base`."""
        prepared = codec.TRANSACTION_PREPARED_TYPE
        index_from = self.index_from if self.index_enabled else 1 << 62
        cq_max = self.cq_max
        for pos, size, queue_id, _qoff, sys_flag, _ts, topic in recs:
            off = base + pos
            need = off >= index_from
            if not need and not sys_flag & prepared:
                end = cq_max.get((topic, queue_id))
                if end is None:
                    end = self._queue_end(topic, queue_id)
                need = off + size > end
            if need:
                c = codec.check_message_and_return_size(view, pos, False, pos + size,
                                                        delay_levels=self.store.commit_log.encoder.delay_levels)
                if c.request is not None:
                    self.pending.append(c.request._replace(commit_log_offset=off))
                    if len(self.pending) >= DISPATCH_BATCH:
                        self.flush()

    def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.store._dispatch(batch)
            self.dispatched += len(batch)


NO_INDEX = 1 << 62


def _index_resume_offset(store: MessageStore, min_off: int) -> tuple[int, int]:
    """(record start to walk from, first offset the index lacks) for the index: the last indexed
    record is held, everything after it is not. (NO_INDEX, NO_INDEX) when the index is disabled."""
    if not store.config.message_index_enable:
        return NO_INDEX, NO_INDEX
    files = store.index_service.files
    if not files:
        return min_off, min_off
    last = files[-1]
    if last.index_count > 1 or last.end_phy_offset > 0:
        x = last.end_phy_offset
        if x < min_off:
            return min_off, min_off
        # The newest record may have only some of its keys indexed (killed between two entries, or
        # between the entries written to a full file and the rest written to the next one): then its
        # entries are cut and it is indexed again.
        want = _record_key_count(store, x)
        have = 0
        for f in files[-2:]:
            have += f.count_entries_at(x)
        if want is not None and have >= want:
            return x, x + 1
        for f in reversed(files):
            if not f.truncate_from(x) and f.end_phy_offset < x:
                break
        return x, x
    return min_off, min_off


def _request_at(store: MessageStore, offset: int) -> codec.DispatchRequest | None:
    """The dispatch request of the valid record at commitlog `offset` (no CRC check), else None."""
    buf = store.commit_log.read_record(offset)
    if buf is None:
        return None
    try:
        r = codec.check_message_and_return_size(buf, 0, False, len(buf))
    finally:
        buf.release()
    return r.request if r.success else None


def _record_key_count(store: MessageStore, offset: int) -> int | None:
    """How many index entries the record at `offset` gets (UNIQ_KEY + every KEYS token); None if unreadable."""
    req = _request_at(store, offset)
    return None if req is None else len(record_index_keys(req))


def recover_store(store: MessageStore, progress: Progress | None = None,
                  rebuilt: list[str] | None = None) -> RecoveryReport:
    """Recover a loaded store (its files mapped, the checkpoint read): see the module docstring.

    `rebuilt` names the queues whose files were dropped at load and must be rebuilt from the whole log.
    """
    t0 = time.perf_counter()
    cfg = store.config
    cl = store.commit_log
    mfq = cl.mapped_file_queue
    report = RecoveryReport(last_exit_ok=store.last_exit_ok, cqs_rebuilt=list(rebuilt or []))
    cqs = list(store._all_consume_queues())
    damaged_cqs = [cq for cq in cqs if cq.recover()]
    files = mfq.mapped_files
    if not files:
        for cq in cqs:
            cq.destroy()
        store.consume_queue_table.clear()
        if store.index_service.files:
            report.index_files_dropped = len(store.index_service.files)
            store.index_service.drop_files_from(0)
        mfq.flushed_where = mfq.committed_where = 0
        report.mode = "empty"
        report.seconds = time.perf_counter() - t0
        return report
    check_crc = cfg.check_crc_on_recover
    min_off = max(cl.get_min_offset(), 0)
    redo = 1 << 62  # the lowest end of a consume queue cut back because its tail did not match
    for cq in damaged_cqs:
        log.warning("consume queue %s-%d had units after a hole or an invalid unit: dispatching again from "
                    "its valid end", cq.topic, cq.queue_id)
        redo = min(redo, max(cq.max_physic_offset, min_off))
    for cq in cqs:
        if not cq.mapped_file_queue.mapped_files:  # a queue directory whose files are gone
            report.cqs_rebuilt.append(f"{cq.topic}-{cq.queue_id}")
    anchor = -1
    for cq in cqs:
        u = _last_unit_record(cq)
        if u is not None and u[0] >= min_off:
            anchor = max(anchor, u[0])
    walk: WalkResult | None = None
    cp = store.checkpoint
    if store.last_exit_ok:
        hint = cp.confirm_phy_offset if cp is not None else 0
        if 0 < hint and anchor >= 0 and anchor < hint <= mfq.get_max_offset():
            w = walk_commit_log(cl, anchor, check_crc, stop=None)
            if w.state == SKIM_END and w.end == hint:
                walk = w
                report.mode = "normal-fast"
                report.scan_start = anchor
        if walk is None:
            report.mode = "normal-scan"
            report.scan_start = files[max(0, len(files) - 3)].file_from_offset
            walk = walk_commit_log(cl, report.scan_start, check_crc, progress=progress)
    else:
        report.mode = "abnormal"
        min_ts = 0
        if cp is not None:
            min_ts = (cp.get_min_timestamp_index() if cfg.message_index_enable and cfg.message_index_safe
                      else cp.get_min_timestamp())
        report.scan_start = cl.abnormal_recover_start_offset(min_ts)

    # Abnormal: one walk finds the end and dispatches what the queues and index lack.
    dispatcher: _Dispatcher | None = None
    if walk is None:
        # consume queue tails that point at garbage are cut before deciding what they lack
        for cq in cqs:
            cut = check_cq_tail(cl, cq, mfq.get_max_offset())
            if cut:
                report.cq_units_dropped += cut
                redo = min(redo, max(cq.max_physic_offset, min_off))
        _recover_index(store, mfq.get_max_offset(), report)
        index_walk, index_from = _index_resume_offset(store, min_off)
        # The dispatch frontier the queues prove (the end of the newest record any queue holds): the
        # records before it were dispatched, those after it may not be, even in the file before the
        # checkpoint's start file (a crash right after a roll, RocketMQ #1434).
        max_cq_phy = max((cq.max_physic_offset for cq in cqs), default=-1)
        frontier = _record_boundary_at_or_before(store, max(max_cq_phy, min_off), min_off)
        dispatch_start = min(report.scan_start, index_walk, frontier,
                             _record_boundary_at_or_before(store, redo, min_off))
        if report.cqs_rebuilt:
            dispatch_start = min_off
        dispatcher = _Dispatcher(store, index_from)
        report.dispatch_start = dispatch_start
        if dispatch_start < report.scan_start:
            # records before the CRC-checked tail: only what the derived files lack, no truncation here
            w0 = walk_commit_log(cl, dispatch_start, False, dispatcher, progress, stop=report.scan_start)
            report.bytes_scanned += w0.bytes_scanned
            if w0.state == SKIM_DAMAGE:
                log.error("damaged record at %d before the recovery start (%s); the derived files may miss "
                          "records after it, run `rmq-eventstore verify`", w0.end, w0.reason)
        walk = walk_commit_log(cl, report.scan_start, check_crc, dispatcher, progress)
    report.bytes_scanned += walk.bytes_scanned
    end = walk.end
    if walk.state == SKIM_DAMAGE:
        report.damage_offset = end
        report.damage = walk.reason
        log.warning("commitlog damaged at %d (%s): truncating the log there", end, walk.reason)
    report.commit_log_end = end

    # Cut the log at the end: later files go, the stale tail of the last one is cleared.
    before = len(mfq.mapped_files)
    mfq.flushed_where = mfq.committed_where = end
    mfq.truncate_dirty_files(end)
    report.commit_log_files_deleted = before - len(mfq.mapped_files)
    if walk.state == SKIM_DAMAGE:
        report.truncated_bytes = _zero_after(cl, end)
    elif report.mode != "normal-fast":
        # zeroed header, but maybe the rest of a torn record behind it: clear up to two records' worth
        report.truncated_bytes = _zero_after(cl, end, max(8 << 20, 2 * cfg.max_message_size + (64 << 10)))
    cl.confirm_offset = end
    if cp is not None:
        cp.confirm_phy_offset = end

    # Consume queues and index: nothing may point past the end.
    for cq in list(store._all_consume_queues()):
        if cq.max_physic_offset > end or _max_unit_start(cq) >= end:
            before_units = cq.get_max_offset_in_queue()
            cq.truncate_dirty_logic_files(end)
            report.cq_units_dropped += before_units - cq.get_max_offset_in_queue()
            # (after a clean stop such units are garbage: what they hid is dispatched again below)
            redo = min(redo, max(cq.max_physic_offset, min_off))
    if dispatcher is None:
        for cq in list(store._all_consume_queues()):
            cut = check_cq_tail(cl, cq, end)
            if cut:
                report.cq_units_dropped += cut
                redo = min(redo, max(cq.max_physic_offset, min_off))
        _recover_index(store, end, report)
        # A clean stop leaves everything dispatched; records after the queues' and index's ends (a log
        # written elsewhere, a queue rebuilt) are dispatched now.
        max_cq_phy = max((cq.max_physic_offset for cq in store._all_consume_queues()), default=-1)
        index_walk, index_from = _index_resume_offset(store, min_off)
        start = min(max(max_cq_phy, min_off) if max_cq_phy >= 0 else min_off, index_walk, redo)
        if report.cqs_rebuilt:
            start = min_off
        start = min(max(start, min_off), end)
        report.dispatch_start = start
        if start < end:
            dispatcher = _Dispatcher(store, index_from)
            # the start may sit inside a record (an index resume point): begin at a record boundary
            boundary = _record_boundary_at_or_before(store, start, min_off)
            w2 = walk_commit_log(cl, boundary, False, dispatcher, progress, stop=end)
            report.bytes_scanned += w2.bytes_scanned
    else:
        # the index entries of records past the end were cut above; cut again in case dispatch ran past
        _recover_index(store, end, report)
    if dispatcher is not None:
        dispatcher.flush()
        report.records_dispatched = dispatcher.dispatched
    rs = store.reput_message_service
    rs.reput_from_offset = rs.dispatched_offset = end
    report.seconds = time.perf_counter() - t0
    log.info("store recovery: %s", report)
    return report


def extend_short_last_segment(commit_log_path: str, file_size: int) -> bool:
    """A last commitlog file shorter than the segment size (its tail lost in a crash, or a copy cut
    short) is extended with zeros so it can be mapped; recovery then finds where its records end.
    Files that are not the last keep RocketMQ's rule: a wrong size is an error."""
    try:
        names = sorted((n for n in os.listdir(commit_log_path) if n.isdigit()), key=int)
    except FileNotFoundError:
        return False
    if not names:
        return False
    path = os.path.join(commit_log_path, names[-1])
    size = os.path.getsize(path)
    # A file of a whole number of pages and no sibling of the configured size may be a store written
    # with another segment size: leave it for the geometry check (a clear error, nothing changed).
    others_ok = len(names) > 1 and all(
        os.path.getsize(os.path.join(commit_log_path, n)) == file_size for n in names[:-1])
    if 0 < size < file_size and (size % 4096 or others_ok):
        log.warning("commitlog file %s is %d bytes, not %d: extending it with zeros for recovery", path, size,
                    file_size)
        with open(path, "r+b") as f:
            f.truncate(file_size)
            os.fsync(f.fileno())
        return True
    return False


def _max_unit_start(cq: ConsumeQueue) -> int:
    u = _last_unit_record(cq)
    return u[0] if u is not None else -1


def _record_boundary_at_or_before(store: MessageStore, offset: int, min_off: int) -> int:
    """A record start at or before `offset`: the start of its file when `offset` is not one itself."""
    cl = store.commit_log
    head = cl.get_message(offset, 8)
    if head is not None:
        size, magic = codec.read_size_magic(head, 0)
        head.release()
        if (magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2, codec.BLANK_MAGIC_CODE)
                and size > 0) or (size == 0 and magic == 0):  # a record, a BLANK, or the zeroed end
            return offset
    return max(offset - offset % cl.file_size, min_off)
