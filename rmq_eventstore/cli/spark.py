"""`rmq-eventstore spark export|project|verify ...`: the Spark pipeline jobs from the command line.

Listed in `rmq_eventstore.cli.app.COMMANDS`; pyspark is imported only when a `spark` action runs, so `rmq-eventstore --help` and the other commands stay light.
"""

from __future__ import annotations

import argparse
import json
import sys

from .output import EXIT_DAMAGE, EXIT_ERROR, EXIT_OK, CliError, Command


def _source_options(args: argparse.Namespace) -> dict[str, str]:
    opts: dict[str, str] = {}
    if getattr(args, "topic", None):
        opts["topics"] = ",".join(args.topic)
    if getattr(args, "queue_id", None):
        opts["queueIds"] = ",".join(str(q) for q in args.queue_id)
    for name, key in (("start_time", "startTime"), ("end_time", "endTime"),
                      ("commitlog_file_size", "commitLogFileSize")):
        v = getattr(args, name, None)
        if v is not None:
            opts[key] = str(v)
    if getattr(args, "crc", False):
        opts["verifyCrc"] = "true"
    return opts


def _add_common(p: argparse.ArgumentParser, filters: bool = True) -> None:
    p.add_argument("path", metavar="PATH", help="store root, or a directory of commitlog segment files")
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    p.add_argument("--commitlog-file-size", type=int, metavar="BYTES", help="segment size (default: inferred)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if filters:
        p.add_argument("--topic", action="append", metavar="TOPIC", help="only this topic (repeatable)")
        p.add_argument("--queue-id", action="append", type=int, metavar="Q", help="only this queue id (repeatable)")
        p.add_argument("--start-time", metavar="T", help="store time >= T (epoch ms or ISO-8601, UTC)")
        p.add_argument("--end-time", metavar="T", help="store time < T (epoch ms or ISO-8601, UTC)")
        p.add_argument("--crc", action="store_true", help="check every BODYCRC while reading (fail on mismatch)")


def configure_spark(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="messages to Parquet, partitioned by topic and UTC day")
    _add_common(e)
    e.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (the topic/day partitions written are replaced, others kept)")
    j = sub.add_parser("project", help="fold events per (topic, key) into a read model via SQLAlchemy")
    _add_common(j)
    j.add_argument("--url", default="sqlite:///read_model.db",
                   help="SQLAlchemy URL (default sqlite:///read_model.db; e.g. postgresql+psycopg://u@h/db)")
    j.add_argument("--table", default="rmq_projection", help="table name (default rmq_projection)")
    v = sub.add_parser("verify", help="CRC-check every segment in parallel and report damaged offsets")
    _add_common(v, filters=False)
    v.add_argument("--no-crc", action="store_true", help="structure checks only, no BODYCRC")
    v.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run_spark(args: argparse.Namespace) -> int:
    from ..spark.source import SourceError

    try:
        from ..spark.session import local_session

        spark = local_session(master=args.master, app_name=f"rmq-eventstore-{args.action}")
    except ImportError as e:
        raise CliError(f"the spark commands need the 'spark' extra (pip install rmq-eventstore[spark]): {e}") \
            from None
    progress = not args.no_progress and sys.stderr.isatty()
    try:
        if args.action == "export":
            from ..spark.jobs import export_parquet

            n = export_parquet(spark, args.path, args.out, _source_options(args))
            print(f"exported to {args.out} (partitioned by topic, day): {n} messages in the directory")
            return EXIT_OK
        if args.action == "project":
            from ..spark.jobs import project

            n = project(spark, args.path, args.url, args.table, _source_options(args), progress=progress)
            print(f"projected {n} (topic, key) rows into {args.table}")
            return EXIT_OK
        from ..spark.jobs import damaged_offsets, verify

        reports = verify(spark, args.path, check_crc=not args.no_crc,
                         commit_log_file_size=args.commitlog_file_size, progress=progress)
        bad = damaged_offsets(reports)
        if args.json:
            print(json.dumps({"segments": reports, "damaged_offsets": bad, "ok": not bad}, indent=2))
        else:
            for r in reports:
                state = "BLANK end" if r["ends_with_blank"] else "open"
                print(f"{r['segment']}  records={r['records']}  valid_end={r['valid_end']}  {state}"
                      f"  damaged={len(r['damaged'])}")
                for d in r["damaged"]:
                    print(f"  damaged at offset {d['offset']}: {d['reason']}")
            print(f"{len(reports)} segments, {sum(r['records'] for r in reports)} records, "
                  f"{len(bad)} damaged offset(s)")
        return EXIT_DAMAGE if bad else EXIT_OK
    except (SourceError, FileNotFoundError) as e:
        raise CliError(str(e), EXIT_ERROR) from None


COMMANDS: list[Command] = [
    Command("spark", "Spark jobs: export to Parquet, project into SQL, verify segments in parallel",
            configure_spark, run_spark, takes_path=False,
            description="Spark pipeline jobs over a store directory (read-only). Needs the 'spark' extra."),
]
