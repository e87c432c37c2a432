"""Read-only inspection of a store directory (ours or Apache RocketMQ's), as library functions.

What the `rmq-eventstore inspect | query | msg | dump` commands and the Django `eventstore` management
command both show, without any presentation: functions return plain data (JSON-ready dicts, messages,
iterators) and report progress through an optional `progress(n)` callback (told about every `n` more
commitlog bytes processed) and oddities through an optional `warn(text)` callback. Errors a user can
fix (a missing path, no record at an offset, index files of an unknown geometry) are `InspectionError`.

Everything goes through `StoreReader`, which maps files read-only: nothing here writes to, locks or
truncates a store, so it is safe beside a live broker.

* `open_reader(path)`: a `StoreReader` with clear errors.
* `collect_inspection(reader, path)`: lock/abort files, checkpoint, commitlog segments (valid end,
  records, BLANK, damage), topics and queues, index files, config files; `report["ok"]` is False on damage.
* `message_at(reader, offset)`, `message_by_id(reader, msg_id)`: one message.
* `query_messages(reader, topic, key)`: messages by key, through the index when present, else a scan.
* `dump_messages(reader, topic, queue_id)`: a topic's messages, through the consume queues when present,
  else by scanning the commitlog.
"""

from __future__ import annotations

import collections
import heapq
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..common import codec
from ..common.message import MessageExt
from .config_files import (
    CONSUMER_OFFSET_FILE,
    DELAY_OFFSET_FILE,
    SUBSCRIPTION_GROUP_FILE,
    TOPIC_GROUP_SEPARATOR,
    TOPICS_FILE,
    ConfigFileError,
    fastjson_loads,
    read_config_file,
)
from .index import HASH_SLOT_SIZE, INDEX_HEADER_SIZE, INDEX_SIZE, IndexService
from .mapped_file import MappedFile
from .message_store import lock_holder
from .reader import SegmentInfo, StoreReader, is_zero
from .reader import scan_segment as reader_scan_segment

Progress = Callable[[int], None]
Warn = Callable[[str], None]

DEFAULT_QUERY_MAX = 32  # DefaultMessageStore's defaultQueryMaxNum
MAX_TIMESTAMP = 2**62
INDEX_ENTRIES_PER_SLOT = 4  # RocketMQ's default geometry: maxIndexNum = 4 * maxHashSlotNum
GEOMETRY_HINT = "pass the broker's maxHashSlotNum and/or maxIndexNum (hash_slot_num= / index_num=)"
GEOMETRY_NOT_POSITIVE = "the number of hash slots and of index entries must be positive"
CHECKPOINT_FIELDS = ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp", "masterFlushedOffset",
                     "confirmPhyOffset")
_CHECKPOINT_ATTRS = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
                     "master_flushed_offset", "confirm_phy_offset")
_INDEX_NAME_RE = re.compile(r"^\d{17}$")
_INDEX_HEADER = struct.Struct(">qqqqii")


class InspectionError(Exception):
    """A problem a user can fix (a missing path, no record at an offset, an unknown index geometry)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------


def iso_local(ms: int) -> str | None:
    """A millisecond timestamp as ISO local time (`2023-11-14T23:13:20.005`); None for 0 or nonsense."""
    if ms <= 0:
        return None
    try:
        dt = datetime.fromtimestamp(ms // 1000) + timedelta(milliseconds=ms % 1000)
    except (OverflowError, OSError, ValueError):
        return None
    return dt.isoformat(timespec="milliseconds")


def is_dispatched(sys_flag: int) -> bool:
    """True for records a consume queue holds (not transaction PREPARED or ROLLBACK), as dispatch decides."""
    return codec.transaction_value(sys_flag) in (codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_COMMIT_TYPE)


def describe_os_error(e: OSError) -> str:
    if e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e)


def _advance(progress: Progress | None, n: int) -> None:
    if progress is not None and n > 0:
        progress(n)


def commit_log_bytes(reader: StoreReader) -> int:
    """Bytes of the commitlog segments (the total a progress callback is told about in a full scan)."""
    return sum(mf.mapped_size for mf in reader.commit_log.mapped_files)


# ---------------------------------------------------------------------------------------------------
# opening a store
# ---------------------------------------------------------------------------------------------------


def open_reader(path: str | os.PathLike[str], commit_log_file_size: int | None = None) -> StoreReader:
    """A `StoreReader` on `path` (a store root or a directory of commitlog segments), with clear
    `InspectionError`s for a missing path or a directory that is no store."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InspectionError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise InspectionError(f"{path}: not a directory (give a store root or a commitlog directory)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InspectionError(f"{path}: permission denied")
    try:
        return StoreReader(path, commit_log_file_size=commit_log_file_size)
    except FileNotFoundError as e:
        if e.filename:
            raise InspectionError(describe_os_error(e)) from None
        raise InspectionError(f"{path}: not a store: {e}") from None


