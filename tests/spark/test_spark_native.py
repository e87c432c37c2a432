"""The C scan (`rmq_eventstore._spark_native`) against the numpy decoder it replaces: identical batches.

The store has 1 MiB commitlog segments (several files, BLANK-ended), properties with non-ASCII text,
keys lists, tags, transactional records (PREPARED, COMMIT with a prepared offset), large bodies (up to
700 KB), V2-magic records, and the records the C decoder hands back to numpy (an IPv6 born host,
properties that repeat a name), so batches of both kinds follow each other. With
`RMQ_EVENTSTORE_PURE=1` the numpy decoder runs alone and is checked against the engine.
"""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from spark_rows import by_offset, engine_rows

from rmq_eventstore.common import sysflag
from rmq_eventstore.spark import decode, source
from rmq_eventstore.store import Message, MessageStore

SEGMENT = 1 << 20


@pytest.fixture(scope="module")
def varied_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spark-native") / "store"
    rnd = random.Random(16)
    with MessageStore.open(root, mapped_file_size_commit_log=SEGMENT, mapped_file_size_consume_queue=20 * 1000,
                           message_index_enable=False) as store:
        for i in range(900):
            kind = i % 30
            props = {"seq": str(i), "city": "Zürich €" if i % 2 else "東京", "emoji": "😀" * (i % 3)}
            msg = Message(topic=("orders", "payments", "lengths")[i % 3], queue_id=i % 4, flag=i % 3,
                          body=rnd.randbytes(rnd.randrange(0, 600)), tags=f"tag{i % 5}" if i % 4 else None,
                          keys=[f"k{i}", f"acct-{i % 7}"] if i % 3 else (f"k{i}" if i % 2 else None),
                          properties=props, reconsume_times=i % 5)
            if kind == 1:
                msg.sys_flag = sysflag.TRANSACTION_PREPARED_TYPE
            elif kind == 2:
                msg.sys_flag = sysflag.TRANSACTION_COMMIT_TYPE
                msg.prepared_transaction_offset = 1000 + i
            elif kind == 3:
                msg.body = rnd.randbytes(300_000 if i % 60 == 3 else 700_000)  # large bodies: new segments
            elif kind == 4:
                msg.force_v2 = True
            elif kind == 5 and i % 150 == 5:
                msg.born_host = "[2001:db8::9]:7000"  # IPv6: this batch goes to numpy
            elif kind == 6 and i % 120 == 6:
                msg.properties_string = "TAGS\x01a\x02KEYS\x01x\x02TAGS\x01b\x02"  # a name twice: numpy
            elif kind == 7:
                msg.properties_string = ""  # no properties at all
            elif kind == 8:
                msg.properties_string = "\x02\x01\x02only\x01\x02k\x01v\x01w\x02=\x01\x02"  # odd segments
            assert store.put_message(msg).is_ok()
        store.wait_for_dispatch()
    assert len(os.listdir(root / "commitlog")) >= 4
    return root


def _segments(root: Path) -> Iterator[tuple[memoryview, np.ndarray, int]]:
    segs, _ = source.list_segments(str(root / "commitlog"))
    for path, base, size in segs:
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
        yield memoryview(mm), np.frombuffer(mm, dtype=np.uint8), base


def _scan(root: Path, max_rows: int, filters: decode.Filters | None = None, check_crc: bool = False
          ) -> tuple[list[pa.RecordBatch], list[decode.WalkState]]:
    batches, states = [], []
    for buf, a, base in _segments(root):
        st = decode.WalkState(0)
        for d in decode.iter_batches(buf, a, base, 0, len(a), filters, check_crc, st, max_rows=max_rows):
            assert not d.crc_bad
            if d.batch is not None:
                assert d.batch.schema == decode.ARROW_SCHEMA
                batches.append(d.batch)
        states.append(st)
    return batches, states


