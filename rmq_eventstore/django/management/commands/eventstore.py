"""``manage.py eventstore verify | recover | rebuild | inspect | query | dump | serve``.

Operations on a store of ``RMQ_EVENTSTORE`` (``--store ALIAS``, default ``"default"``; its URL must be
``file:///...``: these commands work on the store's files) or on a directory given with ``--path``.
They call the library (``rmq_eventstore.store.repair``, ``rmq_eventstore.store.inspection`` and
``rmq_eventstore.broker.server.serve_in_thread``), the same functions as the ``rmq-eventstore`` command
line:

* ``verify [--json] [--no-queues] [--no-index]``: read-only check of every record's CRC, the consume
  queues and the index (safe beside a live broker). Damage is a ``CommandError`` (exit status 1).
* ``recover [--dry-run] [--json]``: take the store's lock and run recovery (truncate a damaged commitlog
  tail, cut consume queue and index entries past it, re-dispatch what they lack). ``--dry-run`` only
  verifies and tells what recovery would find. A store open in a live process is refused, naming its pid.
* ``rebuild [--json]``: take the lock, delete the consume queues and the index, rebuild them.
* ``inspect [--crc] [--json]``: the store's layout (lock/abort, checkpoint, segments, topics and queues,
  index and config files). Damage is a ``CommandError`` (exit status 1).
* ``query --topic T --key K`` (or ``--offset N`` / ``--id MSGID``) ``[--json]``: messages by key, through
  the index when there is one, else a commitlog scan; or one message by commitlog offset / offsetMsgId.
* ``dump --topic T [--queue Q] [--limit N] [--json]``: a topic's messages (``--json``: JSON lines).
* ``serve``: the broker and its name server on the store, in the foreground until SIGINT or SIGTERM
  (``OPTIONS["BROKER"]`` holds StoreConfig/BrokerConfig fields).

Verbosity: 0 prints nothing but ``--json`` documents (errors still raise), 1 a summary, 2 every item
(problem, segment, queue, message field). Progress bars (tqdm) go to stderr when verbosity >= 1 and stderr
is a terminal, or with ``--progress``; never to stdout. Exit status: 1 for damage, 2 for other errors.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ....broker.server import serve_in_thread
from ....common.message import MessageExt
from ....store import StoreLockedError, lock_holder
from ....store import inspection as insp
from ....store.inspection import InspectionError
from ....store.repair import commit_log_size, rebuild, recover, verify
from ...conf import DEFAULT_ALIAS, SETTING, store_settings

try:  # a declared dependency; the commands still work (without progress bars) if it is missing
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - exercised only without tqdm installed
    _tqdm = None

EXIT_DAMAGE = 1
EXIT_ERROR = 2
PROGRESS_STEP = 1 << 20  # update a bar at most once per MiB
BODY_MODES = ("text", "hex", "none")
GEOMETRY_HINT = "pass --index-slots and/or --index-num (the broker's maxHashSlotNum / maxIndexNum)"
SUBCOMMANDS = ("verify", "recover", "rebuild", "inspect", "query", "dump", "serve")


class _Progress:
    """A bytes-processed tqdm bar on stderr, created on the first update and fed in 1 MiB steps; a
    no-op when disabled. Called as `progress(n)` by the library functions."""

    def __init__(self, stream: Any, total: int, desc: str, enabled: bool) -> None:
        self._stream = stream
        self._total = total
        self._desc = desc
        self._enabled = enabled and _tqdm is not None and total > 0
        self._pending = 0
        self._bar: Any = None

    def __call__(self, n: int) -> None:
        if not self._enabled:
            return
        self._pending += n
        if self._pending >= PROGRESS_STEP:
            self._flush()

    def _flush(self) -> None:
        if self._bar is None:
            assert _tqdm is not None
            self._bar = _tqdm(total=self._total, desc=self._desc, unit="B", unit_scale=True, unit_divisor=1024,
                              file=self._stream, leave=False, dynamic_ncols=True, mininterval=0.25)
        self._bar.update(self._pending)
        self._pending = 0

    def close(self) -> None:
        if self._pending:
            self._flush()
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _positive(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class Command(BaseCommand):
    help = ("Operate a store of RMQ_EVENTSTORE: verify, recover, rebuild, inspect, query, dump, serve. "
            "Offline commands need a file:/// store (--store ALIAS) or a directory (--path).")
    # The settings checks would refuse to run with a broken RMQ_EVENTSTORE: exactly when --path is needed.
    requires_system_checks: list[str] = []

    # -- arguments -------------------------------------------------------------------------------------
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        common = argparse.ArgumentParser(add_help=False)
        where = common.add_mutually_exclusive_group()
        where.add_argument("--store", metavar="ALIAS", default=None,
                           help=f"store alias of {SETTING} (default {DEFAULT_ALIAS!r}); its URL must be file:///...")
        where.add_argument("--path", metavar="PATH", default=None,
                           help="a store directory, instead of a configured alias")
        common.add_argument("--commitlog-file-size", type=int, metavar="BYTES", default=None,
                            help="commitlog segment size (default: inferred from the files)")
        bar = common.add_mutually_exclusive_group()
        bar.add_argument("--progress", action="store_true", default=None,
                         help="progress bars on stderr even when it is not a terminal")
        bar.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                         help="no progress bars, even on a terminal")
        # Django's own options, accepted after the sub-command too (`eventstore verify -v 2`)
        common.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS,
                            help="0 silent, 1 summary, 2 every item, 3 also debug logs (serve)")
        common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                            help="raise on CommandError exceptions")
        common.add_argument("--no-color", action="store_true", default=argparse.SUPPRESS,
                            help="don't colorize the output")
        common.add_argument("--force-color", action="store_true", default=argparse.SUPPRESS,
                            help="force colorization of the output")

        sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)

        def add(name: str, help_: str, description: str = "") -> argparse.ArgumentParser:
            return sub.add_parser(name, help=help_, description=description or help_, parents=[common])

        p = add("verify", "check every record's CRC, the consume queues and the index (read-only)",
                "Read-only check of a store, safe beside a live writer; damage is an error (exit status 1).")
        p.add_argument("--json", action="store_true", help="the report as one JSON document")
        p.add_argument("--no-queues", action="store_true", help="skip the consume queue checks")
        p.add_argument("--no-index", action="store_true", help="skip the index checks")

        p = add("recover", "run store recovery now (takes the store's lock)",
                "Truncate a damaged commitlog tail, cut consume queue and index entries past it and re-dispatch "
                "what they lack. Takes the store's lock: a store open in a live process is refused.")
        p.add_argument("--dry-run", action="store_true",
                       help="change nothing: verify and tell what recovery would find")
        p.add_argument("--json", action="store_true", help="the report as one JSON document")

        p = add("rebuild", "drop and rebuild the consume queues and index from the commitlog (takes the lock)",
                "Delete consumequeue/ and index/ and rebuild them from the commitlog, under the store's lock.")
        p.add_argument("--json", action="store_true", help="the report as one JSON document")

        p = add("inspect", "store layout: checkpoint, segments, topics/queues, index and config files",
                "Read-only overview of a store; damage is an error (exit status 1).")
        p.add_argument("--crc", action="store_true", help="also check every record's body CRC")
        p.add_argument("--json", action="store_true", help="the report as one JSON document")
        self._index_options(p)

        p = add("query", "messages by key (index when present, else a scan), or one by offset or id")
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--key", help="a KEYS token or a UNIQ_KEY (client message id); needs --topic")
        which.add_argument("--offset", type=_positive, help="the commitlog offset where a message starts")
        which.add_argument("--id", help="an offsetMsgId (32 or 56 hex characters)")
        p.add_argument("--topic", help="topic of the messages (with --key)")
        p.add_argument("--max", type=int, default=insp.DEFAULT_QUERY_MAX,
                       help=f"at most N messages, the newest (default {insp.DEFAULT_QUERY_MAX})")
        p.add_argument("--begin", type=int, help="earliest store timestamp, epoch milliseconds")
        p.add_argument("--end", type=int, help="latest store timestamp, epoch milliseconds")
        p.add_argument("--scan", action="store_true", help="scan the commitlog even when there is an index")
        p.add_argument("--body", choices=BODY_MODES, default="text", help="body as UTF-8 text, hex, or not at all")
        p.add_argument("--json", action="store_true", help="the result as one JSON document")
        self._index_options(p)

        p = add("dump", "a topic's messages (consume queues when present, else a commitlog scan)")
        p.add_argument("--topic", required=True, help="topic to dump")
        p.add_argument("--queue", type=int, help="only this queue id")
        p.add_argument("--from-offset", type=_positive, default=0, help="first queue offset (per queue)")
        p.add_argument("--limit", type=_positive, help="at most N messages")
        p.add_argument("--body", choices=BODY_MODES, default="text", help="body as UTF-8 text, hex, or not at all")
        p.add_argument("--json", action="store_true", help="JSON lines, one message per line")

        p = add("serve", "run the broker and its name server on the store, until SIGINT or SIGTERM",
                "The broker (RocketMQ's remoting protocol) and its name server on the alias's store, in the "
                f"foreground. {SETTING}[alias]['OPTIONS']['BROKER'] holds StoreConfig/BrokerConfig fields.")
        p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
        p.add_argument("--namesrv-port", type=int, default=9876, help="name server port (default 9876; 0: any)")
        p.add_argument("--broker-port", type=int, default=10911, help="broker port (default 10911; 0: any)")
        p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default=None,
                       help="log level of the broker (default from verbosity: 0 WARNING, 1-2 INFO, 3 DEBUG)")

    @staticmethod
    def _index_options(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("index geometry (default: inferred from the file size, RocketMQ's 4:1 ratio)")
        g.add_argument("--index-slots", type=int, metavar="N", help="hash slots per index file (maxHashSlotNum)")
        g.add_argument("--index-num", type=int, metavar="N", help="entries per index file (maxIndexNum)")

    # -- dispatch --------------------------------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = int(options.get("verbosity", 1))
        self.options = options
        name = options["subcommand"]
        getattr(self, f"handle_{name}")(options)

    # -- helpers ---------------------------------------------------------------------------------------
    def store_path(self, options: dict[str, Any], what: str) -> str:
        """The directory the sub-command works on: `--path`, else the `file:///` URL of `--store`."""
        if options.get("path"):
            return os.path.abspath(options["path"])
        alias = options.get("store") or DEFAULT_ALIAS
        try:
            s = store_settings(alias)
        except ImproperlyConfigured as e:
            raise CommandError(f"{e}; or give --path PATH", returncode=EXIT_ERROR) from None
        if s.kind != "file" or not s.path:
            raise CommandError(
                f"{SETTING}[{alias!r}] has URL {s.url!r}, a name server: `eventstore {what}` works on a "
                "store's files, so it needs a local store (file:///path/to/store); run it where the store "
                "is, with --path PATH", returncode=EXIT_ERROR)
        return s.path

    def existing_store(self, options: dict[str, Any], what: str) -> str:
        path = self.store_path(options, what)
        if not os.path.exists(path):
            raise CommandError(f"{path}: no such file or directory (no store there yet)", returncode=EXIT_ERROR)
        if not os.path.isdir(path):
            raise CommandError(f"{path}: not a directory (give a store root)", returncode=EXIT_ERROR)
        return path

    def progress(self, total: int, desc: str) -> _Progress:
        wanted = self.options.get("progress")
        if wanted is None:
            wanted = self.verbosity >= 1 and self.stderr.isatty()
        return _Progress(getattr(self.stderr, "_out", sys.stderr), total, desc, bool(wanted))

    def say(self, text: str, style: Callable[[str], str] | None = None, level: int = 1) -> None:
        """A line on stdout at verbosity >= `level`."""
        if self.verbosity >= level:
            self.stdout.write(style(text) if style else text)

    def warn(self, text: str) -> None:
        """A warning on stderr (verbosity >= 1)."""
        if self.verbosity >= 1:
            self.stderr.write(text, style_func=self.style.WARNING)

    def emit_json(self, doc: Any) -> None:
        self.stdout.write(json.dumps(doc, ensure_ascii=False), style_func=lambda s: s)

    def pairs(self, items: Iterable[tuple[str, Any]], level: int = 2, indent: str = "  ") -> None:
        items = list(items)
        width = max((len(k) for k, _ in items), default=0)
        for k, v in items:
            self.say(f"{indent}{k.ljust(width)}  {'-' if v is None else v}".rstrip(), level=level)

    def open_reader(self, path: str) -> Any:
        try:
            return insp.open_reader(path, self.options.get("commitlog_file_size"))
        except InspectionError as e:
            raise CommandError(e.message, returncode=EXIT_ERROR) from None

    @staticmethod
    def index_geometry(options: dict[str, Any]) -> tuple[int | None, int | None]:
        slots, num = options.get("index_slots"), options.get("index_num")
        if (slots is not None and slots <= 0) or (num is not None and num <= 0):
            raise CommandError("--index-slots and --index-num must be positive", returncode=EXIT_ERROR)
        return slots, num

    # -- verify ----------------------------------------------------------------------------------------
    def handle_verify(self, options: dict[str, Any]) -> None:
        path = self.existing_store(options, "verify")
        try:
            with self.progress(commit_log_size(path), "verify") as bar:
                report = verify(path, bar, check_queues=not options["no_queues"],
                                check_index=not options["no_index"],
                                commit_log_file_size=options.get("commitlog_file_size"))
        except FileNotFoundError as e:
            raise CommandError(f"{path}: not a store: {e}", returncode=EXIT_ERROR) from None
        if options["json"]:
            self.emit_json(report.as_dict())
        else:
            counts = (f"commitlog {report.commit_log_min}..{report.commit_log_end} ({report.records} records, "
                      f"CRC checked), {report.queues} consume queues ({report.units} units), "
                      f"{report.index_files} index files ({report.index_entries} entries)")
            if report.ok:
                self.say(f"store {path}: OK", self.style.SUCCESS)
                self.say(f"  {counts}")
            else:
                self.say(f"store {path}: {report.problem_count} problem(s)", self.style.ERROR)
                self.say(f"  {counts}")
                for p in report.problems:
                    where = f"{p.where} at offset {p.offset}" if p.offset >= 0 else p.where
                    self.say(f"  {p.kind}: {where}: {p.detail}", self.style.ERROR, level=2)
                if report.problem_count > len(report.problems):
                    self.say(f"  ... and {report.problem_count - len(report.problems)} more", level=2)
                if self.verbosity == 1:
                    self.say("  (-v 2 lists every problem)")
        if not report.ok:
            first = report.problems[0] if report.problems else None
            example = ""
            if first is not None:
                at = f" at offset {first.offset}" if first.offset >= 0 else ""
                example = f"; first: {first.kind} in {first.where}{at}: {first.detail}"
            raise CommandError(f"store {path} is damaged: {report.problem_count} problem(s){example}; "
                               "`eventstore recover` truncates a damaged commitlog tail, `eventstore rebuild` "
                               "rebuilds the consume queues and index", returncode=EXIT_DAMAGE)

    # -- recover / rebuild -----------------------------------------------------------------------------
    def refuse_locked(self, path: str, action: str, pid: int | None) -> CommandError:
        who = f"pid {pid}" if pid is not None else "another process"
        if pid is not None and pid == os.getpid():
            who = f"this process (pid {pid})"
        return CommandError(
            f"store {path} is in use: its lock file is held by {who}; refusing to {action} a store open in "
            "a live process. Stop that process (a broker: SIGTERM) and run it again; `eventstore verify` is "
            "read-only and runs beside it", returncode=EXIT_ERROR)

    def handle_recover(self, options: dict[str, Any]) -> None:
        if options["dry_run"]:
            return self.recover_dry_run(options)
        return self.repair(options, "recover")

    def handle_rebuild(self, options: dict[str, Any]) -> None:
        return self.repair(options, "rebuild")

    def repair(self, options: dict[str, Any], action: str) -> None:
        path = self.existing_store(options, action)
        fn = recover if action == "recover" else rebuild
        config: dict[str, Any] = {}
        if options.get("commitlog_file_size"):
            config["mapped_file_size_commit_log"] = options["commitlog_file_size"]
        try:
            with self.progress(commit_log_size(path), action) as bar:
                report = fn(path, bar, **config)
        except StoreLockedError as e:
            raise self.refuse_locked(path, action, e.pid if e.pid is not None else lock_holder(path)) from None
        except FileNotFoundError as e:
            raise CommandError(f"{path}: {e}", returncode=EXIT_ERROR) from None
        if options["json"]:
            self.emit_json(report.as_dict())
            return
        r = report.recovery
        damage = f"{r.get('damage')} at {r.get('damage_offset')}" if r.get("damage") else "none"
        self.say(f"store {path}: {action} done in {r.get('seconds', 0):.3f} s ({r.get('mode')}): commitlog end "
                 f"{r.get('commit_log_end')}, {r.get('truncated_bytes') or 0} bytes truncated, "
                 f"{r.get('records_dispatched') or 0} records re-dispatched; damage: {damage}", self.style.SUCCESS)
        self.pairs([
            ("commitlog end", r.get("commit_log_end")),
            ("scanned", f"{r.get('bytes_scanned')} bytes from {r.get('scan_start')}"),
            ("damage", damage),
            ("truncated", f"{r.get('truncated_bytes')} bytes, {r.get('commit_log_files_deleted')} files"),
            ("re-dispatched", f"{r.get('records_dispatched')} records from {r.get('dispatch_start')}"),
            ("consume queues", f"{report.queues} ({report.units} units; {r.get('cq_units_dropped')} units cut, "
                               f"rebuilt: {', '.join(r.get('cqs_rebuilt') or []) or 'none'})"),
            ("index", f"{report.index_entries} entries ({r.get('index_entries_dropped')} cut, "
                      f"{r.get('index_files_dropped')} files dropped)"),
            ("abort file", "removed" if report.abort_cleared else "unchanged"),
        ])

    def recover_dry_run(self, options: dict[str, Any]) -> None:
        """What recovery would meet, read-only: `verify` plus the lock and abort files."""
        path = self.existing_store(options, "recover")
        try:
            with self.progress(commit_log_size(path), "recover --dry-run") as bar:
                report = verify(path, bar, commit_log_file_size=options.get("commitlog_file_size"))
        except FileNotFoundError as e:
            raise CommandError(f"{path}: not a store: {e}", returncode=EXIT_ERROR) from None
        holder = lock_holder(path)
        crashed = os.path.exists(os.path.join(path, "abort"))
        log_damage = [p for p in report.problems if p.kind.startswith("commitlog")]
        first = min((p.offset for p in log_damage if p.offset >= 0), default=None)
        plan = {
            "path": path, "dryRun": True, "lockHeldBy": holder, "refused": holder is not None,
            "mode": "abnormal" if crashed else "normal", "firstCommitLogDamage": first,
            "commitLogProblems": len(log_damage), "derivedProblems": len(report.problems) - len(log_damage),
            "problems": report.problem_count, "verify": report.as_dict(),
        }
        if options["json"]:
            self.emit_json(plan)
            return
        if holder is not None:
            self.warn(f"recover would be refused: the lock file is held by pid {holder}")
        mode = ("abnormal: the abort file says the last stop was a crash; recovery scans the last commitlog "
                "files with CRCs" if crashed else
                "normal: a clean shutdown; recovery checks the commitlog tail past the checkpoint")
        if report.ok:
            self.say(f"store {path}: no damage found; recover would have nothing to repair", self.style.SUCCESS)
        else:
            at = f" (the first at offset {first})" if first is not None else ""
            self.say(f"store {path}: {report.problem_count} problem(s): {len(log_damage)} in the commitlog{at}, "
                     f"{plan['derivedProblems']} in consume queues or the index", self.style.WARNING)
            if log_damage:
                self.say("  recover cuts the commitlog at the first damaged record of the tail it scans and "
                         "re-dispatches what the queues and index lack; damage before that stays (verify "
                         "keeps reporting it)")
            if plan["derivedProblems"]:
                self.say("  recover cuts consume queue and index entries past the commitlog end; "
                         "`eventstore rebuild` rebuilds them all from the commitlog")
            for p in report.problems:
                where = f"{p.where} at offset {p.offset}" if p.offset >= 0 else p.where
                self.say(f"  {p.kind}: {where}: {p.detail}", self.style.WARNING, level=2)
        self.pairs([("recovery mode", mode), ("commitlog end", report.commit_log_end),
                    ("lock", f"held by pid {holder}" if holder is not None else "free")])

    # -- inspect ---------------------------------------------------------------------------------------
    def handle_inspect(self, options: dict[str, Any]) -> None:
        path = self.existing_store(options, "inspect")
        slots, num = self.index_geometry(options)
        with self.open_reader(path) as reader:
            desc = "inspect (CRC)" if options["crc"] else "inspect"
            with self.progress(insp.commit_log_bytes(reader), desc) as bar:
                report = insp.collect_inspection(reader, path, check_crc=options["crc"], progress=bar,
                                                 hash_slot_num=slots, index_num=num, hint=GEOMETRY_HINT,
                                                 ask_lock=True)
        if options["json"]:
            self.emit_json(report)
        else:
            self.render_inspection(report)
        if not report["ok"]:
            raise CommandError(f"store {report['path']} is damaged: {len(report['damage'])} problem(s); first: "
                               f"{report['damage'][0]}", returncode=EXIT_DAMAGE)

    def render_inspection(self, r: dict[str, Any]) -> None:
        cl = r["commitlog"]
        topics = r["topics"]
        n_queues = sum(len(t["queues"]) for t in topics)
        n_msgs = sum(q["count"] for t in topics for q in t["queues"])
        self.say(f"store {r['path']} ({'store root' if r['kind'] == 'store' else 'bare commitlog directory'})",
                 self.style.MIGRATE_HEADING)
        if r["lock"] is not None:
            held = r["lock"].get("heldBy")
            abort = r["abort"]
            state = f"open (lock held by pid {held})" if held is not None else "not open"
            if abort["present"] and held is None:
                state += ", but the abort file says it was not shut down cleanly (recover, or just reopen it)"
            self.say(f"  state      {state}", self.style.WARNING if abort["present"] and held is None else None)
        self.say(f"  commitlog  {len(cl['segments'])} segment(s) of {cl['fileSize']} bytes, offsets "
                 f"{cl['minOffset']}..{cl['maxOffset']}, {cl['records']} records"
                 f"{', CRC checked' if cl['crcChecked'] else ''}")
        for s in cl["segments"]:
            self.say(f"    {s['name']}  valid end {s['validEnd']}  {s['records']} records"
                     f"{'  BLANK' if s['endsWithBlank'] else ''}{'  DAMAGE: ' + s['damage'] if s['damage'] else ''}",
                     self.style.ERROR if s["damage"] else None, level=2)
        src = "consume queues" if r["topicsSource"] == "consumequeue" else "commitlog records"
        self.say(f"  topics     {len(topics)} topic(s), {n_queues} queue(s), {n_msgs} message(s) (from {src})")
        for t in topics:
            for q in t["queues"]:
                self.say(f"    {t['topic']}/{q['queueId']}  offsets {q['minOffset']}..{q['maxOffset']}  "
                         f"{q['count']} message(s)", level=2)
        cp = r["checkpoint"]
        if cp is not None:
            self.say(f"  checkpoint physic {cp['physicMsgTime'] or '-'}, logics {cp['logicsMsgTime'] or '-'}, "
                     f"index {cp['indexMsgTime'] or '-'}", level=2)
        idx = r["index"]
        if idx is None:
            self.say("  index      none")
        else:
            geo = (f" ({idx['hashSlotNum']} slots, {idx['indexNum']} entries per file, {idx['geometry']})"
                   if idx["hashSlotNum"] is not None else "")
            entries = sum(f["entries"] for f in idx["files"])
            self.say(f"  index      {len(idx['files'])} file(s), {entries} entries{geo}")
            for f in idx["files"]:
                self.say(f"    {f['name']}  {f['beginTime'] or '-'} .. {f['endTime'] or '-'}  "
                         f"{f['entries']} entries", level=2)
        cfg = r["config"]
        if cfg is not None:
            for name, info in cfg["files"].items():
                if not info["present"] and not info["bakPresent"]:
                    text = "absent"
                elif info.get("error"):
                    text = f"unreadable: {info['error']}"
                else:
                    text = "present" if info["present"] else "only the .bak copy"
                    for k in ("topics", "levels"):
                        if k in info:
                            text += f", {info[k]} {'delay levels' if k == 'levels' else k}"
                    if "groups" in info:
                        g = info["groups"]
                        text += f", {len(g) if isinstance(g, dict) else g} groups"
                self.say(f"  config     {name}: {text}", level=2)
        for note in r["notes"]:
            self.say(f"  note: {note}", self.style.WARNING)
        if r["damage"]:
            self.say(f"damage: {len(r['damage'])} problem(s)", self.style.ERROR)
            for d in r["damage"]:
                self.say(f"  {d}", self.style.ERROR)
        else:
            self.say("damage: none found" + (" (CRCs checked)" if cl["crcChecked"] else ""), self.style.SUCCESS)

    # -- query -----------------------------------------------------------------------------------------
    def message_line(self, m: MessageExt) -> str:
        return (f"{m.commit_log_offset}  {m.topic}/{m.queue_id}@{m.queue_offset}  {m.msg_id}  "
                f"{insp.iso_local(m.store_timestamp) or m.store_timestamp}  tags={m.tags or '-'}  "
                f"keys={m.keys or '-'}  uniqKey={m.uniq_key or '-'}")

    def message_details(self, m: MessageExt, body: str) -> None:
        d = m.to_dict(body=body)
        props = d.pop("properties") or {}
        self.pairs([(k, v) for k, v in d.items()] + [(f"property {k}", v) for k, v in props.items()],
                   level=2, indent="    ")

    def handle_query(self, options: dict[str, Any]) -> None:
        path = self.existing_store(options, "query")
        if options["key"] is not None and not options["topic"]:
            raise CommandError("query --key needs --topic", returncode=EXIT_ERROR)
        if options["max"] <= 0:
            raise CommandError("--max must be positive", returncode=EXIT_ERROR)
        slots, num = self.index_geometry(options)
        body = options["body"]
        with self.open_reader(path) as reader:
            try:
                if options["key"] is not None:
                    with self.progress(insp.commit_log_bytes(reader), "query (scan)") as bar:
                        msgs, how = insp.query_messages(
                            reader, options["topic"], options["key"], options["max"], options["begin"],
                            options["end"], scan=options["scan"], hash_slot_num=slots, index_num=num,
                            progress=bar, warn=self.warn, hint=GEOMETRY_HINT)
                elif options["id"] is not None:
                    msgs, how = [insp.message_by_id(reader, options["id"], self.warn)], "id"
                else:
                    msgs, how = [insp.message_at(reader, options["offset"], self.warn)], "offset"
            except InspectionError as e:
                extra = " (or query with --scan)" if options["key"] is not None else ""
                if options["id"] is not None:
                    extra = (" (a client message id / UNIQ_KEY is not an offsetMsgId: query --topic T "
                             "--key ID)")
                raise CommandError(f"{e.message}{extra}", returncode=EXIT_ERROR) from None
            if options["json"]:
                doc: dict[str, Any] = {"how": how, "count": len(msgs),
                                       "messages": [m.to_dict(body=body) for m in msgs]}
                if options["key"] is not None:
                    doc = {"topic": options["topic"], "key": options["key"], **doc}
                self.emit_json(doc)
                return
            if options["key"] is not None:
                via = {"index": "the index", "scan": "a commitlog scan"}[how]
                self.say(f"{len(msgs)} message(s) of topic {options['topic']} with key {options['key']!r}, "
                         f"found via {via}", self.style.SUCCESS if msgs else self.style.WARNING)
            for m in msgs:
                self.say(self.message_line(m))
                self.message_details(m, body)

    # -- dump ------------------------------------------------------------------------------------------
    def handle_dump(self, options: dict[str, Any]) -> None:
        path = self.existing_store(options, "dump")
        body, limit, as_json = options["body"], options["limit"], options["json"]
        topic, queue = options["topic"], options["queue"]
        n = 0
        with self.open_reader(path) as reader:
            with self.progress(insp.commit_log_bytes(reader), "dump (scan)") as bar:
                how, msgs = insp.dump_messages(reader, topic, queue, options["from_offset"], progress=bar,
                                               warn=self.warn)
                try:
                    for m in msgs:
                        if limit is not None and n >= limit:
                            break
                        if as_json:
                            self.emit_json(m.to_dict(body=body))
                        else:
                            self.say(self.message_line(m))
                            self.message_details(m, body)
                        n += 1
                finally:
                    close = getattr(msgs, "close", None)
                    if close is not None:
                        close()
        where = topic if queue is None else f"{topic} queue {queue}"
        summary = f"dump: {n} message(s) of {where} via {how}"
        if self.verbosity >= 1:
            if as_json:  # stdout holds only the JSON lines
                self.stderr.write(summary, style_func=lambda s: s)
            else:
                self.say(summary, self.style.SUCCESS)

    # -- serve -----------------------------------------------------------------------------------------
    def handle_serve(self, options: dict[str, Any]) -> None:
        path = self.store_path(options, "serve")
        level = options["log_level"] or {0: "WARNING", 1: "INFO", 2: "INFO"}.get(self.verbosity, "DEBUG")
        root = logging.getLogger()
        if not root.handlers:  # the project's LOGGING wins when it configures the root logger
            logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("rmq_eventstore").setLevel(level)
        config: dict[str, Any] = {}
        if not options.get("path"):
            config.update(store_settings(options.get("store") or DEFAULT_ALIAS).options.get("BROKER") or {})
        if options.get("commitlog_file_size"):
            config["mapped_file_size_commit_log"] = options["commitlog_file_size"]
        host = options["host"]
        if not config.get("acl_enable") and not _is_loopback(host):
            self.warn(f"listening on {host} beyond loopback WITHOUT access control: anyone who reaches it can "
                      "read and write every topic; set acl_enable/acl_file in OPTIONS['BROKER'] or listen on "
                      "127.0.0.1")
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            try:
                running = serve_in_thread(path, host, options["namesrv_port"], options["broker_port"], **config)
            except StoreLockedError as e:
                raise self.refuse_locked(path, "serve", e.pid) from None
            except OSError as e:
                raise CommandError(f"cannot listen on {host}: {e.strerror or e}", returncode=EXIT_ERROR) from None
            except TypeError as e:  # an unknown field in OPTIONS['BROKER']
                raise CommandError(f"{SETTING} OPTIONS['BROKER']: {e}", returncode=EXIT_ERROR) from None
            with running:
                self.say(f"broker {running.broker_address} serving {path}; name server {running.namesrv_address}",
                         self.style.SUCCESS)
                self.stdout.flush()
                while not stop.wait(0.5):
                    pass
                self.say("shutting down")
                self.stdout.flush()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