def index_names(index_path: str | None) -> list[str]:
    """Names of the index files (17-digit `yyyyMMddHHmmssSSS`) in `index_path`, oldest first."""
    if not index_path or not os.path.isdir(index_path):
        return []
    return sorted(n for n in os.listdir(index_path)
                  if _INDEX_NAME_RE.match(n) and os.path.isfile(os.path.join(index_path, n)))


def infer_index_geometry(file_size: int, hash_slot_num: int | None = None, index_num: int | None = None,
                         hint: str = GEOMETRY_HINT) -> tuple[int, int]:
    """(hashSlotNum, indexNum) of an index file of `file_size` bytes (`40 + 4·slots + 20·entries`).

    With neither given, RocketMQ's 4:1 entries:slots ratio is assumed (`size = 40 + 84·slots`); with one
    given the other follows from the size. `InspectionError` (ending with `hint`) when the size does not
    fit.
    """
    body = file_size - INDEX_HEADER_SIZE
    if (hash_slot_num is not None and hash_slot_num <= 0) or (index_num is not None and index_num <= 0):
        raise InspectionError(GEOMETRY_NOT_POSITIVE)
    if hash_slot_num is not None and index_num is not None:
        if INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE < file_size:
            raise InspectionError(f"index files of {file_size} bytes are larger than {hash_slot_num} slots "
                                  f"and {index_num} entries allow")
        return hash_slot_num, index_num
    if hash_slot_num is not None:
        rest = body - hash_slot_num * HASH_SLOT_SIZE
        if rest <= 0 or rest % INDEX_SIZE:
            raise InspectionError(f"index files of {file_size} bytes do not fit {hash_slot_num} hash slots; "
                                  f"{hint}")
        return hash_slot_num, rest // INDEX_SIZE
    if index_num is not None:
        rest = body - index_num * INDEX_SIZE
        if rest <= 0 or rest % HASH_SLOT_SIZE:
            raise InspectionError(f"index files of {file_size} bytes do not fit {index_num} entries; {hint}")
        return rest // HASH_SLOT_SIZE, index_num
    per_slot = HASH_SLOT_SIZE + INDEX_ENTRIES_PER_SLOT * INDEX_SIZE
    if body <= 0 or body % per_slot:
        raise InspectionError(f"cannot infer the geometry of index files of {file_size} bytes "
                              f"(not 40 + 84 x slots, RocketMQ's 4:1 ratio); {hint}")
    slots = body // per_slot
    return slots, slots * INDEX_ENTRIES_PER_SLOT


def open_index(reader: StoreReader, hash_slot_num: int | None = None, index_num: int | None = None,
               max_batch: int = 64, hint: str = GEOMETRY_HINT) -> IndexService | None:
    """A read-only `IndexService` on the store's index files, geometry inferred from their size (or given);
    None when the store has no index files. The caller shuts it down."""
    names = index_names(reader.index_path)
    if not names:
        return None
    assert reader.index_path is not None
    size = max(os.path.getsize(os.path.join(reader.index_path, n)) for n in names)
    slots, num = infer_index_geometry(size, hash_slot_num, index_num, hint)
    svc = IndexService(reader.index_path, slots, num, max_msgs_num_batch=max_batch, read_only=True)
    svc.load(True)
    return svc


# ---------------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------------


