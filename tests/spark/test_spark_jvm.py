"""`format("rocketmq-jvm")` (the JVM DataSource V2 reader) against `format("rocketmq")` (the Python source).

Both read the same real stores in the same local SparkSession and must give the same DataFrame, every
column of every row: the engine store of conftest (many segments, IPv6 born and store hosts, a V2-magic
record, empty and non-UTF-8 bodies, repeated property names), a store written in batches, the golden
files (with CRC checks), split segments, a damaged segment, text that is not UTF-8, and the topic filter.
Skipped only when the jar is not built and there is no `javac` to build it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import GOLDEN, SMALL_GEOMETRY
from spark_rows import by_offset

from rmq_eventstore.spark import jvm
from rmq_eventstore.store import Message, MessageStore

pytestmark = pytest.mark.skipif(jvm.jar_path() is None and jvm.javac() is None,
                                reason="no JVM reader jar and no javac to build it")


@pytest.fixture(scope="module")
def jspark(spark: Any) -> Any:
    """The session of conftest, which has the jar on its classpath (the fixture builds it first)."""
    assert jvm.jar_path() is not None, "javac is there but the jar was not built"
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    assert str(jvm.JAR) in jars, f"the session started without the jar (spark.jars={jars!r})"
    return spark


def load(spark: Any, fmt: str, path: Path, **options: Any) -> Any:
    r = spark.read.format(fmt)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load(str(path))


def rows(df: Any) -> list[dict[str, Any]]:
    return by_offset([r.asDict() for r in df.collect()])


def same(spark: Any, path: Path, **options: Any) -> list[dict[str, Any]]:
    """Rows of both sources (asserted equal, same partition count); returns them."""
    j = load(spark, jvm.FORMAT, path, **options)
    p = load(spark, "rocketmq", path, **options)
    assert j.schema == p.schema
    if "splitSize" in options:  # the same plan (without it the JVM reader cuts 16 MiB ranges, Python 64 MiB)
        assert j.rdd.getNumPartitions() == p.rdd.getNumPartitions()
    got, want = rows(j), rows(p)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a == b, (a["commit_log_offset"], {k: (a[k], b[k]) for k in a if a[k] != b[k]})
    return got


@pytest.fixture(scope="module")
def batch_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written with `put_messages` batches: IPv4 hosts, keys, tags, properties, several segments."""
    root = tmp_path_factory.mktemp("jvm") / "batched"
    with MessageStore.open(root, **SMALL_GEOMETRY) as store:
        for b in range(12):
            msgs = [Message(topic=f"T{(b + i) % 3}", body=b"x" * (10 + i * 7) + bytes([i]),
                            tags=f"t{i % 4}" if i % 5 else None, keys=[f"k{b}-{i}", "shared"],
                            queue_id=i % 4, properties={"n": str(i), "batch": str(b)},
                            born_host=f"192.168.{b}.{i % 250 + 1}:{9000 + i}")
                    for i in range(50)]
            assert store.put_messages(msgs).is_ok()
        store.wait_for_dispatch()
    return root


