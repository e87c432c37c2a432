"""`rmq-eventstore inspect | query | msg | dump`: read-only tools for store directories (ours or Apache
RocketMQ's), through `StoreReader`, which maps files read-only: they never write to, lock or truncate the
store, so they are safe beside a live broker.

* `inspect PATH [--json] [--crc]`: lock/abort files, checkpoint, commitlog segments (valid end, records,
  BLANK, damage), topics and queues, index files, config files. Exits 1 on damage.
* `query PATH --topic T --key K`: messages by key (KEYS token or UNIQ_KEY), through the index when the
  store has one, else by scanning the commitlog.
* `msg PATH (--id MSGID | --offset N)`: one message by offsetMsgId or commitlog offset, every field.
* `dump PATH --topic T [--queue Q]`: JSON lines, one message per line, through the consume queues when
  present, else by scanning the commitlog.

`PATH` is a store root (with `commitlog/`) or a bare directory of commitlog segment files.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..common import codec
from ..common.message import MessageExt
from ..store.config_files import (
    CONSUMER_OFFSET_FILE,
    DELAY_OFFSET_FILE,
    SUBSCRIPTION_GROUP_FILE,
    TOPIC_GROUP_SEPARATOR,
    TOPICS_FILE,
    ConfigFileError,
    fastjson_loads,
    read_config_file,
)
from ..store.index import HASH_SLOT_SIZE, INDEX_HEADER_SIZE, INDEX_SIZE, IndexService
from ..store.mapped_file import MappedFile
from ..store.reader import SegmentInfo, StoreReader
from ..store.reader import is_zero as _is_zero
from ..store.reader import scan_segment as reader_scan_segment
from .output import (
    EXIT_DAMAGE,
    EXIT_OK,
    CliError,
    Command,
    Progress,
    describe_os_error,
    is_dispatched,
    iso_local,
    key_values,
    notice,
    progress_enabled,
    stdout,
    sys_flag_names,
    table,
    with_time,
)

try:  # a declared dependency; the tool still works (without progress bars) if it is missing
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - exercised only without tqdm installed
    _tqdm = None

BODY_MODES = ("text", "hex", "none")
DEFAULT_QUERY_MAX = 32  # DefaultMessageStore's defaultQueryMaxNum
MAX_TIMESTAMP = 2**62
INDEX_ENTRIES_PER_SLOT = 4  # RocketMQ's default geometry: maxIndexNum = 4 * maxHashSlotNum
_INDEX_NAME_RE = re.compile(r"^\d{17}$")
_INDEX_HEADER = struct.Struct(">qqqqii")
_CHECKPOINT_FIELDS = ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp", "masterFlushedOffset",
                      "confirmPhyOffset")
_CHECKPOINT_ATTRS = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
                     "master_flushed_offset", "confirm_phy_offset")


# ---------------------------------------------------------------------------------------------------
# opening a store
# ---------------------------------------------------------------------------------------------------


def open_reader(args: argparse.Namespace) -> StoreReader:
    """A `StoreReader` on `args.path`, with clear errors for a missing path or a directory that is no store."""
    path = args.path
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a directory (give a store root or a commitlog directory)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise CliError(f"{path}: permission denied")
    try:
        return StoreReader(path, commit_log_file_size=getattr(args, "commitlog_file_size", None))
    except FileNotFoundError as e:
        if e.filename:
            raise CliError(describe_os_error(e)) from None
        raise CliError(f"{path}: not a store: {e}") from None


def index_names(index_path: str | None) -> list[str]:
    """Names of the index files (17-digit `yyyyMMddHHmmssSSS`) in `index_path`, oldest first."""
    if not index_path or not os.path.isdir(index_path):
        return []
    return sorted(n for n in os.listdir(index_path)
                  if _INDEX_NAME_RE.match(n) and os.path.isfile(os.path.join(index_path, n)))


def infer_index_geometry(file_size: int, hash_slot_num: int | None = None,
                         index_num: int | None = None) -> tuple[int, int]:
    """(hashSlotNum, indexNum) of an index file of `file_size` bytes (`40 + 4·slots + 20·entries`).

    With neither given, RocketMQ's 4:1 entries:slots ratio is assumed (`size = 40 + 84·slots`); with one
    given the other follows from the size. Raises `CliError` when the size does not fit.
    """
    body = file_size - INDEX_HEADER_SIZE
    hint = "pass --index-slots and/or --index-num (the broker's maxHashSlotNum / maxIndexNum)"
    if (hash_slot_num is not None and hash_slot_num <= 0) or (index_num is not None and index_num <= 0):
        raise CliError("--index-slots and --index-num must be positive")
    if hash_slot_num is not None and index_num is not None:
        if INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE < file_size:
            raise CliError(f"index files of {file_size} bytes are larger than {hash_slot_num} slots and "
                           f"{index_num} entries allow")
        return hash_slot_num, index_num
    if hash_slot_num is not None:
        rest = body - hash_slot_num * HASH_SLOT_SIZE
        if rest <= 0 or rest % INDEX_SIZE:
            raise CliError(f"index files of {file_size} bytes do not fit {hash_slot_num} hash slots; {hint}")
        return hash_slot_num, rest // INDEX_SIZE
    if index_num is not None:
        rest = body - index_num * INDEX_SIZE
        if rest <= 0 or rest % HASH_SLOT_SIZE:
            raise CliError(f"index files of {file_size} bytes do not fit {index_num} entries; {hint}")
        return rest // HASH_SLOT_SIZE, index_num
    per_slot = HASH_SLOT_SIZE + INDEX_ENTRIES_PER_SLOT * INDEX_SIZE
    if body <= 0 or body % per_slot:
        raise CliError(f"cannot infer the geometry of index files of {file_size} bytes "
                       f"(not 40 + 84 x slots, RocketMQ's 4:1 ratio); {hint}")
    slots = body // per_slot
    return slots, slots * INDEX_ENTRIES_PER_SLOT


def open_index(reader: StoreReader, args: argparse.Namespace, max_batch: int = 64) -> IndexService | None:
    """A read-only `IndexService` on the store's index files, geometry inferred from their size (or given);
    None when the store has no index files."""
    names = index_names(reader.index_path)
    if not names:
        return None
    assert reader.index_path is not None
    size = max(os.path.getsize(os.path.join(reader.index_path, n)) for n in names)
    slots, num = infer_index_geometry(size, getattr(args, "index_slots", None), getattr(args, "index_num", None))
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


def scan_segment(mf: MappedFile, check_crc: bool, progress: Progress,
                 queues: dict[tuple[str, int], QueueStats]) -> SegmentInfo:
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

    info = reader_scan_segment(mf, check_crc, count, progress.advance)
    return SegmentInfo(info.name, info.from_offset, mf.mapped_size, info.valid_end, info.records,
                       info.ends_with_blank, info.damage)


def scan_commit_log(reader: StoreReader, check_crc: bool, progress_enabled: bool) -> CommitLogScan:
    """Scan every segment: valid ends, records, BLANKs, damage (and CRCs with `check_crc`)."""
    files = list(reader.commit_log.mapped_files)
    scan = CommitLogScan([])
    total = sum(mf.mapped_size for mf in files)
    desc = "inspect (CRC)" if check_crc else "inspect"
    with Progress(total, desc, progress_enabled) as progress:
        for mf in files:
            scan.segments.append(scan_segment(mf, check_crc, progress, scan.queues))
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


def inspect_lock_abort(root: str) -> dict[str, Any]:
    """The `lock` and `abort` files: presence, sizes and abort's PID (and whether that process runs)."""
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
            out["abort"]["running"] = _pid_running(pid)
    return out