@dataclass
class QueueStats:
    """Queue offsets seen for one (topic, queue) in commitlog records."""

    min_offset: int
    max_offset: int  # one past the highest queue offset, like a consume queue's max offset
    count: int = 1


@dataclass
class CommitLogScan:
    """What one pass over every commitlog segment found."""

    segments: list[SegmentInfo]
    queues: dict[tuple[str, int], QueueStats] = field(default_factory=dict)
    damage: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    min_offset: int = 0
    max_offset: int = 0

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)


def scan_segment(mf: MappedFile, check_crc: bool, queues: dict[tuple[str, int], QueueStats],
                 progress: Progress | None = None) -> SegmentInfo:
    """`StoreReader`'s segment walk, counting queue offsets on the way (for stores without queues)."""

    def count(req: codec.DispatchRequest) -> None:
        if req is None or not is_dispatched(req.sys_flag):
            return
        key = (req.topic, req.queue_id)
        qs = queues.get(key)
        qo = req.consume_queue_offset
        if qs is None:
            queues[key] = QueueStats(qo, qo + 1)
        else:
            qs.count += 1
            if qo < qs.min_offset:
                qs.min_offset = qo
            if qo >= qs.max_offset:
                qs.max_offset = qo + 1

    info = reader_scan_segment(mf, check_crc, count, progress)
    return SegmentInfo(info.name, info.from_offset, mf.mapped_size, info.valid_end, info.records,
                       info.ends_with_blank, info.damage)


def scan_commit_log(reader: StoreReader, check_crc: bool = False,
                    progress: Progress | None = None) -> CommitLogScan:
    """Scan every segment: valid ends, records, BLANKs, damage (and CRCs with `check_crc`)."""
    files = list(reader.commit_log.mapped_files)
    scan = CommitLogScan([])
    for mf in files:
        scan.segments.append(scan_segment(mf, check_crc, scan.queues, progress))
    size = reader.file_size
    end = scan.min_offset = files[0].file_from_offset if files else 0
    ended = False
    for i, seg in enumerate(scan.segments):
        last = i == len(scan.segments) - 1
        if seg.damage:
            scan.damage.append(f"commitlog {seg.name}: {seg.damage} at offset {seg.valid_end}"
                               + ("" if last else "; the rest of it and later segments are unreachable"))
        elif not seg.ends_with_blank and not last:
            scan.damage.append(f"commitlog {seg.name}: records end at offset {seg.valid_end} without the "
                               "BLANK end-of-file record; later segments are unreachable")
        if seg.file_size < size:
            scan.notes.append(f"commitlog {seg.name} is {seg.file_size} bytes, shorter than the segment size "
                              f"{size}" + ("" if last else " (not the last file)"))
            if not last:
                scan.damage.append(f"commitlog {seg.name}: truncated to {seg.file_size} bytes")
        if not last:
            nxt = scan.segments[i + 1].from_offset
            if nxt != seg.from_offset + size:
                scan.damage.append(f"commitlog: segment {seg.name} is followed by {scan.segments[i + 1].name}, "
                                   f"expected {seg.from_offset + size:020d} (missing or misplaced files)")
        if not ended:
            end = seg.valid_end
            ended = not seg.ends_with_blank
    scan.max_offset = end
    return scan


def _present(path: str) -> bool:
    # Only stat: opening and closing the lock file would drop an fcntl lock this process holds on it.
    return os.path.exists(path)