@pytest.fixture(scope="module")
def window_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 MiB segments of small records, records that outgrow the reader's 1 MiB copy window, and a last
    segment mostly preallocated zeros: batches end at the row cap inside a window and at a window's end,
    a record larger than the window is read whole, and the ranges in the zeros find no record. Tags and
    property names repeat, then come in thousands of distinct ones and a 200-byte name."""
    root = tmp_path_factory.mktemp("jvm") / "windows"
    with MessageStore.open(root, mapped_file_size_commit_log=8 << 20, message_index_enable=False) as store:
        n = 0
        for b in range(60):
            big = b in (7, 31)
            msgs = [Message(topic=f"W{i % 3}", body=bytes([65 + i % 26]) * ((1_500_000 + 700_000 * (b == 31))
                                                                            if big and i == 5 else 20 + i % 90),
                            tags=f"t{i % 5}" if b % 3 else f"u{n + i}", keys=f"k{n + i}", queue_id=i % 2,
                            properties={f"p{n + i}": "v", "L" * 200: "long name"} if b % 4 == 1 else None)
                    for i in range(500)]
            n += len(msgs)
            assert store.put_messages(msgs).is_ok()
        store.wait_for_dispatch()
    return root


def test_copy_windows_and_large_records(jspark: Any, window_store: Path) -> None:
    got = same(jspark, window_store)
    assert len(got) == 30_000
    assert max(len(r["body"]) for r in got) == 2_200_000
    assert len({r["tags"] for r in got}) > 10_000 and sum("L" * 200 in r["properties"] for r in got) == 7500
    assert len(os.listdir(window_store / "commitlog")) == 2
    assert same(jspark, window_store, splitSize=3_000_000) == got


def test_odd_property_strings(jspark: Any, window_store: Path, tmp_path: Path) -> None:
    """Properties that `string_to_properties` splits in its own way, made in place (same lengths): a value
    that is 0x01, a segment without 0x01 (dropped) followed by a value holding 0x01, an empty value."""
    root = tmp_path / "odd"
    shutil.copytree(window_store, root)
    seg = _segment_of(root, 0)
    data = bytearray(seg.read_bytes())
    at = 0
    for i, repl in enumerate([b"\x01\x01\x02", b"\x02v\x01", b"\x01\x02\x02"] * 3):
        at = data.index(b"\x01v\x02", at + 1 + 1000 * i)
        data[at:at + 3] = repl
    seg.write_bytes(bytes(data))
    got = same(jspark, root)
    assert sum(r["properties"].get("v", "").startswith("L" * 200 + "\x01") for r in got) == 3
    assert sum("\x01" in r["properties"].values() for r in got) == 3


def test_engine_store_equals_python_source(jspark: Any, engine_store: Path) -> None:
    got = same(jspark, engine_store)
    assert len(got) > 1800
    assert len(os.listdir(engine_store / "commitlog")) >= 5
    assert any(r["born_host"].startswith("[") for r in got) and any(r["store_host"].startswith("[") for r in got)
    assert any(r["tags"] == "second" and r["properties"]["TAGS"] == "second" for r in got)  # last duplicate
    assert any(r["keys"] == "lk" and r["topic"] == "v2topic" for r in got)
    # ~10 KiB ranges: every range but a segment's first re-synchronises on a record boundary
    split = same(jspark, engine_store, splitSize=10_000)
    assert split == got


def test_batch_store_and_crc(jspark: Any, batch_store: Path) -> None:
    got = same(jspark, batch_store, verifyCrc="true")
    assert len(got) == 600
    assert {r["born_host"] for r in got} >= {"192.168.0.1:9000", "192.168.11.50:9049"}
    assert all(r["keys"].endswith(" shared") and r["uniq_key"] for r in got)
    assert sum(r["tags"] is None for r in got) == 12 * 10


def test_golden_files(jspark: Any, golden_stream_dir: dict[str, Path]) -> None:
    for d in (GOLDEN / "commitlog-2k", golden_stream_dir["store.bin"], golden_stream_dir["store-crc.bin"]):
        assert len(same(jspark, d)) == 15, d
        assert len(same(jspark, d, verifyCrc="true")) == 15, d


def test_topics_filter_on_a_scan(jspark: Any, engine_store: Path) -> None:
    got = same(jspark, engine_store, topics="orders, v2topic", useConsumeQueue="false")
    assert load(jspark, jvm.FORMAT, engine_store, splitSize=20_000).rdd.getNumPartitions() > \
        load(jspark, jvm.FORMAT, engine_store).rdd.getNumPartitions()
    assert {r["topic"] for r in got} == {"orders", "v2topic"}
    bare = engine_store / "commitlog"  # a bare commitlog directory has no consume queues: no option needed
    assert same(jspark, bare, topic="audit") == [r for r in same(jspark, bare) if r["topic"] == "audit"]


def _segment_of(root: Path, index: int) -> Path:
    return sorted((root / "commitlog").iterdir())[index]


def test_damage_and_text_that_is_not_utf8(jspark: Any, store_copy: Path) -> None:
    full = same(jspark, store_copy)
    # a record's magic code overwritten in the middle of the 4th segment: that segment ends there
    seg = _segment_of(store_copy, 3)
    base = int(seg.name)
    recs = [r for r in full if base <= r["commit_log_offset"] < base + seg.stat().st_size]
    victim = recs[len(recs) // 2]["commit_log_offset"] - base
    data = bytearray(seg.read_bytes())
    data[victim + 4:victim + 8] = b"\x12\x34\x56\x78"
    seg.write_bytes(bytes(data))
    # a property value and a topic made invalid UTF-8 (same lengths: the records stay well-formed)
    seg2 = _segment_of(store_copy, 5)
    data = bytearray(seg2.read_bytes())
    at = data.index(b"\x01test\x02")
    data[at + 2] = 0xC3
    at = data.index(b"\x08payments", at)
    data[at + 3:at + 5] = b"\xe2\x82"
    seg2.write_bytes(bytes(data))
    got = same(jspark, store_copy)
    assert len(got) == len(full) - (len(recs) - len(recs) // 2)
    assert any("\ufffd" in r["topic"] for r in got)
    assert any("\ufffd" in r["properties"].get("src", "") for r in got)


def test_body_crc_mismatch_fails_naming_the_offset(jspark: Any, store_copy: Path) -> None:
    full = rows(load(jspark, jvm.FORMAT, store_copy))
    victim = next(r for r in full[700:] if len(r["body"]) > 8)
    seg = _segment_of(store_copy, 0).parent / f"{victim['commit_log_offset'] // (64 * 1024) * (64 * 1024):020d}"
    data = bytearray(seg.read_bytes())
    start = victim["commit_log_offset"] - int(seg.name)
    body_at = start + bytes(data[start:start + victim["store_size"]]).index(victim["body"])
    data[body_at + 3] ^= 0x10
    seg.write_bytes(bytes(data))
    assert load(jspark, jvm.FORMAT, store_copy).count() == len(full)  # default: no CRC check, as Python
    with pytest.raises(Exception, match=f"BODYCRC mismatch .* {victim['commit_log_offset']}"):
        load(jspark, jvm.FORMAT, store_copy, verifyCrc="true").count()


def test_clear_errors(jspark: Any, engine_store: Path, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no store directory at"):
        load(jspark, jvm.FORMAT, tmp_path / "missing")
    with pytest.raises(Exception, match="neither a commitlog"):
        load(jspark, jvm.FORMAT, tmp_path)
    for name in ("startTime", "queueIds", "pushdown", "noSuchOption"):
        with pytest.raises(Exception, match=f"option {name.lower()} is not supported by the rocketmq-jvm"):
            load(jspark, jvm.FORMAT, engine_store, **{name: "1"})
    with pytest.raises(Exception, match="useConsumeQueue=false"):
        load(jspark, jvm.FORMAT, engine_store, topics="orders")
    with pytest.raises(Exception, match="splitSize must be positive"):
        load(jspark, jvm.FORMAT, engine_store, splitSize=0)
    with pytest.raises(Exception, match="expected true or false"):
        load(jspark, jvm.FORMAT, engine_store, verifyCrc="maybe")


def test_plan_is_columnar_without_python(jspark: Any, engine_store: Path) -> None:
    df = load(jspark, jvm.FORMAT, engine_store)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "ColumnarToRow" in plan and "BatchScan rocketmq-jvm" in plan
    assert "Python" not in plan
    py_plan = load(jspark, "rocketmq", engine_store)._jdf.queryExecution().executedPlan().toString()
    assert "Python" in py_plan  # the name "rocketmq" stays the Python source with the jar on the classpath


def test_build_refuses_a_broken_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if jvm.javac() is None:
        pytest.skip("no javac")
    src = tmp_path / "java"
    shutil.copytree(jvm.SOURCE_DIR, src)
    (src / "rmqeventstore" / "spark" / "Broken.java").write_text("package rmqeventstore.spark; class Broken {")
    monkeypatch.setattr(jvm, "SOURCE_DIR", src)
    monkeypatch.setattr(jvm, "JAR", tmp_path / "out.jar")
    with pytest.raises(jvm.BuildError, match="javac failed"):
        jvm.build()
    assert not (tmp_path / "out.jar").exists()


def test_pruned_columns(jspark: Any, engine_store: Path) -> None:
    """Only the columns a query uses are decoded; each subset equals the Python source's."""
    subsets = [["commit_log_offset", "msg_id", "tags"], ["commit_log_offset", "properties", "born_host"],
               ["store_timestamp", "body", "commit_log_offset", "keys", "uniq_key"]]
    names = load(jspark, jvm.FORMAT, engine_store).columns
    for cols in subsets:
        j = load(jspark, jvm.FORMAT, engine_store).select(*cols)
        plan = j._jdf.queryExecution().executedPlan().toString()
        scan = next(line for line in plan.splitlines() if "BatchScan" in line)
        assert all(f"{c}#" in scan for c in cols) and not any(f" {c}#" in scan or f"[{c}#" in scan
                                                             for c in names if c not in cols), scan
        p = load(jspark, "rocketmq", engine_store).select(*cols)
        got = sorted(j.collect(), key=lambda r: r["commit_log_offset"])
        assert got == sorted(p.collect(), key=lambda r: r["commit_log_offset"]), cols
        assert len(got) > 1800
    j = load(jspark, jvm.FORMAT, engine_store / "commitlog", topics="audit")
    assert j.count() == load(jspark, "rocketmq", engine_store / "commitlog", topics="audit").count() > 0
    assert j.select("queue_id").distinct().count() == 4
