"""The numpy decoder against the engine's own reader, without Spark (fast, and pins the edge cases)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import V2_TOPIC
from spark_rows import by_offset, engine_rows

from rmq_eventstore.spark import decode


def decode_dir(directory: Path, max_rows: int = 64, filters: decode.Filters | None = None
               ) -> tuple[list[dict[str, Any]], list[decode.WalkState]]:
    rows: list[dict[str, Any]] = []
    states = []
    for name in sorted(os.listdir(directory)):
        with open(directory / name, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        a = np.frombuffer(mm, dtype=np.uint8)
        st = decode.WalkState(0)
        for d in decode.iter_batches(memoryview(mm), a, int(name), 0, len(a), filters, state=st, max_rows=max_rows):
            if d.batch is not None:
                assert d.batch.schema == decode.ARROW_SCHEMA
                rows += d.batch.to_pylist()
        states.append(st)
    return rows, states


def test_engine_store_decodes_like_the_engine(engine_store: Path) -> None:
    expected = by_offset(engine_rows(engine_store))
    rows, states = decode_dir(engine_store / "commitlog")
    assert len(states) >= 6
    assert [s.reason for s in states[:-1]].count("blank") >= len(states) - 2
    got = by_offset(rows)
    assert len(got) == len(expected) == 1804, (len(got), len(expected))
    assert got == expected
    # the cases the fixture planted are really there
    assert {r["topic"] for r in got} >= {V2_TOPIC, "orders", "payments", "audit"}
    assert any(r["store_host"].startswith("[fe80") for r in got) and any(r["born_host"].startswith("[2001")
                                                                          for r in got)
    dup = next(r for r in got if r["body"] == b"dup")
    assert dup["tags"] == "second" and dup["properties"]["TAGS"] == "second"


def test_golden_commitlog_decodes_like_the_engine(golden_stream_dir: dict[str, Path]) -> None:
    from conftest import GOLDEN

    for d in (GOLDEN / "commitlog-2k", golden_stream_dir["store.bin"], golden_stream_dir["store-crc.bin"]):
        rows, _ = decode_dir(d, max_rows=4)
        assert by_offset(rows) == by_offset(engine_rows(d)), d
        assert len(rows) == 15


def test_topic_filter_skips_before_decoding(engine_store: Path) -> None:
    f = decode.Filters(topics=frozenset({"payments"}), queue_ids=frozenset({1, 2}))
    rows, _ = decode_dir(engine_store / "commitlog", filters=f)
    expected = [r for r in by_offset(engine_rows(engine_store)) if r["topic"] == "payments" and r["queue_id"] in (1, 2)]
    assert by_offset(rows) == expected and expected


def test_walk_stops_at_a_partly_written_record(store_copy: Path) -> None:
    """A live writer's half-written last record (its first 60 bytes there, the rest still zero) is not read."""
    cl = store_copy / "commitlog"
    last = sorted(os.listdir(cl))[-1]
    rows, states = decode_dir(cl)
    tail = [r for r in rows if r["commit_log_offset"] >= int(last)]
    victim = tail[-1]
    pos = victim["commit_log_offset"] - int(last)
    with open(cl / last, "r+b") as fh:
        fh.seek(pos + 60)
        fh.write(b"\x00" * (victim["store_size"] - 60))
    rows2, states2 = decode_dir(cl)
    assert len(rows2) == len(rows) - 1
    assert states2[-1].reason == "damage" and states2[-1].pos == pos


def test_resync_finds_the_next_record_boundary(engine_store: Path) -> None:
    path = engine_store / "commitlog" / sorted(os.listdir(engine_store / "commitlog"))[0]
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    rows, _ = decode_dir(path.parent)
    starts = [r["commit_log_offset"] for r in rows if r["commit_log_offset"] < 64 * 1024]
    for probe in (1, starts[3] - 1, starts[3], 30_000):
        want = next(s for s in starts if s >= probe)
        assert decode.resync(memoryview(mm), mm, probe, len(mm), 0) == want


def test_resync_stops_at_the_split_end(engine_store: Path) -> None:
    """A split passes its end: a start at or past it is the next split's, and a split in preallocated zeros
    searches only its own bytes (before, each such split searched every later split's zeros too)."""
    path = engine_store / "commitlog" / sorted(os.listdir(engine_store / "commitlog"))[0]
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    rows, _ = decode_dir(path.parent)
    starts = sorted(r["commit_log_offset"] for r in rows if r["commit_log_offset"] < len(mm))
    searched: list[tuple[int, int]] = []

    class Finder:
        def __init__(self, m: mmap.mmap) -> None:
            self.m = m

        def find(self, sub: bytes, lo: int, hi: int) -> int:
            searched.append((lo, hi))
            return self.m.find(sub, lo, hi)

    buf = memoryview(mm)
    probe = starts[3] + 1
    assert decode.resync(buf, Finder(mm), probe, len(mm), 0, starts[4] + 1) == starts[4]
    assert decode.resync(buf, Finder(mm), probe, len(mm), 0, starts[4]) is None
    assert decode.resync(buf, Finder(mm), probe, len(mm), 0, starts[4] - 1) is None
    # The last segment's preallocated zeros after its last record: a split there searches its own bytes.
    last = engine_store / "commitlog" / sorted(os.listdir(engine_store / "commitlog"))[-1]
    with open(last, "rb") as fh:
        mm2 = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    file_from = int(last.name)
    tail = max(r["commit_log_offset"] + r["store_size"] for r in rows if r["commit_log_offset"] >= file_from) \
        - file_from if any(r["commit_log_offset"] >= file_from for r in rows) else 0
    assert tail + 4096 < len(mm2) and mm2[tail:] == bytes(len(mm2) - tail)
    searched.clear()
    assert decode.resync(memoryview(mm2), Finder(mm2), tail + 16, len(mm2), file_from, tail + 2064) is None
    assert searched and max(hi for _, hi in searched) <= tail + 2064 + 7


@pytest.mark.parametrize("value", [b"\x00" * 16, b""])
def test_zeroed_space_ends_a_walk(value: bytes) -> None:
    st = decode.WalkState(0)
    buf = memoryview(value + b"\x00" * 8)
    assert len(decode.walk(buf, 0, len(buf), len(buf), 10, 1 << 20, st)) == 0
    assert st.reason == "zero"
