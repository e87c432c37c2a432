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
import json
from collections.abc import Iterator
from typing import Any

from ..common.message import MessageExt
from ..store import inspection
from ..store.index import IndexService
from ..store.inspection import DEFAULT_QUERY_MAX, InspectionError
from ..store.reader import StoreReader
from .output import (
    EXIT_DAMAGE,
    EXIT_OK,
    CliError,
    Command,
    Progress,
    iso_local,
    key_values,
    notice,
    progress_enabled,
    stdout,
    sys_flag_names,
    table,
    with_time,
)

BODY_MODES = ("text", "hex", "none")
MAX_TIMESTAMP = inspection.MAX_TIMESTAMP
GEOMETRY_HINT = "pass --index-slots and/or --index-num (the broker's maxHashSlotNum / maxIndexNum)"
_CHECKPOINT_FIELDS = inspection.CHECKPOINT_FIELDS

# The inspection logic lives in the library (`rmq_eventstore.store.inspection`); this module parses the
# arguments, draws progress bars and renders the results.


def _warn(message: str) -> None:
    notice(message)


# ---------------------------------------------------------------------------------------------------
# opening a store
# ---------------------------------------------------------------------------------------------------


def open_reader(args: argparse.Namespace) -> StoreReader:
    """A `StoreReader` on `args.path`, with clear errors for a missing path or a directory that is no store."""
    try:
        return inspection.open_reader(args.path, getattr(args, "commitlog_file_size", None))
    except InspectionError as e:
        raise CliError(e.message) from None


def _message(text: str) -> str:
    """A library message in the command line's words (the options that give an index geometry)."""
    if text == inspection.GEOMETRY_NOT_POSITIVE:
        return "--index-slots and --index-num must be positive"
    return text


def infer_index_geometry(file_size: int, hash_slot_num: int | None = None,
                         index_num: int | None = None) -> tuple[int, int]:
    """(hashSlotNum, indexNum) of an index file of `file_size` bytes (`inspection.infer_index_geometry`);
    `CliError` naming the options that give the geometry when the size does not fit."""
    try:
        return inspection.infer_index_geometry(file_size, hash_slot_num, index_num, GEOMETRY_HINT)
    except InspectionError as e:
        raise CliError(_message(e.message)) from None


def open_index(reader: StoreReader, args: argparse.Namespace, max_batch: int = 64) -> IndexService | None:
    """A read-only `IndexService` on the store's index files, geometry inferred from their size (or given);
    None when the store has no index files."""
    try:
        return inspection.open_index(reader, getattr(args, "index_slots", None), getattr(args, "index_num", None),
                                     max_batch, GEOMETRY_HINT)
    except InspectionError as e:
        raise CliError(_message(e.message)) from None


# ---------------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------------


def collect_inspection(reader: StoreReader, args: argparse.Namespace) -> dict[str, Any]:
    """Everything `inspect` reports, as one JSON-ready dict (`inspection.collect_inspection`), with a
    progress bar on a terminal."""
    desc = "inspect (CRC)" if args.crc else "inspect"
    with Progress(inspection.commit_log_bytes(reader), desc, progress_enabled(args)) as bar:
        report = inspection.collect_inspection(
            reader, args.path, check_crc=args.crc, progress=bar.advance,
            hash_slot_num=getattr(args, "index_slots", None), index_num=getattr(args, "index_num", None),
            hint=GEOMETRY_HINT)
    idx = report["index"]
    if idx and idx["error"]:
        idx["error"] = _message(idx["error"])
        report["notes"] = [f"index: {_message(n.removeprefix('index: '))}" if n.startswith("index: ") else n
                           for n in report["notes"]]
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
    try:
        return inspection.message_at(reader, offset, _warn)
    except InspectionError as e:
        raise CliError(e.message) from None


def iter_scan(reader: StoreReader, progress_enabled: bool, desc: str) -> Iterator[tuple[int, Any]]:
    """`reader.iter_records()` with a progress bar; reports on stderr where damage stopped the scan."""
    with Progress(inspection.commit_log_bytes(reader), desc, progress_enabled) as bar:
        yield from inspection.iter_scan(reader, bar.advance, _warn)


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
            offset = inspection.offset_of_message_id(args.id)
        except InspectionError as e:
            raise CliError(e.message) from None
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


def run_query(args: argparse.Namespace) -> int:
    if args.max <= 0:
        raise CliError("--max must be positive")
    with open_reader(args) as reader:
        with Progress(inspection.commit_log_bytes(reader), "query (scan)", progress_enabled(args)) as bar:
            try:
                msgs, how = inspection.query_messages(
                    reader, args.topic, args.key, args.max, args.begin, args.end, scan=args.scan,
                    hash_slot_num=args.index_slots, index_num=args.index_num, progress=bar.advance, warn=_warn,
                    hint=GEOMETRY_HINT)
            except InspectionError as e:
                raise CliError(f"{_message(e.message)} (or query with --scan)") from None
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


def run_dump(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be >= 0")
    with open_reader(args) as reader:
        with Progress(inspection.commit_log_bytes(reader), "dump (scan)", progress_enabled(args)) as bar:
            how, msgs = inspection.dump_messages(reader, args.topic, args.queue, args.from_offset,
                                                 progress=bar.advance, warn=_warn)
            out = stdout()
            n = 0
            try:
                for m in msgs:
                    if args.limit is not None and n >= args.limit:
                        break
                    out.write(_json_line(m, args.body) + "\n")
                    n += 1
                out.flush()
            finally:
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