def pid_running(pid: int) -> bool | None:
    """Whether process `pid` exists (None when that cannot be told)."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def inspect_lock_abort(root: str, ask_lock: bool = False) -> dict[str, Any]:
    """The `lock` and `abort` files: presence, sizes and abort's PID (and whether that process runs).

    With `ask_lock`, also the pid of the process holding the lock (`lock.heldBy`, `lock_holder`): that
    opens the lock file read-only (without locking) and closes it again, which would drop a POSIX lock
    this process took on it outside a `MessageStore`; without it the lock file is only stat'ed.
    """
    lock = os.path.join(root, "lock")
    abort = os.path.join(root, "abort")
    out: dict[str, Any] = {
        "lock": {"present": _present(lock), "size": os.path.getsize(lock) if _present(lock) else None},
        "abort": {"present": _present(abort), "pid": None, "running": None,
                  "bakPresent": _present(abort + ".bak")},
    }
    if out["abort"]["present"]:
        with open(abort, "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
        if text.isdigit():
            pid = int(text)
            out["abort"]["pid"] = pid
            out["abort"]["running"] = pid_running(pid)
    if ask_lock:
        out["lock"]["heldBy"] = lock_holder(root) if out["lock"]["present"] else None
    return out


def inspect_checkpoint(reader: StoreReader) -> dict[str, Any] | None:
    """The five checkpoint values (and the three timestamps as ISO local time)."""
    cp = reader.checkpoint()
    if cp is None:
        return None
    path = os.path.join(reader.root or "", "checkpoint")
    out: dict[str, Any] = {"path": path, "size": os.path.getsize(path)}
    try:
        for name, attr in zip(CHECKPOINT_FIELDS, _CHECKPOINT_ATTRS, strict=True):
            out[name] = int(getattr(cp, attr))
    finally:
        close = getattr(cp, "shutdown", None)
        if close is not None:
            close()
    for name in CHECKPOINT_FIELDS[:3]:
        out[name.replace("Timestamp", "Time")] = iso_local(out[name])
    return out


def inspect_topics_from_queues(reader: StoreReader) -> list[dict[str, Any]]:
    """Topics and queues from the consume queue files: min/max queue offsets and message counts."""
    out = []
    for topic in reader.topics():
        queues = []
        for qid in reader.queue_ids(topic):
            cq = reader.consume_queue(topic, qid)
            if cq is None:
                continue
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            queues.append({"queueId": qid, "minOffset": lo, "maxOffset": hi, "count": max(hi - lo, 0),
                           "files": len(cq.mapped_file_queue.mapped_files)})
        out.append({"topic": topic, "queues": queues})
    return out


def inspect_topics_from_scan(scan: CommitLogScan) -> list[dict[str, Any]]:
    """Topics and queues as the commitlog records give them (for a directory without consume queues)."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, qid), qs in sorted(scan.queues.items()):
        by_topic.setdefault(topic, []).append(
            {"queueId": qid, "minOffset": qs.min_offset, "maxOffset": qs.max_offset, "count": qs.count})
    return [{"topic": t, "queues": q} for t, q in by_topic.items()]


def inspect_index(reader: StoreReader, hash_slot_num: int | None = None, index_num: int | None = None,
                  hint: str = GEOMETRY_HINT) -> dict[str, Any] | None:
    """Index files: name, size and header (begin/end timestamp and phy offset, hashSlotCount, indexCount)."""
    path = reader.index_path
    if not path or not os.path.isdir(path):
        return None
    files = []
    for name in index_names(path):
        fp = os.path.join(path, name)
        with open(fp, "rb") as f:
            head = f.read(INDEX_HEADER_SIZE)
        size = os.path.getsize(fp)
        if len(head) < INDEX_HEADER_SIZE:
            head = head + bytes(INDEX_HEADER_SIZE - len(head))
        bt, et, bp, ep, hsc, ic = _INDEX_HEADER.unpack(head)
        files.append({"name": name, "size": size, "beginTimestamp": bt, "beginTime": iso_local(bt),
                      "endTimestamp": et, "endTime": iso_local(et), "beginPhyOffset": bp, "endPhyOffset": ep,
                      "hashSlotCount": hsc, "indexCount": ic, "entries": max(ic - 1, 0)})
    out: dict[str, Any] = {"path": path, "hashSlotNum": None, "indexNum": None, "geometry": None,
                           "files": files, "error": None}
    if files:
        given = hash_slot_num is not None or index_num is not None
        try:
            slots, num = infer_index_geometry(max(f["size"] for f in files), hash_slot_num, index_num, hint)
            out.update(hashSlotNum=slots, indexNum=num, geometry="given" if given else "inferred")
        except InspectionError as e:
            out["error"] = e.message
    return out