def _pid_running(pid: int) -> bool | None:
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


def inspect_checkpoint(reader: StoreReader) -> dict[str, Any] | None:
    """The five checkpoint values (and the three timestamps as ISO local time)."""
    cp = reader.checkpoint()
    if cp is None:
        return None
    path = os.path.join(reader.root or "", "checkpoint")
    out: dict[str, Any] = {"path": path, "size": os.path.getsize(path)}
    try:
        for name, attr in zip(_CHECKPOINT_FIELDS, _CHECKPOINT_ATTRS, strict=True):
            out[name] = int(getattr(cp, attr))
    finally:
        close = getattr(cp, "shutdown", None)
        if close is not None:
            close()
    for name in _CHECKPOINT_FIELDS[:3]:
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


def inspect_index(reader: StoreReader, args: argparse.Namespace) -> dict[str, Any] | None:
    """Index files: name, size and header (begin/end timestamp and phy offset, hashSlotCount, indexCount)."""
    path = reader.index_path
    if not path or not os.path.isdir(path):
        return None
    names = index_names(path)
    files = []
    for name in names:
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
        given = getattr(args, "index_slots", None) is not None or getattr(args, "index_num", None) is not None
        try:
            slots, num = infer_index_geometry(max(f["size"] for f in files), getattr(args, "index_slots", None),
                                              getattr(args, "index_num", None))
            out.update(hashSlotNum=slots, indexNum=num, geometry="given" if given else "inferred")
        except CliError as e:
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


