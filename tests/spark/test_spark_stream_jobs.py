"""Streaming from a store a live `MessageStore` appends to, and the export / project / verify jobs."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from conftest import TOPICS, write_messages
from spark_rows import by_offset, engine_rows

from rmq_eventstore.cli import main
from rmq_eventstore.spark import jobs
from rmq_eventstore.store import MessageStore
from tests.conftest import SMALL_GEOMETRY

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def test_stream_sees_records_appended_after_start(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "live"
    seen: list[list[int]] = []

    def sink(batch: Any, batch_id: int) -> None:
        seen.append(sorted(r.commit_log_offset for r in batch.select("commit_log_offset").collect()))

    with MessageStore.open(root, **SMALL_GEOMETRY) as store:
        write_messages(store, 0, 200)
        store.flush_and_checkpoint()
        query = (spark.readStream.format("rocketmq").load(str(root)).writeStream
                 .foreachBatch(sink).trigger(processingTime="500 milliseconds")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        try:
            deadline = time.monotonic() + 60
            while sum(map(len, seen)) < 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sum(map(len, seen)) == 200
            batches_before = len(seen)
            write_messages(store, 200, 700)  # rolls into new segments while the query runs
            store.flush_and_checkpoint()
            while sum(map(len, seen)) < 900 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            query.stop()
        assert query.exception() is None
    offsets = [o for b in seen for o in b]
    assert len(seen) > batches_before  # the new records came in later micro-batches
    assert offsets == [r["commit_log_offset"] for r in by_offset(engine_rows(root))]  # each once, in order


def test_available_now_reads_the_log_in_capped_micro_batches(spark: Any, engine_store: Path, tmp_path: Path
                                                            ) -> None:
    sizes: list[int] = []
    query = (spark.readStream.format("rocketmq").option("maxBytesPerTrigger", 150_000).option("topic", "orders")
             .load(str(engine_store)).writeStream.foreachBatch(lambda b, _i: sizes.append(b.count()))
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ckpt")).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    want = sum(1 for r in engine_rows(engine_store) if r["topic"] == "orders")
    assert sum(sizes) == want and len([s for s in sizes if s]) >= 3


def test_export_parquet_partitioned_by_topic_and_day(spark: Any, engine_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "lake"
    n = jobs.export_parquet(spark, str(engine_store), str(out))
    expected = by_offset(engine_rows(engine_store))
    assert n == len(expected)
    topics = {p.name for p in out.iterdir() if p.is_dir()}
    assert {f"topic={t}" for t in TOPICS} <= topics
    day = expected[0]["store_timestamp"].astimezone(UTC).date().isoformat()
    assert (out / "topic=orders" / f"day={day}").is_dir()
    back = spark.read.parquet(str(out))
    got = by_offset([{k: v for k, v in r.asDict().items() if k != "day"} for r in back.collect()])
    assert got == expected
    # a second export of one topic replaces only that topic's partitions
    assert jobs.export_parquet(spark, str(engine_store), str(out), {"topics": "audit"}) == len(expected)


def _expected_projection(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    model: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:  # log order
        for key in (r["keys"] or "").split(" "):
            if not key:
                continue
            m = model.setdefault((r["topic"], key), {"event_count": 0, "first_store_time": r["store_timestamp"]})
            m["event_count"] += 1
            m["last_store_time"] = max(m.get("last_store_time", r["store_timestamp"]), r["store_timestamp"])
            m["first_store_time"] = min(m["first_store_time"], r["store_timestamp"])
            m.update(last_tags=r["tags"], last_body=r["body"].decode("utf-8", "replace"), last_msg_id=r["msg_id"],
                     last_commit_log_offset=r["commit_log_offset"])
    return model


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_project_into_sql(spark: Any, engine_store: Path, tmp_path: Path, backend: str) -> None:
    from sqlalchemy import MetaData, create_engine, select, text

    url = f"sqlite:///{tmp_path / 'rm.db'}" if backend == "sqlite" else PG_URL
    table = f"rm_{uuid.uuid4().hex[:12]}"
    want = _expected_projection(by_offset(engine_rows(engine_store)))
    engine = create_engine(url)
    try:
        assert jobs.project(spark, str(engine_store), url, table) == len(want)
        assert jobs.project(spark, str(engine_store), url, table) == len(want)  # idempotent upsert
        with engine.connect() as conn:
            tbl = jobs.projection_table(MetaData(), table)
            rows = [dict(r._mapping) for r in conn.execute(select(tbl))]
        assert len(rows) == len(want)
        for r in rows:
            m = want[r["topic"], r["key"]]
            for k in ("event_count", "last_tags", "last_body", "last_msg_id", "last_commit_log_offset"):
                assert r[k] == m[k], (k, r, m)
            for k in ("first_store_time", "last_store_time"):
                got = r[k] if r[k].tzinfo else r[k].replace(tzinfo=UTC)  # SQLite keeps no zone: UTC stored
                assert got == m[k]
        assert want["orders", "bin"]["last_body"].startswith("\ufffd")
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def test_verify_finds_an_injected_bit_flip(spark: Any, store_copy: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    clean = jobs.verify(spark, str(store_copy))
    assert jobs.damaged_offsets(clean) == []
    assert sum(r["records"] for r in clean) == len(engine_rows(store_copy))
    rows = by_offset(engine_rows(store_copy))
    victims = [rows[300], rows[1200]]
    for v, how in zip(victims, ("body", "size"), strict=True):
        seg = v["commit_log_offset"] // (64 * 1024) * (64 * 1024)
        path = store_copy / "commitlog" / f"{seg:020d}"
        data = bytearray(path.read_bytes())
        pos = v["commit_log_offset"] - seg
        if how == "body":
            data[pos + bytes(data[pos:pos + v["store_size"]]).index(v["body"]) + 2] ^= 0x01
        else:
            data[pos + 2] ^= 0x40  # TOTALSIZE: the record no longer adds up
        path.write_bytes(bytes(data))
    reports = jobs.verify(spark, str(store_copy))
    assert jobs.damaged_offsets(reports) == [v["commit_log_offset"] for v in victims]
    # records after the damage in the same segment are still counted (verify re-synchronises)
    assert sum(r["records"] for r in reports) == len(rows) - 1
    code = main(["spark", "verify", str(store_copy), "--json", "--no-progress"])
    assert code == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["damaged_offsets"] == [v["commit_log_offset"] for v in victims] and not doc["ok"]


def test_cli_export_and_project(spark: Any, engine_store: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark", "export", str(engine_store), "--out", str(tmp_path / "pq"), "--topic", "audit",
                 "--no-progress"]) == 0
    n_audit = sum(1 for r in engine_rows(engine_store) if r["topic"] == "audit")
    assert f"{n_audit} messages in the directory" in capsys.readouterr().out
    db = tmp_path / "cli.db"
    assert main(["spark", "project", str(engine_store), "--url", f"sqlite:///{db}", "--no-progress"]) == 0
    assert "projected" in capsys.readouterr().out and db.exists()
    assert main(["spark", "verify", str(tmp_path / "nope"), "--no-progress"]) == 2


def test_the_cli_and_the_store_do_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = ("import sys, rmq_eventstore, rmq_eventstore.store, rmq_eventstore.cli.app as c; "
            "assert 'spark' in [cmd.name for cmd in c.COMMANDS]; c.build_parser(); "
            "assert not [m for m in sys.modules if m.startswith(('pyspark', 'pyarrow'))], 'pyspark loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_stream_offsets_roll_over_blank_records_and_respect_the_byte_cap(engine_store: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

    from rmq_eventstore.spark.stream import RocketMQStreamReader, complete_end

    rows = by_offset(engine_rows(engine_store))
    end = rows[-1]["commit_log_offset"] + rows[-1]["store_size"]
    cl = str(engine_store / "commitlog")
    assert complete_end(cl, 0) == end  # walks every segment, rolling over each BLANK
    capped = complete_end(cl, 0, max_bytes=100_000)
    starts = [r["commit_log_offset"] for r in rows]
    assert capped in starts and 100_000 <= capped < 100_000 + 2048  # a record boundary just past the cap
    latest = RocketMQStreamReader(str(engine_store), {"startingoffsets": "latest"})
    assert latest.initialOffset() == {"offset": end}
    r = RocketMQStreamReader(str(engine_store), {"maxbytespertrigger": "100000"})
    assert r.initialOffset() == {"offset": 0}
    assert r.latestOffset({"offset": 0}, ReadAllAvailable()) == {"offset": end}
    assert isinstance(r.getDefaultReadLimit(), ReadMaxBytes)
    assert r.latestOffset({"offset": 0}, r.getDefaultReadLimit()) == {"offset": capped}
    parts = r.partitions({"offset": 0}, {"offset": capped})
    assert [p.file_from for p in parts] == [0, 65536] and parts[-1].hi == capped - 65536
    with pytest.raises(ValueError, match="startingOffsets"):
        RocketMQStreamReader(str(engine_store), {"startingoffsets": "yesterday"})