def _load_config(path: str) -> tuple[Any, str | None]:
    """(parsed document or None, error) for one config file, read leniently (main file, then `.bak`)."""
    try:
        text = read_config_file(path)
    except ConfigFileError as e:
        return None, str(e)
    except OSError as e:
        return None, describe_os_error(e)
    if text is None:
        return None, None
    try:
        return fastjson_loads(text), None
    except ConfigFileError as e:
        return None, str(e)


def inspect_config(root: str) -> dict[str, Any] | None:
    """The broker's config files: which exist, topic count of topics.json, groups in consumerOffset.json."""
    cdir = os.path.join(root, "config")
    if not os.path.isdir(cdir):
        return None
    out: dict[str, Any] = {"path": cdir, "files": {}}
    for name in (TOPICS_FILE, CONSUMER_OFFSET_FILE, SUBSCRIPTION_GROUP_FILE, DELAY_OFFSET_FILE):
        fp = os.path.join(cdir, name)
        info: dict[str, Any] = {"present": os.path.exists(fp), "bakPresent": os.path.exists(fp + ".bak")}
        if not info["present"] and not info["bakPresent"]:
            out["files"][name] = info
            continue
        doc, error = _load_config(fp)
        info["error"] = error
        if isinstance(doc, dict):
            if name == TOPICS_FILE:
                table_ = doc.get("topicConfigTable")
                info["topics"] = len(table_) if isinstance(table_, dict) else 0
            elif name == CONSUMER_OFFSET_FILE:
                offsets = doc.get("offsetTable")
                groups: dict[str, set[str]] = {}
                if isinstance(offsets, dict):
                    for key in offsets:
                        topic, sep, group = str(key).partition(TOPIC_GROUP_SEPARATOR)
                        if sep:
                            groups.setdefault(group, set()).add(topic)
                info["groups"] = {g: sorted(t) for g, t in sorted(groups.items())}
            elif name == SUBSCRIPTION_GROUP_FILE:
                table_ = doc.get("subscriptionGroupTable")
                info["groups"] = len(table_) if isinstance(table_, dict) else 0
            elif name == DELAY_OFFSET_FILE:
                offsets = doc.get("offsetTable")
                info["levels"] = len(offsets) if isinstance(offsets, dict) else 0
        out["files"][name] = info
    return out


def collect_inspection(reader: StoreReader, path: str | os.PathLike[str] | None = None, *,
                       check_crc: bool = False, progress: Progress | None = None,
                       hash_slot_num: int | None = None, index_num: int | None = None,
                       hint: str = GEOMETRY_HINT, ask_lock: bool = False) -> dict[str, Any]:
    """Everything `inspect` reports, as one JSON-ready dict (`ok` False when damage was found).

    `progress(n)` is told about the commitlog bytes scanned (`commit_log_bytes(reader)` in all);
    `hint` ends the index geometry error, telling how to give the geometry; `ask_lock` adds the pid
    holding the store's lock (see `inspect_lock_abort`).
    """
    scan = scan_commit_log(reader, check_crc, progress)
    root = reader.root
    shown = os.fspath(path) if path is not None else (root or reader.commit_log_path)
    report: dict[str, Any] = {"path": os.path.abspath(shown), "kind": "store" if root else "commitlog",
                              "root": root, "commitLogPath": reader.commit_log_path}
    if root:
        report.update(inspect_lock_abort(root, ask_lock))
    else:
        report.update(lock=None, abort=None)
    report["checkpoint"] = inspect_checkpoint(reader)
    report["commitlog"] = {
        "path": reader.commit_log_path, "fileSize": reader.file_size, "crcChecked": bool(check_crc),
        "minOffset": scan.min_offset, "maxOffset": scan.max_offset, "records": scan.records,
        "segments": [{"name": s.name, "fromOffset": s.from_offset, "size": s.file_size, "validEnd": s.valid_end,
                      "records": s.records, "endsWithBlank": s.ends_with_blank, "damage": s.damage or None}
                     for s in scan.segments],
    }
    cqp = reader.consume_queue_path
    if cqp and os.path.isdir(cqp):
        report["topicsSource"] = "consumequeue"
        report["topics"] = inspect_topics_from_queues(reader)
    else:
        report["topicsSource"] = "commitlog"
        report["topics"] = inspect_topics_from_scan(scan)
    report["index"] = inspect_index(reader, hash_slot_num, index_num, hint)
    report["config"] = inspect_config(root) if root else None
    notes = list(scan.notes)
    if report["index"] and report["index"]["error"]:
        notes.append(f"index: {report['index']['error']}")
    report["damage"] = scan.damage
    report["notes"] = notes
    report["ok"] = not scan.damage
    return report


