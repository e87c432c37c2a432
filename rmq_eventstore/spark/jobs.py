"""Pipeline jobs on the `rocketmq` source: export to Parquet, a per-key projection, a parallel verify.

* `export`: every message (optionally filtered) to Parquet partitioned by `topic` and `day` (the UTC
  date of the store time), so a data lake can prune by both; the partitions written are replaced.
* `project`: folds the events of each (topic, key) into one read-model row (see `PROJECTION_COLUMNS`)
  and upserts it through SQLAlchemy (SQLite by default, PostgreSQL or anything else by URL). A key is
  each space-separated token of a message's KEYS property; messages without keys are not projected.
  "Last" means last in commitlog order. Re-running is idempotent (rows are replaced by key).
* `verify`: one Spark task per commitlog segment walks every record with RocketMQ's checks (magic,
  sizes, computed length, BODYCRC), re-synchronises after damage to find more, and reports each damaged
  offset: what `checkMessageAndReturnSize` recovery would stop at, in parallel.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from datetime import UTC
from typing import Any

from ..common import codec
from . import decode
from .source import _Mapped, commit_log_dir, list_segments

PROJECTION_COLUMNS = (
    "topic", "key", "event_count", "first_store_time", "last_store_time", "last_tags", "last_body",
    "last_msg_id", "last_commit_log_offset",
)


def read_store(spark: Any, path: str, options: dict[str, str] | None = None) -> Any:
    """The store's messages as a DataFrame (the `rocketmq` format with `options`)."""
    reader = spark.read.format("rocketmq")
    for k, v in (options or {}).items():
        if v is not None:
            reader = reader.option(k, str(v))
    return reader.load(os.fspath(path))


# -- export -------------------------------------------------------------------------------------------
def export_parquet(spark: Any, path: str, out: str, options: dict[str, str] | None = None,
                   mode: str = "overwrite") -> int:
    """Write the messages to Parquet under `out`, partitioned by topic and UTC day; returns the row count
    of the whole output directory.

    Overwrites dynamically: the (topic, day) partitions this export writes are replaced, other
    partitions already under `out` are kept, so exports of single topics or time ranges add up.
    """
    from pyspark.sql import functions as F

    df = read_store(spark, path, options).withColumn(
        "day", F.to_date(F.from_utc_timestamp(F.col("store_timestamp"), "UTC")))
    df.write.mode(mode).option("partitionOverwriteMode", "dynamic").partitionBy("topic", "day").parquet(out)
    return spark.read.parquet(out).count()


# -- projection ---------------------------------------------------------------------------------------
def projection_frame(spark: Any, path: str, options: dict[str, str] | None = None) -> Any:
    """The read model as a DataFrame: one row per (topic, key), columns `PROJECTION_COLUMNS`."""
    from pyspark.sql import functions as F

    df = read_store(spark, path, options).where(F.col("keys").isNotNull())
    keyed = df.select("topic", F.explode(F.split(F.col("keys"), " ")).alias("key"), "store_timestamp",
                      "tags", "body", "msg_id", "commit_log_offset").where(F.col("key") != "")
    off = F.col("commit_log_offset")
    return keyed.groupBy("topic", "key").agg(
        F.count(F.lit(1)).alias("event_count"),
        F.min("store_timestamp").alias("first_store_time"),
        F.max("store_timestamp").alias("last_store_time"),
        F.max_by("tags", off).alias("last_tags"),
        F.max_by("body", off).alias("last_body"),
        F.max_by("msg_id", off).alias("last_msg_id"),
        F.max(off).alias("last_commit_log_offset"),
    )


def projection_table(metadata: Any, name: str) -> Any:
    """The SQLAlchemy table of the read model (primary key topic + key)."""
    from sqlalchemy import BigInteger, Column, DateTime, Integer, String, Table, Text

    return Table(
        name, metadata,
        Column("topic", String(255), primary_key=True),
        Column("key", String(255), primary_key=True),
        Column("event_count", Integer, nullable=False),
        Column("first_store_time", DateTime(timezone=True), nullable=False),
        Column("last_store_time", DateTime(timezone=True), nullable=False),
        Column("last_tags", String(255)),
        Column("last_body", Text),
        Column("last_msg_id", String(64), nullable=False),
        Column("last_commit_log_offset", BigInteger, nullable=False),
    )


def _upsert(conn: Any, table: Any, rows: list[dict[str, Any]]) -> None:
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # generic: delete + insert in the same transaction
        from sqlalchemy import and_, or_

        conn.execute(table.delete().where(or_(*[and_(table.c.topic == r["topic"], table.c.key == r["key"])
                                                 for r in rows])))
        conn.execute(table.insert(), rows)
        return
    stmt = insert(table)
    update = {c: stmt.excluded[c] for c in PROJECTION_COLUMNS if c not in ("topic", "key")}
    conn.execute(stmt.on_conflict_do_update(index_elements=["topic", "key"], set_=update), rows)