def collect_inspection(reader: StoreReader, args: argparse.Namespace) -> dict[str, Any]:
    """Everything `inspect` reports, as one JSON-ready dict."""
    scan = scan_commit_log(reader, args.crc, progress_enabled(args))
    root = reader.root
    report: dict[str, Any] = {"path": os.path.abspath(args.path), "kind": "store" if root else "commitlog",
                              "root": root, "commitLogPath": reader.commit_log_path}
    if root:
        report.update(inspect_lock_abort(root))
    else:
        report.update(lock=None, abort=None)
    report["checkpoint"] = inspect_checkpoint(reader)
    report["commitlog"] = {
        "path": reader.commit_log_path, "fileSize": reader.file_size, "crcChecked": bool(args.crc),
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
    report["index"] = inspect_index(reader, args)
    report["config"] = inspect_config(root) if root else None
    notes = list(scan.notes)
    if report["index"] and report["index"]["error"]:
        notes.append(f"index: {report['index']['error']}")
    report["damage"] = scan.damage
    report["notes"] = notes
    report["ok"] = not scan.damage
    return report


def render_inspection(r: dict[str, Any]) -> list[str]:
    """The human-readable form of `collect_inspection`'s report."""
    lines = [f"Store       {r['path']}  ({'store root' if r['kind'] == 'store' else 'bare commitlog directory'})"]
    if r["lock"] is not None:
        lock, abort = r["lock"], r["abort"]
        abort_text = "absent (clean shutdown or never started)"
        if abort["present"]:
            abort_text = "present"
            if abort["pid"] is not None:
                state = {True: "running", False: "not running", None: "unknown"}[abort["running"]]
                abort_text += f", pid {abort['pid']} ({state})"
            abort_text += ": the store is open or was not shut down cleanly"
        lines += key_values([("lock", "present" if lock["present"] else "absent"), ("abort", abort_text)])
    cp = r["checkpoint"]
    lines.append("")
    if cp is None:
        lines.append("Checkpoint  none")
    else:
        lines.append(f"Checkpoint  {cp['path']}")
        lines += key_values([(n, with_time(cp[n]) if "Timestamp" in n else cp[n]) for n in _CHECKPOINT_FIELDS])
    cl = r["commitlog"]
    lines.append("")
    lines.append(f"Commitlog   {cl['path']}  ({len(cl['segments'])} segments of {cl['fileSize']} bytes"
                 f"{', CRC checked' if cl['crcChecked'] else ''})")
    if cl["segments"]:
        lines += table(["SEGMENT", "SIZE", "VALID END", "RECORDS", "BLANK", "DAMAGE"],
                       [[s["name"], s["size"], s["validEnd"], s["records"], "yes" if s["endsWithBlank"] else "no",
                         s["damage"]] for s in cl["segments"]])
    lines.append(f"  min offset {cl['minOffset']}, max offset {cl['maxOffset']}, {cl['records']} records")
    lines.append("")
    src = "consume queues" if r["topicsSource"] == "consumequeue" else "commitlog records"
    n_queues = sum(len(t["queues"]) for t in r["topics"])
    lines.append(f"Topics      {len(r['topics'])} topics, {n_queues} queues (from {src})")
    rows = [[t["topic"], q["queueId"], q["minOffset"], q["maxOffset"], q["count"]]
            for t in r["topics"] for q in t["queues"]]
    if rows:
        lines += table(["TOPIC", "QUEUE", "MIN OFFSET", "MAX OFFSET", "COUNT"], rows)
    idx = r["index"]
    lines.append("")
    if idx is None:
        lines.append("Index       none")
    else:
        geo = ""
        if idx["hashSlotNum"] is not None:
            geo = f"  ({idx['hashSlotNum']} slots, {idx['indexNum']} entries per file, {idx['geometry']})"
        lines.append(f"Index       {idx['path']}  {len(idx['files'])} file(s){geo}")
        if idx["files"]:
            lines += table(["FILE", "BEGIN TIME", "END TIME", "BEGIN PHY", "END PHY", "SLOTS USED", "INDEX COUNT"],
                           [[f["name"], f["beginTime"], f["endTime"], f["beginPhyOffset"], f["endPhyOffset"],
                             f["hashSlotCount"], f["indexCount"]] for f in idx["files"]])
    cfg = r["config"]
    if r["kind"] == "store":
        lines.append("")
        if cfg is None:
            lines.append("Config      none")
        else:
            lines.append(f"Config      {cfg['path']}")
            pairs: list[tuple[str, object]] = []
            for name, info in cfg["files"].items():
                if not info["present"] and not info["bakPresent"]:
                    pairs.append((name, "absent"))
                    continue
                if info.get("error"):
                    pairs.append((name, f"unreadable: {info['error']}"))
                    continue
                text = "present" if info["present"] else "only the .bak copy"
                if "topics" in info:
                    text += f", {info['topics']} topics"
                if isinstance(info.get("groups"), dict):
                    groups = info["groups"]
                    text += f", {len(groups)} groups" + (f" ({', '.join(groups)})" if groups else "")
                elif "groups" in info:
                    text += f", {info['groups']} groups"
                if "levels" in info:
                    text += f", {info['levels']} delay levels"
                pairs.append((name, text))
            lines += key_values(pairs)
    lines.append("")
    for note in r["notes"]:
        lines.append(f"Note: {note}")
    if r["damage"]:
        lines.append(f"Damage: {len(r['damage'])} problem(s)")
        lines += [f"  {d}" for d in r["damage"]]
    else:
        lines.append("Damage: none found" + (" (CRCs checked)" if cl["crcChecked"] else ""))
    return lines


def run_inspect(args: argparse.Namespace) -> int:
    with open_reader(args) as reader:
        report = collect_inspection(reader, args)
    out = stdout()
    if args.json:
        out.write(json.dumps(report, ensure_ascii=False) + "\n")
    else:
        out.write("\n".join(render_inspection(report)) + "\n")
    out.flush()
    return EXIT_OK if report["ok"] else EXIT_DAMAGE


def configure_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--crc", action="store_true", help="also check every record's body CRC")
    _add_index_options(p)


# ---------------------------------------------------------------------------------------------------
# reading messages
# ---------------------------------------------------------------------------------------------------


def message_at(reader: StoreReader, offset: int) -> MessageExt:
    """The message whose record starts at commitlog `offset`; `CliError` saying why when there is none."""
    mf = reader.commit_log.find_mapped_file_by_offset(offset)
    if mf is None:
        lo = reader.commit_log.get_min_offset()
        hi = reader.commit_log.get_max_offset()
        raise CliError(f"commitlog offset {offset} is outside the commitlog files [{max(lo, 0)}, {hi})")
    pos = offset - mf.file_from_offset
    if pos + 8 > mf.mapped_size or _is_zero(mf.view, pos):
        raise CliError(f"no record starts at commitlog offset {offset} (never-written space)")
    try:
        msg = codec.decode_message(mf.view, pos, limit=mf.mapped_size)
    except codec.CorruptRecordError as e:
        raise CliError(f"no message starts at commitlog offset {offset}: {e.reason}") from None
    if msg.commit_log_offset != offset:
        notice(f"warning: the record at {offset} says its offset is {msg.commit_log_offset} "
              "(a copied or relocated commitlog?)")
    return msg


def iter_scan(reader: StoreReader, progress_enabled: bool, desc: str) -> Iterator[tuple[int, codec.CheckResult]]:
    """`reader.iter_records()` with a progress bar; reports on stderr where damage stopped the scan."""
    files = reader.commit_log.mapped_files
    total = sum(mf.mapped_size for mf in files)
    last = reader.min_offset()
    with Progress(total, desc, progress_enabled) as progress:
        for off, r in reader.iter_records():
            if not r.success:
                notice(f"warning: scan stopped at commitlog offset {off}: {r.reason or 'unreadable record'}")
                return
            progress.advance(off + r.size - last)
            last = off + r.size
            yield off, r


def _body_mode(args: argparse.Namespace) -> str:
    return getattr(args, "body", "text") or "text"


def _json_line(msg: MessageExt, body: str) -> str:
    return json.dumps(msg.to_dict(body=body), ensure_ascii=False)


def render_message(msg: MessageExt, body: str) -> list[str]:
    """Every field of a message as aligned `name  value` lines (properties one per line)."""
    flags = sys_flag_names(msg.sys_flag)
    pairs: list[tuple[str, object]] = [
        ("msgId", msg.msg_id), ("uniqKey", msg.uniq_key), ("topic", msg.topic), ("queueId", msg.queue_id),
        ("queueOffset", msg.queue_offset), ("commitLogOffset", msg.commit_log_offset),
        ("storeSize", msg.store_size), ("version", msg.version), ("bodyCRC", msg.body_crc), ("flag", msg.flag),
        ("sysFlag", f"{msg.sys_flag}" + (f" ({' | '.join(flags)})" if flags else "")),
        ("bornTimestamp", with_time(msg.born_timestamp)), ("bornHost", msg.born_host),
        ("storeTimestamp", with_time(msg.store_timestamp)), ("storeHost", msg.store_host),
        ("reconsumeTimes", msg.reconsume_times), ("preparedTransactionOffset", msg.prepared_transaction_offset),
        ("tags", msg.tags), ("tagsCode", msg.tags_code), ("keys", msg.keys),
        ("properties", f"{len(msg.properties)}" if msg.properties else None),
    ]
    pairs += [(f"  {k}", v) for k, v in msg.properties.items()]
    pairs.append(("bodyLength", len(msg.body)))
    if body == "text":
        pairs.append(("body", bytes(msg.body).decode("utf-8", "replace")))
    elif body == "hex":
        pairs.append(("bodyHex", bytes(msg.body).hex()))
    return key_values(pairs, indent="")


def run_msg(args: argparse.Namespace) -> int:
    offset = args.offset
    if args.id is not None:
        try:
            _host, _port, offset = codec.decode_message_id(args.id)
        except codec.MessageIdError as e:
            raise CliError(f"{e} (an offsetMsgId: store address + port + commitlog offset)") from None
    with open_reader(args) as reader:
        try:
            msg = message_at(reader, offset)
        except CliError as e:
            if args.id is not None:
                e.message += (f" (from id {args.id}; a client message id / UNIQ_KEY is not an offsetMsgId: "
                              "use `query --topic T --key ID`)")
            raise
        out = stdout()
        if args.json:
            out.write(_json_line(msg, args.body) + "\n")
        else:
            out.write("\n".join(render_message(msg, args.body)) + "\n")
        out.flush()
    return EXIT_OK


def _offset_arg(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"offset must be >= 0: {text!r}")
    return value


def configure_msg(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", help="offsetMsgId (32 or 56 hex characters)")
    which.add_argument("--offset", type=_offset_arg, help="commitlog offset where the record starts")
    p.add_argument("--json", action="store_true", help="print the message as one JSON object")
    p.add_argument("--body", choices=BODY_MODES, default="text", help="body as UTF-8 text, hex, or not at all")


# -- query ------------------------------------------------------------------------------------------


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
                  progress_enabled: bool) -> list[MessageExt]:
    """The newest `max_num` messages of `topic` with key `key` stored in [begin, end], by a commitlog scan."""
    found: collections.deque[int] = collections.deque(maxlen=max_num)
    for off, r in iter_scan(reader, progress_enabled, "query (scan)"):
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


def run_query(args: argparse.Namespace) -> int:
    if args.max <= 0:
        raise CliError("--max must be positive")
    begin = args.begin if args.begin is not None else 0
    end = args.end if args.end is not None else MAX_TIMESTAMP
    with open_reader(args) as reader:
        try:
            idx = None if args.scan else open_index(reader, args, max_batch=max(64, 4 * args.max))
        except CliError as e:
            raise CliError(f"{e.message} (or query with --scan)") from None
        try:
            if idx is not None:
                msgs = query_by_index(reader, idx, args.topic, args.key, args.max, begin, end)
                how = "index"
            else:
                msgs = query_by_scan(reader, args.topic, args.key, args.max, begin, end, progress_enabled(args))
                how = "scan"
        finally:
            if idx is not None:
                idx.shutdown()
        out = stdout()
        if args.json:
            doc = {"topic": args.topic, "key": args.key, "how": how, "count": len(msgs),
                   "messages": [m.to_dict(body=args.body) for m in msgs]}
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
        else:
            via = "the index" if how == "index" else "a commitlog scan (no index files)"
            if args.scan:
                via = "a commitlog scan (--scan)"
            lines = [f"{len(msgs)} message(s) of topic {args.topic} with key {args.key!r}, found via {via}"]
            if msgs:
                rows = [[m.msg_id, m.queue_id, m.queue_offset, m.commit_log_offset, iso_local(m.store_timestamp),
                         m.tags, m.keys, m.uniq_key] for m in msgs]
                lines += table(["MSG ID", "QUEUE", "QUEUE OFFSET", "COMMITLOG OFFSET", "STORE TIME", "TAGS",
                                "KEYS", "UNIQ KEY"], rows)
                if args.body != "none":
                    for m in msgs:
                        body = (bytes(m.body).decode("utf-8", "replace") if args.body == "text"
                                else bytes(m.body).hex())
                        lines.append(f"  {m.msg_id}  {body}")
            out.write("\n".join(lines) + "\n")
        out.flush()
    return EXIT_OK


def configure_query(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="topic of the messages")
    p.add_argument("--key", required=True, help="a KEYS token or a UNIQ_KEY (client message id)")
    p.add_argument("--max", type=int, default=DEFAULT_QUERY_MAX,
                   help=f"at most N messages, the newest (default {DEFAULT_QUERY_MAX})")
    p.add_argument("--begin", type=int, help="earliest store timestamp, epoch milliseconds")
    p.add_argument("--end", type=int, help="latest store timestamp, epoch milliseconds")
    p.add_argument("--scan", action="store_true", help="scan the commitlog even when there is an index")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--body", choices=BODY_MODES, default="text", help="body as UTF-8 text, hex, or not at all")
    _add_index_options(p)


# -- dump -------------------------------------------------------------------------------------------


def dump_via_queues(reader: StoreReader, topic: str, queue_ids: list[int], from_offset: int) -> Iterator[MessageExt]:
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
    if missing:
        notice(f"warning: {missing} consume queue entries point at commitlog data that is gone")


def dump_via_scan(reader: StoreReader, topic: str, queue_id: int | None, from_offset: int,
                  progress_enabled: bool) -> Iterator[MessageExt]:
    """Messages of `topic` (and queue) found by scanning the commitlog, as the consume queues would hold
    them (transaction PREPARED and ROLLBACK records are skipped)."""
    for off, r in iter_scan(reader, progress_enabled, "dump (scan)"):
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


def run_dump(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be >= 0")
    with open_reader(args) as reader:
        queues = reader.queue_ids(args.topic)
        if args.queue is not None:
            queues = [q for q in queues if q == args.queue]
        if queues:
            how = "consume queue"
            msgs = dump_via_queues(reader, args.topic, queues, args.from_offset)
        else:
            how = "commitlog scan"
            msgs = dump_via_scan(reader, args.topic, args.queue, args.from_offset, progress_enabled(args))
        out = stdout()
        n = 0
        for m in msgs:
            if args.limit is not None and n >= args.limit:
                break
            out.write(_json_line(m, args.body) + "\n")
            n += 1
        out.flush()
        if hasattr(msgs, "close"):
            msgs.close()
    where = args.topic if args.queue is None else f"{args.topic} queue {args.queue}"
    notice(f"dump: {n} message(s) of {where} via {how}")
    return EXIT_OK


def configure_dump(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="topic to dump")
    p.add_argument("--queue", type=int, help="only this queue id")
    p.add_argument("--from-offset", type=int, default=0, help="first queue offset (per queue), default 0")
    p.add_argument("--limit", type=int, help="at most N messages")
    p.add_argument("--body", choices=BODY_MODES, default="text", help="body as UTF-8 text, hex, or not at all")


def _add_index_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("index geometry (default: inferred from the file size, RocketMQ's 4:1 ratio)")
    g.add_argument("--index-slots", type=int, metavar="N", help="hash slots per index file (maxHashSlotNum)")
    g.add_argument("--index-num", type=int, metavar="N", help="entries per index file (maxIndexNum)")


COMMANDS: list[Command] = [
    Command("inspect", "store layout: checkpoint, segments, topics/queues, index and config files",
            configure_inspect, run_inspect, "Read-only overview of a store; exit code 1 when damage is found."),
    Command("query", "messages by key (index when present, else a commitlog scan)", configure_query, run_query),
    Command("msg", "one message by offsetMsgId or commitlog offset", configure_msg, run_msg),
    Command("dump", "a topic's messages as JSON lines (consume queue when present, else a scan)",
            configure_dump, run_dump),
]