# ---------------------------------------------------------------------------------------------------
# reading messages
# ---------------------------------------------------------------------------------------------------


def message_at(reader: StoreReader, offset: int, warn: Warn | None = None) -> MessageExt:
    """The message whose record starts at commitlog `offset`; `InspectionError` saying why when there is
    none. `warn` hears about a record that names another offset (a copied or relocated commitlog)."""
    mf = reader.commit_log.find_mapped_file_by_offset(offset)
    if mf is None:
        lo = reader.commit_log.get_min_offset()
        hi = reader.commit_log.get_max_offset()
        raise InspectionError(f"commitlog offset {offset} is outside the commitlog files [{max(lo, 0)}, {hi})")
    pos = offset - mf.file_from_offset
    if pos + 8 > mf.mapped_size or is_zero(mf.view, pos):
        raise InspectionError(f"no record starts at commitlog offset {offset} (never-written space)")
    try:
        msg = codec.decode_message(mf.view, pos, limit=mf.mapped_size)
    except codec.CorruptRecordError as e:
        raise InspectionError(f"no message starts at commitlog offset {offset}: {e.reason}") from None
    if msg.commit_log_offset != offset and warn is not None:
        warn(f"warning: the record at {offset} says its offset is {msg.commit_log_offset} "
             "(a copied or relocated commitlog?)")
    return msg


def offset_of_message_id(msg_id: str) -> int:
    """The commitlog offset an offsetMsgId names; `InspectionError` for anything else."""
    try:
        _host, _port, offset = codec.decode_message_id(msg_id)
    except codec.MessageIdError as e:
        raise InspectionError(f"{e} (an offsetMsgId: store address + port + commitlog offset)") from None
    return offset


def message_by_id(reader: StoreReader, msg_id: str, warn: Warn | None = None) -> MessageExt:
    """The message an offsetMsgId names (`InspectionError` when it names none)."""
    return message_at(reader, offset_of_message_id(msg_id), warn)


def iter_scan(reader: StoreReader, progress: Progress | None = None,
              warn: Warn | None = None) -> Iterator[tuple[int, codec.CheckResult]]:
    """`reader.iter_records()` telling `progress` the bytes passed; `warn` hears where damage stopped it."""
    last = reader.min_offset()
    for off, r in reader.iter_records():
        if not r.success:
            if warn is not None:
                warn(f"warning: scan stopped at commitlog offset {off}: {r.reason or 'unreadable record'}")
            return
        _advance(progress, off + r.size - last)
        last = off + r.size
        yield off, r


def _matches_key(msg: MessageExt, topic: str, key: str) -> bool:
    return msg.topic == topic and (msg.uniq_key == key or key in msg.keys_list())


def query_by_index(reader: StoreReader, idx: IndexService, topic: str, key: str, max_num: int, begin: int,
                   end: int) -> list[MessageExt]:
    """The newest `max_num` messages of `topic` with key `key` stored in [begin, end], via the index.

    The index holds hashes: every candidate is read back and kept only if its topic and key match.
    """
    candidates = idx.query_offset(topic, key, idx.max_msgs_num_batch, begin, end).phy_offsets
    found: dict[int, MessageExt] = {}
    for off in candidates:  # newest first
        if off in found:
            continue
        m = reader.look_message_by_offset(off)
        if m is not None and _matches_key(m, topic, key) and begin <= m.store_timestamp <= end:
            found[off] = m
            if len(found) >= max_num:
                break
    return [found[o] for o in sorted(found)]