def project(spark: Any, path: str, url: str = "sqlite:///read_model.db", table: str = "rmq_projection",
            options: dict[str, str] | None = None, chunk: int = 1000, progress: bool = False) -> int:
    """Compute the projection and upsert it into `table` at `url`; returns the number of rows written."""
    from sqlalchemy import MetaData, create_engine

    engine = create_engine(url)
    meta = MetaData()
    tbl = projection_table(meta, table)
    meta.create_all(engine)
    rows_iter = projection_frame(spark, path, options).toLocalIterator()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit=" keys", desc="project")
    written = 0
    try:
        with engine.begin() as conn:
            batch: list[dict[str, Any]] = []
            for r in rows_iter:
                d = r.asDict()
                body = d["last_body"]
                d["last_body"] = None if body is None else bytes(body).decode("utf-8", "replace")
                for k in ("first_store_time", "last_store_time"):  # Spark gives naive local times
                    d[k] = d[k].astimezone(UTC)
                batch.append(d)
                if len(batch) >= chunk:
                    _upsert(conn, tbl, batch)
                    written += len(batch)
                    if bar is not None:
                        bar.update(len(batch))
                    batch = []
            if batch:
                _upsert(conn, tbl, batch)
                written += len(batch)
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
        engine.dispose()
    return written


# -- verify --------------------------------------------------------------------------------------------
@dataclass
class SegmentReport:
    """What verify found in one commitlog segment."""

    segment: str
    from_offset: int
    records: int = 0
    valid_end: int = 0  # log offset just after the last good record before the first damage / BLANK / zeros
    ends_with_blank: bool = False
    damaged: list[dict[str, Any]] = field(default_factory=list)  # {"offset": int, "reason": str}


def verify_segment(path: str, file_from: int, file_size: int, check_crc: bool = True) -> dict[str, Any]:
    """Check every record of one segment; after damage, re-synchronise and keep going."""
    rep = SegmentReport(os.path.basename(path), file_from, valid_end=file_from)
    seg = _Mapped(path, file_size)
    try:
        if seg.size == 0:
            return asdict(rep)
        buf = memoryview(seg.mm)
        pos = 0
        first_damage = False
        while pos < seg.size:
            st = decode.WalkState(pos)
            starts = decode.walk(buf, pos, seg.size, seg.size, 1 << 16, 1 << 40, st)
            bad_pos = None
            reason = ""
            if len(starts):
                f = decode.record_layout(seg.a, starts)
                bad = decode.first_invalid(f["ok"])
                n = len(starts) if bad is None else bad
                good = starts[:n]
                rep.records += n
                crc_bad: list[int] = []
                if check_crc and n:
                    crc_bad = decode.check_body_crcs(buf, f["body_pos"][:n], f["body_len"][:n], f["crc"][:n],
                                                     good)
                    rep.damaged += [{"offset": file_from + p, "reason": "body CRC mismatch"} for p in crc_bad]
                if n and not first_damage:
                    if crc_bad:
                        rep.valid_end = file_from + crc_bad[0]
                        first_damage = True
                    else:
                        rep.valid_end = file_from + int(good[-1]) + int(f["total"][n - 1])
                if bad is not None:
                    bad_pos = int(starts[bad])
                    r = codec.check_message_and_return_size(buf, bad_pos, limit=seg.size)
                    reason = r.reason or "record fails the length checks"
            if bad_pos is None:
                if st.reason == "more":
                    pos = st.pos
                    continue
                if st.reason == "end":
                    break
                if st.reason == "blank":
                    rep.ends_with_blank = not first_damage
                    break
                if st.reason == "zero":
                    nxt = decode.resync(buf, seg.mm, st.pos, seg.size, file_from)
                    if nxt is None:
                        break
                    bad_pos, reason = st.pos, f"zeroed gap up to offset {file_from + nxt} with records after it"
                else:
                    bad_pos, reason = st.pos, st.detail or "unreadable record"
            rep.damaged.append({"offset": file_from + bad_pos, "reason": reason})
            first_damage = True
            nxt = decode.resync(buf, seg.mm, bad_pos + 1, seg.size, file_from)
            if nxt is None:
                break
            pos = nxt
        del buf
    finally:
        seg.close()
    rep.damaged.sort(key=lambda d: d["offset"])
    return asdict(rep)


def _verify_partition(items: Any, check_crc: bool) -> Any:
    for path, base, size in items:
        yield verify_segment(path, base, size, check_crc)


def verify(spark: Any, path: str, check_crc: bool = True, commit_log_file_size: int | None = None,
           progress: bool = False) -> list[dict[str, Any]]:
    """Verify every segment of the store's commitlog in parallel (one task per segment)."""
    directory, _root = commit_log_dir(os.fspath(path))
    segs, size = list_segments(directory, commit_log_file_size)
    if not segs:
        return []
    items = [(p, o, size) for p, o, _s in segs]
    rdd = spark.sparkContext.parallelize(items, len(items))
    it = rdd.mapPartitions(lambda part: _verify_partition(part, check_crc)).toLocalIterator()
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=len(items), unit=" segments", desc="verify")
    reports = list(it)
    reports.sort(key=lambda r: r["from_offset"])
    return reports


def damaged_offsets(reports: list[dict[str, Any]]) -> list[int]:
    """Every damaged offset of a verify run, in log order."""
    return sorted(d["offset"] for r in reports for d in r["damaged"])


__all__ = ["PROJECTION_COLUMNS", "SegmentReport", "damaged_offsets", "export_parquet", "project",
           "projection_frame", "read_store", "verify", "verify_segment"]
