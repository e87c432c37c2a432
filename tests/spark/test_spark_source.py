"""`spark.read.format("rocketmq")` against the engine's own reader, options, pushdown and CRC checks."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import GOLDEN
from spark_rows import by_offset, engine_rows

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def collect(df: Any) -> list[dict[str, Any]]:
    return by_offset([r.asDict() for r in df.collect()])


def read(spark: Any, path: Path, **options: Any) -> Any:
    r = spark.read.format("rocketmq")
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load(str(path))


@pytest.fixture(scope="module")
def expected(engine_store: Path) -> list[dict[str, Any]]:
    return by_offset(engine_rows(engine_store))


def test_dataframe_equals_engine_reader(spark: Any, engine_store: Path, expected: list[dict[str, Any]]) -> None:
    df = read(spark, engine_store)
    assert df.columns[:4] == ["topic", "queue_id", "queue_offset", "commit_log_offset"]
    assert df.rdd.getNumPartitions() == len(os.listdir(engine_store / "commitlog"))
    assert collect(df) == expected
    # split every 64 KiB segment into ~10 KiB ranges: readers re-synchronise on record boundaries
    split = read(spark, engine_store, splitSize=10_000)
    assert split.rdd.getNumPartitions() > 4 * len(os.listdir(engine_store / "commitlog"))
    assert collect(split) == expected


def test_golden_files(spark: Any, golden_stream_dir: dict[str, Path]) -> None:
    for d in (GOLDEN / "commitlog-2k", golden_stream_dir["store.bin"], golden_stream_dir["store-crc.bin"]):
        want = by_offset(engine_rows(d))
        assert len(want) == 15
        assert collect(read(spark, d)) == want, d
        assert collect(read(spark, d, verifyCrc="true")) == want, d


def test_options(spark: Any, engine_store: Path, expected: list[dict[str, Any]]) -> None:
    ts = sorted(r["store_timestamp"] for r in expected)
    t0, t1 = ts[len(ts) // 4], ts[3 * len(ts) // 4]
    offs = [r["commit_log_offset"] for r in expected]
    o0, o1 = offs[100], offs[900]
    # topic through the consume queues, and by a commitlog scan (useConsumeQueue=false)
    want = [r for r in expected if r["topic"] in ("orders", "audit") and r["queue_id"] in (1, 3)]
    for cq in ("true", "false"):
        got = collect(read(spark, engine_store, topics="orders,audit", queueIds="1,3", useConsumeQueue=cq))
        assert got == want and want, cq
    want = [r for r in expected if t0 <= r["store_timestamp"] < t1]
    got = collect(read(spark, engine_store, startTime=t0.isoformat(), endTime=int(t1.timestamp() * 1000)))
    assert got == want and want
    want = [r for r in expected if o0 <= r["commit_log_offset"] < o1]
    assert collect(read(spark, engine_store, startOffset=o0 + 1 if False else o0, endOffset=o1)) == want
    assert collect(read(spark, engine_store, startOffset=o0 + 1, endOffset=o1)) == want[1:]
    with pytest.raises(Exception, match="expected an integer"):
        read(spark, engine_store, startOffset="x").count()


def _plan(df: Any) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def test_pushdown_gives_the_same_rows(spark: Any, engine_store: Path, expected: list[dict[str, Any]]) -> None:
    ts = sorted(r["store_timestamp"] for r in expected)
    lo, hi = ts[200], ts[1200]
    queries = [
        ("topic = 'payments'", lambda r: r["topic"] == "payments"),
        ("topic IN ('orders', 'v2topic') AND queue_id = 2",
         lambda r: r["topic"] in ("orders", "v2topic") and r["queue_id"] == 2),
        (f"store_timestamp >= '{lo.isoformat()}' AND store_timestamp < '{hi.isoformat()}' AND topic = 'audit'",
         lambda r: lo <= r["store_timestamp"] < hi and r["topic"] == "audit"),
        (f"store_timestamp > '{(lo + timedelta(microseconds=1)).isoformat()}'", lambda r: r["store_timestamp"] > lo),
        ("topic = 'payments' OR queue_id = 0", lambda r: r["topic"] == "payments" or r["queue_id"] == 0),
        ("tags = 'tag1' AND commit_log_offset >= 5000", lambda r: r["tags"] == "tag1" and r["commit_log_offset"] >= 5000),
    ]
    try:
        results = {}
        for enabled in ("false", "true"):
            spark.conf.set(PUSHDOWN, enabled)
            for where, _pred in queries:
                filtered = read(spark, engine_store).where(where)
                results[enabled, where] = collect(filtered)
                plan = _plan(filtered)
                if enabled == "false":
                    assert "topic" in plan or "topic" not in where  # Spark keeps every predicate itself
        # Toggled at runtime in one session. On: the source takes the topic predicate (Spark's Filter keeps
        # only isnotnull) and plans one partition per consume queue file; off: Spark filters a full scan.
        spark.conf.set(PUSHDOWN, "true")
        on = read(spark, engine_store).where("topic = 'payments'")
        assert "= payments" not in _plan(on)
        assert on.rdd.getNumPartitions() == len(os.listdir(engine_store / "consumequeue" / "payments"))
        spark.conf.set(PUSHDOWN, "false")
        off = read(spark, engine_store).where("topic = 'payments'")
        assert "= payments" in _plan(off)
        assert off.rdd.getNumPartitions() == len(os.listdir(engine_store / "commitlog"))
    finally:
        spark.conf.set(PUSHDOWN, "true")
    for where, pred in queries:
        want = [r for r in expected if pred(r)]
        assert want, where
        assert results["false", where] == want, where
        assert results["true", where] == want, where


def test_crc_option_fails_on_a_flipped_body_bit(spark: Any, store_copy: Path) -> None:
    rows = by_offset(engine_rows(store_copy))
    victim = rows[500]
    seg = victim["commit_log_offset"] // (64 * 1024) * (64 * 1024)
    path = store_copy / "commitlog" / f"{seg:020d}"
    body_pos = victim["commit_log_offset"] - seg + victim["store_size"] - len(victim["body"]) - 0
    # body sits before topic and properties: find it in the record bytes
    data = path.read_bytes()
    rec = data[victim["commit_log_offset"] - seg: victim["commit_log_offset"] - seg + victim["store_size"]]
    body_pos = victim["commit_log_offset"] - seg + rec.index(victim["body"])
    flipped = bytearray(data)
    flipped[body_pos + 3] ^= 0x10
    path.write_bytes(bytes(flipped))
    assert read(spark, store_copy).count() == len(rows)  # structure intact: read without CRC checks
    with pytest.raises(Exception, match=f"BODYCRC mismatch .* {victim['commit_log_offset']}"):
        read(spark, store_copy, verifyCrc="true").count()


def test_bad_path_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="neither a commitlog"):
        read(spark, tmp_path).count()
    assert datetime.now(UTC)  # keeps the import honest