def query_by_scan(reader: StoreReader, topic: str, key: str, max_num: int, begin: int, end: int,
                  progress: Progress | None = None, warn: Warn | None = None) -> list[MessageExt]:
    """The newest `max_num` messages of `topic` with key `key` stored in [begin, end], by a commitlog scan."""
    found: collections.deque[int] = collections.deque(maxlen=max_num)
    for off, r in iter_scan(reader, progress, warn):
        req = r.request
        if req is None or req.topic != topic or not begin <= req.store_timestamp <= end:
            continue
        if req.uniq_key == key or (req.keys and key in req.keys.split(codec.KEY_SEPARATOR)):
            found.append(off)
    out = []
    for off in found:
        m = reader.look_message_by_offset(off)
        if m is not None:
            out.append(m)
    return out


def query_messages(reader: StoreReader, topic: str, key: str, max_num: int = DEFAULT_QUERY_MAX,
                   begin: int | None = None, end: int | None = None, *, scan: bool = False,
                   hash_slot_num: int | None = None, index_num: int | None = None,
                   progress: Progress | None = None, warn: Warn | None = None,
                   hint: str = GEOMETRY_HINT) -> tuple[list[MessageExt], str]:
    """(messages, how): the newest `max_num` messages of `topic` with KEYS token or UNIQ_KEY `key`, in
    commitlog order, through the index ("index") when the store has one and `scan` is off, else by
    scanning the commitlog ("scan"; `progress` is told about the bytes scanned)."""
    if max_num <= 0:
        raise InspectionError("the maximum number of messages must be positive")
    begin = 0 if begin is None else begin
    end = MAX_TIMESTAMP if end is None else end
    idx = None if scan else open_index(reader, hash_slot_num, index_num, max(64, 4 * max_num), hint)
    try:
        if idx is not None:
            return query_by_index(reader, idx, topic, key, max_num, begin, end), "index"
        return query_by_scan(reader, topic, key, max_num, begin, end, progress, warn), "scan"
    finally:
        if idx is not None:
            idx.shutdown()


def dump_via_queues(reader: StoreReader, topic: str, queue_ids: list[int], from_offset: int = 0,
                    warn: Warn | None = None) -> Iterator[MessageExt]:
    """Messages of the given consume queues, merged in commitlog order (each queue from `from_offset`)."""
    missing = 0

    def one(qid: int) -> Iterator[tuple[int, int, MessageExt]]:
        nonlocal missing
        for _qo, m in reader.iter_queue(topic, qid, from_offset):
            if m is None:
                missing += 1
                continue
            yield m.commit_log_offset, qid, m

    for _off, _qid, m in heapq.merge(*(one(q) for q in queue_ids)):
        yield m
    if missing and warn is not None:
        warn(f"warning: {missing} consume queue entries point at commitlog data that is gone")


def dump_via_scan(reader: StoreReader, topic: str, queue_id: int | None = None, from_offset: int = 0,
                  progress: Progress | None = None, warn: Warn | None = None) -> Iterator[MessageExt]:
    """Messages of `topic` (and queue) found by scanning the commitlog, as the consume queues would hold
    them (transaction PREPARED and ROLLBACK records are skipped)."""
    for off, r in iter_scan(reader, progress, warn):
        req = r.request
        if req is None or req.topic != topic or not is_dispatched(req.sys_flag):
            continue
        if queue_id is not None and req.queue_id != queue_id:
            continue
        if req.consume_queue_offset < from_offset:
            continue
        m = reader.look_message_by_offset(off, r.size)
        if m is not None:
            yield m


def dump_messages(reader: StoreReader, topic: str, queue_id: int | None = None, from_offset: int = 0, *,
                  progress: Progress | None = None, warn: Warn | None = None
                  ) -> tuple[str, Iterator[MessageExt]]:
    """(how, messages): `topic`'s messages (only queue `queue_id` when given), from queue offset
    `from_offset` of each queue, through the consume queues ("consume queue") when the store has them,
    else by scanning the commitlog ("commitlog scan"; `progress` is told about the bytes scanned).
    The iterator is lazy: close it when stopping early."""
    queues = reader.queue_ids(topic)
    if queue_id is not None:
        queues = [q for q in queues if q == queue_id]
    if queues:
        return "consume queue", dump_via_queues(reader, topic, queues, from_offset, warn)
    return "commitlog scan", dump_via_scan(reader, topic, queue_id, from_offset, progress, warn)