def _both(fn: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    if not decode.NATIVE:
        pytest.skip("the C scan is not active (RMQ_EVENTSTORE_PURE=1 or not built)")
    native = fn()
    with monkeypatch.context() as m:
        m.setattr(decode, "_native", None)
        numpy = fn()
    return native, numpy


def _same(xs: list[pa.RecordBatch], ys: list[pa.RecordBatch]) -> None:
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        assert x.schema == y.schema
        x.validate(full=True)
        assert x.equals(y), (x.to_pylist()[:2], y.to_pylist()[:2])


def test_the_c_scan_is_there_when_required() -> None:
    """`make test` sets RMQ_EVENTSTORE_REQUIRE_NATIVE=1 for its first pass: a missing build fails there."""
    required = os.environ.get("RMQ_EVENTSTORE_REQUIRE_NATIVE", "0") not in ("", "0")
    pure = os.environ.get("RMQ_EVENTSTORE_PURE", "0") not in ("", "0")
    if required and not pure:
        assert decode.NATIVE, "RMQ_EVENTSTORE_REQUIRE_NATIVE is set but rmq_eventstore._spark_native does not import"
    assert decode.NATIVE == (decode._native is not None) and not (pure and decode.NATIVE)


def test_the_decoder_in_use_reads_what_the_engine_reads(varied_store: Path) -> None:
    batches, states = _scan(varied_store, 64)
    rows = [r for b in batches for r in b.to_pylist()]
    assert by_offset(rows) == by_offset(engine_rows(varied_store))
    assert len(rows) == 900 and any(len(r["body"]) == 700_000 for r in rows)
    assert [s.reason for s in states[:-1]] == ["blank"] * (len(states) - 1) and states[-1].reason == "zero"


@pytest.mark.parametrize("max_rows", [7, 64, 32768])
def test_native_and_numpy_batches_are_identical(varied_store: Path, max_rows: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (nb, ns), (pb, ps) = _both(lambda: _scan(varied_store, max_rows), monkeypatch)
    _same(nb, pb)
    assert ns == ps


def test_the_c_decoder_really_decodes_and_hands_back_the_rest(varied_store: Path) -> None:
    """Most batches are the C decoder's own; IPv6 hosts and repeated names go to numpy."""
    if not decode.NATIVE:
        pytest.skip("the C scan is not active")
    own = back = 0
    for buf, a, _base in _segments(varied_store):
        st = decode.WalkState(0)
        while True:
            starts = decode.walk(buf, st.pos, len(a), len(a), 7, 1 << 40, st)
            if len(starts):
                r = decode._native.decode(a, np.ascontiguousarray(starts), False, False)
                own, back = (own + 1, back) if r is not None else (own, back + 1)
            if st.reason != "more":
                break
    assert own > 100 and 2 <= back <= 20, (own, back)


@pytest.mark.parametrize("filters", [
    decode.Filters(topics=frozenset({"lengths", "payments"})),
    decode.Filters(queue_ids=frozenset({1, 3}), min_offset=SEGMENT + 5000, max_offset=3 * SEGMENT),
    decode.Filters(topics=frozenset({"nope"})),
])
def test_filters_and_crc_checks_agree(varied_store: Path, filters: decode.Filters,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (nb, _), (pb, _) = _both(lambda: _scan(varied_store, 100, filters, check_crc=True), monkeypatch)
    _same(nb, pb)


def test_time_filter_agrees(varied_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = sorted(r["store_timestamp"] for r in engine_rows(varied_store))
    mid = int(ts[len(ts) // 2].timestamp() * 1000)
    f = decode.Filters(min_ts=mid, max_ts=mid + 5)
    (nb, _), (pb, _) = _both(lambda: _scan(varied_store, 50, f), monkeypatch)
    _same(nb, pb)
    assert sum(b.num_rows for b in nb) >= 1


def test_a_body_crc_mismatch_is_found_by_both(varied_store: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    root = tmp_path / "s"
    shutil.copytree(varied_store, root)
    first = root / "commitlog" / sorted(os.listdir(root / "commitlog"))[0]
    with open(first, "r+b") as fh:
        fh.seek(88 + 2)  # inside the first record's body
        b = fh.read(1)
        fh.seek(88 + 2)
        fh.write(bytes([b[0] ^ 0xFF]))

    def crc_bad() -> list[int]:
        out = []
        for buf, a, base in _segments(root):
            for d in decode.iter_batches(buf, a, base, 0, len(a), None, True, max_rows=64):
                out += d.crc_bad
        return out

    nat, num = _both(crc_bad, monkeypatch)
    assert nat == num == [0]


def test_damage_stops_both_at_the_same_record(varied_store: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    root = tmp_path / "s"
    shutil.copytree(varied_store, root)
    rows = by_offset(engine_rows(root))
    victim = rows[40]
    with open(root / "commitlog" / f"{0:020d}", "r+b") as fh:  # BODYLEN runs past the record
        fh.seek(victim["commit_log_offset"] + 84)
        fh.write((0x7FFF0000).to_bytes(4, "big"))

    def scan() -> tuple[list[pa.RecordBatch], list[decode.WalkState]]:
        return _scan(root, 16)

    (nb, ns), (pb, ps) = _both(scan, monkeypatch)
    _same(nb, pb)
    assert ns == ps and ns[0].reason == "damage"
    assert sum(b.num_rows for b in nb) < len(rows)


def test_consume_queue_reads_agree(varied_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = source.ReadSpec(decode.Filters(topics=frozenset({"lengths"})), True)
    parts = source.plan_queues(str(varied_store), str(varied_store / "commitlog"), SEGMENT,
                               frozenset({"lengths"}), None)
    assert parts

    def read() -> list[pa.RecordBatch]:
        return [b for p in parts for b in source.read_queue_file(p, spec)]

    nat, num = _both(read, monkeypatch)
    _same(nat, num)
    assert sum(b.num_rows for b in nat) == 300


def test_spark_dataframe_equals_the_engine_rows(spark: Any, varied_store: Path) -> None:
    """The DataFrame (native in the workers, or numpy under RMQ_EVENTSTORE_PURE=1) holds the engine's rows."""
    from spark_rows import normalise

    df = spark.read.format("rocketmq").option("splitSize", str(SEGMENT // 3)).load(str(varied_store))
    got = sorted((normalise(r.asDict()) for r in df.collect()), key=lambda r: r["commit_log_offset"])
    assert got == by_offset(engine_rows(varied_store))


def test_damaged_bytes_decode_alike(varied_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bytes overwritten in a segment: both decoders keep the same rows and stop at the same place."""
    if not decode.NATIVE:
        pytest.skip("the C scan is not active")
    first = sorted(os.listdir(varied_store / "commitlog"))[0]
    clean = (varied_store / "commitlog" / first).read_bytes()[:200_000]
    rnd = random.Random(7)

    def scan(data: bytes) -> tuple[list[Any], tuple[Any, ...]]:
        a = np.frombuffer(data, dtype=np.uint8)
        st = decode.WalkState(0)
        out = []
        try:
            for d in decode.iter_batches(memoryview(data), a, 0, 0, len(a), None, True, st, max_rows=16):
                out.append((d.batch.to_pylist() if d.batch is not None else None, d.bad, d.crc_bad))
        except Exception as e:  # noqa: BLE001 - the exception itself is compared
            return out, ("raised", type(e).__name__)
        return out, (st.pos, st.reason)

    for _ in range(40):
        data = bytearray(clean)
        for _ in range(rnd.randrange(1, 4)):
            p = rnd.randrange(len(data) - 8)
            data[p:p + 4] = rnd.randbytes(4) if rnd.random() < 0.7 else b"\x00\x00\x00\x00"
        native = scan(bytes(data))
        with monkeypatch.context() as m:
            m.setattr(decode, "_native", None)
            numpy = scan(bytes(data))
        assert native == numpy
