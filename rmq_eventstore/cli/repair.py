"""`rmq-eventstore verify | recover | rebuild`: the store's repair tools (`store/repair.py`) on the command line.

* `verify PATH [--json]`: read-only; CRC and structure of every record, consume queue units and index
  entries against the commitlog. Exit 0 when clean, 1 on damage (each problem listed with its offset).
* `recover PATH [--json]`: take the store's lock and run recovery; report what was truncated and rebuilt.
* `rebuild PATH [--json]`: take the lock, delete the consume queues and index, rebuild them from the log.

Errors (no store, a store open in another process) print one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os

from ..store.message_store import StoreLockedError
from ..store.repair import commit_log_size, rebuild, recover, verify
from .output import (
    EXIT_DAMAGE,
    EXIT_OK,
    CliError,
    Command,
    Progress,
    key_values,
    progress_enabled,
    stdout,
    table,
)


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a directory (give a store root)")


def run_verify(args: argparse.Namespace) -> int:
    _check_path(args.path)
    try:
        with Progress(commit_log_size(args.path), "verify", progress_enabled(args)) as bar:
            report = verify(args.path, bar.advance, check_queues=not args.no_queues,
                            check_index=not args.no_index, commit_log_file_size=args.commitlog_file_size)
    except FileNotFoundError as e:
        raise CliError(f"{args.path}: not a store: {e}") from None
    out = stdout()
    if args.json:
        json.dump(report.as_dict(), out, indent=2)
        out.write("\n")
    else:
        lines = [f"store {report.path}: {'OK' if report.ok else f'{report.problem_count} problem(s)'}"]
        lines += key_values([
            ("commitlog", f"{report.commit_log_min}..{report.commit_log_end} ({report.records} records, "
                          f"CRC checked)"),
            ("consume queues", f"{report.queues} ({report.units} units)"),
            ("index", f"{report.index_files} files ({report.index_entries} entries)"),
        ])
        if report.problems:
            lines.append("problems:")
            lines += table(("kind", "where", "offset", "detail"),
                           [(p.kind, p.where, p.offset if p.offset >= 0 else "-", p.detail)
                            for p in report.problems])
            if report.problem_count > len(report.problems):
                lines.append(f"  ... and {report.problem_count - len(report.problems)} more")
        out.write("\n".join(lines) + "\n")
    return EXIT_OK if report.ok else EXIT_DAMAGE


def configure_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--no-queues", action="store_true", help="skip the consume queue checks")
    p.add_argument("--no-index", action="store_true", help="skip the index checks")


def _run_repair(args: argparse.Namespace, action: str) -> int:
    _check_path(args.path)
    fn = recover if action == "recover" else rebuild
    config = {}
    if args.commitlog_file_size:
        config["mapped_file_size_commit_log"] = args.commitlog_file_size
    try:
        with Progress(commit_log_size(args.path), action, progress_enabled(args)) as bar:
            report = fn(args.path, bar.advance, **config)
    except StoreLockedError as e:
        raise CliError(str(e)) from None
    except FileNotFoundError as e:
        raise CliError(f"{args.path}: {e}") from None
    out = stdout()
    if args.json:
        json.dump(report.as_dict(), out, indent=2)
        out.write("\n")
        return EXIT_OK
    r = report.recovery
    lines = [f"store {report.path}: {action} done in {r.get('seconds', 0):.3f} s ({r.get('mode')})"]
    lines += key_values([
        ("commitlog end", r.get("commit_log_end")),
        ("scanned", f"{r.get('bytes_scanned')} bytes from {r.get('scan_start')}"),
        ("damage", f"{r.get('damage')} at {r.get('damage_offset')}" if r.get("damage") else "none"),
        ("truncated", f"{r.get('truncated_bytes')} bytes, {r.get('commit_log_files_deleted')} files"),
        ("re-dispatched", f"{r.get('records_dispatched')} records from {r.get('dispatch_start')}"),
        ("consume queues", f"{report.queues} ({report.units} units; {r.get('cq_units_dropped')} units cut, "
                           f"rebuilt: {', '.join(r.get('cqs_rebuilt') or []) or 'none'})"),
        ("index", f"{report.index_entries} entries ({r.get('index_entries_dropped')} cut, "
                  f"{r.get('index_files_dropped')} files dropped)"),
    ])
    out.write("\n".join(lines) + "\n")
    return EXIT_OK


def configure_repair(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="the report as JSON")


COMMANDS: list[Command] = [
    Command("verify", "check every record's CRC, the consume queues and the index (read-only)",
            configure_verify, run_verify,
            "Read-only check of a store (safe beside a live writer); exit code 1 when damage is found."),
    Command("recover", "run store recovery now", configure_repair, lambda a: _run_repair(a, "recover"),
            "Truncate a damaged commitlog tail, cut consume queue and index entries past it and re-dispatch "
            "what they lack.", writes=True),
    Command("rebuild", "drop and rebuild the consume queues and index from the commitlog", configure_repair,
            lambda a: _run_repair(a, "rebuild"),
            "Delete consumequeue/ and index/ and rebuild them from the commitlog.", writes=True),
]
