"""`verify`'s C loops (`_native.verify_*`, issue 16) against its pure-Python path: the same report, problem
for problem and in the same order, on intact and damaged stores (store/repair.py hands every item the C
loops do not pass to the Python reference checks, so the findings are the reference's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.store import Message, repair
from rmq_eventstore.store.repair import commit_log_size, verify

sys.path.insert(0, os.path.dirname(__file__))
from test_recovery import BODY_HEADER_V4, TOPIC, flip, patch, segment  # noqa: E402

N = 500  # records of ~330 bytes: three 64 KiB commitlog files
native_only = pytest.mark.skipif(not hasattr(codec.native, "verify_scan"), reason="the native core is not active")


def make_store(open_store, n: int = N, **config) -> list:
    store = open_store(**config)
    out = []
    for i in range(n):
        r = store.put_message(Message(topic=TOPIC, body=(b"%d-" % i) * 50, queue_id=i % 3, keys=[f"k{i}", f"x{i}"],
                                      tags=f"tag{i % 3}"))
        assert r.is_ok(), r
        out.append(r.append_result)
    store.shutdown()
    return out


def both(store_path: Path, monkeypatch: pytest.MonkeyPatch, reference_calls: list[int] | None = None) -> dict:
    """verify's report on the native path (units and index entries checked beside the walk), on the native
    path with separate unit and index passes (as beside a live writer) and on the pure-Python one (asserted
    equal); `reference_calls` gets how many records the first run handed to the reference check
    (`repair._check_record`)."""
    calls = [0]
    check = repair._check_record

    def counted(*a, **k):
        calls[0] += 1
        return check(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(repair, "_check_record", counted)
        native = verify(store_path).as_dict()
    if reference_calls is not None:
        reference_calls.append(calls[0])
    with monkeypatch.context() as m:
        m.setattr(repair, "_index_fusion", lambda *a: None)
        m.setattr(repair, "_queue_fusion", lambda *a: None)
        assert verify(store_path).as_dict() == native
    with monkeypatch.context() as m:
        m.setattr(codec, "native", None)
        pure = verify(store_path).as_dict()
    assert native == pure
    return native


def cq_file(store_path: Path, qid: int) -> Path:
    return sorted((store_path / "consumequeue" / TOPIC / str(qid)).iterdir())[0]


def index_file(store_path: Path) -> Path:
    return sorted((store_path / "index").iterdir())[0]


def entry_pos(i: int) -> int:
    return 40 + 1024 * 4 + i * 20  # the small geometry's 1024 hash slots


def kinds(report: dict) -> list[str]:
    return sorted({p["kind"] for p in report["problems"]})


def test_intact_store(open_store, store_path, monkeypatch):
    make_store(open_store)
    calls: list[int] = []
    r = both(store_path, monkeypatch, calls)
    assert r["ok"] and r["records"] == N and r["units"] == N and r["index_entries"] == 3 * N
    if hasattr(codec.native, "verify_scan"):
        assert calls == [0]  # the C loops passed every unit and entry themselves


def test_bad_body_crc(open_store, store_path, small_geometry, monkeypatch):
    results = make_store(open_store)
    size = small_geometry["mapped_file_size_commit_log"]
    for bad in (results[10], results[250]):
        flip(segment(store_path, bad.wrote_offset, size), bad.wrote_offset % size + BODY_HEADER_V4 + 9)
    r = both(store_path, monkeypatch)
    assert r["records"] == N  # a record whose lengths are intact is skipped, the walk goes on
    assert kinds(r) == ["commitlog_record", "cq_unit", "index_entry"]
    assert sum(p["detail"] == "body CRC mismatch" for p in r["problems"]) == 2
    assert {p["offset"] for p in r["problems"]} == {results[10].wrote_offset, results[250].wrote_offset}


def test_torn_last_record_and_bytes_after_the_end(open_store, store_path, small_geometry, monkeypatch):
    results = make_store(open_store)
    size = small_geometry["mapped_file_size_commit_log"]
    last = results[-1]
    path = segment(store_path, last.wrote_offset, size)
    half = last.wrote_offset % size + last.wrote_bytes // 2
    patch(path, half, bytes(last.wrote_bytes - last.wrote_bytes // 2))  # the copy cut off halfway
    r = both(store_path, monkeypatch)
    assert r["commit_log_end"] == last.wrote_offset and r["records"] == N - 1
    assert any(p["kind"] == "cq_unit" and "past the commitlog end" in p["detail"] for p in r["problems"])
    # garbage after a zeroed end of the log
    patch(path, last.wrote_offset % size, bytes(last.wrote_bytes))
    patch(path, last.wrote_offset % size + 64, b"junk")
    r = both(store_path, monkeypatch)
    assert {"kind": "commitlog_tail", "where": path.name, "offset": last.wrote_offset,
            "detail": "bytes after the end of the log"} in r["problems"]


def test_zeroed_record_in_an_earlier_file(open_store, store_path, small_geometry, monkeypatch):
    results = make_store(open_store)
    size = small_geometry["mapped_file_size_commit_log"]
    bad = results[100]
    assert bad.wrote_offset < size  # the first file
    patch(segment(store_path, bad.wrote_offset, size), bad.wrote_offset % size, bytes(bad.wrote_bytes))
    r = both(store_path, monkeypatch)
    assert {"kind": "commitlog_hole", "where": f"{0:020d}", "offset": bad.wrote_offset,
            "detail": "zeroed space before the end of a segment that is not the last one"} in r["problems"]
    assert "cq_unit" in kinds(r) and "index_entry" in kinds(r)


def test_damaged_record_structure(open_store, store_path, small_geometry, monkeypatch):
    results = make_store(open_store)
    size = small_geometry["mapped_file_size_commit_log"]
    bad = results[300]
    path = segment(store_path, bad.wrote_offset, size)
    patch(path, bad.wrote_offset % size + 4, b"\x12\x34\x56\x78")  # magic code
    r = both(store_path, monkeypatch)
    assert any(p["detail"] == "illegal magic code 0x12345678" for p in r["problems"])


def test_consume_queue_units_pointing_nowhere_or_wrong(open_store, store_path, monkeypatch):
    results = make_store(open_store)
    q0 = cq_file(store_path, 0)
    data = q0.read_bytes()

    def unit(k: int) -> tuple[int, int, int]:
        return (int.from_bytes(data[k * 20:k * 20 + 8], "big"), int.from_bytes(data[k * 20 + 8:k * 20 + 12], "big"),
                int.from_bytes(data[k * 20 + 12:k * 20 + 20], "big"))

    off, size, tags = unit(5)
    patch(q0, 5 * 20, (off + 7).to_bytes(8, "big"))  # into the middle of a record
    patch(q0, 6 * 20, (results[-1].wrote_offset + 10**6).to_bytes(8, "big"))  # past the end
    patch(q0, 7 * 20 + 8, (unit(7)[1] + 1).to_bytes(4, "big"))  # a size that is not the record's
    patch(q0, 8 * 20 + 12, (unit(8)[2] + 1).to_bytes(8, "big"))  # tags code
    patch(q0, 9 * 20, data[10 * 20:11 * 20])  # the record of the next unit
    patch(q0, 20 * 20, (0).to_bytes(8, "big") + (0x7FFFFFFF).to_bytes(4, "big") + bytes(8))  # a blank fill unit
    r = both(store_path, monkeypatch)
    details = [p["detail"] for p in r["problems"] if p["kind"] == "cq_unit"]
    assert len(details) == 5, r["problems"]
    assert details[1] == f"unit 6 points past the commitlog end {r['commit_log_end']}"
    assert details[3].startswith("unit 8: tags code ")
    assert "cq_missing" in kinds(r)  # the blank unit: the queue holds one unit fewer than its records


def test_index_entries_wrong(open_store, store_path, monkeypatch):
    make_store(open_store)
    idx = index_file(store_path)
    data = idx.read_bytes()
    for i, (dh, dp) in {3: (0, 1), 4: (1, 0), 5: (0, 10**9), 6: (0, -1)}.items():
        e = bytearray(data[entry_pos(i):entry_pos(i) + 20])
        h, phy = int.from_bytes(e[0:4], "big", signed=True), int.from_bytes(e[4:12], "big", signed=True)
        e[0:4] = ((h + dh) & 0x7FFFFFFF).to_bytes(4, "big")
        e[4:12] = (phy + dp).to_bytes(8, "big", signed=True)
        patch(idx, entry_pos(i), bytes(e))
    r = both(store_path, monkeypatch)
    assert kinds(r) == ["index_entry"] and r["problem_count"] == 4, r["problems"]
    assert any("is none of the record's keys" in p["detail"] for p in r["problems"])
    assert any("past the commitlog end" in p["detail"] for p in r["problems"])


def test_crc_trailers(open_store, store_path, small_geometry, monkeypatch):
    results = make_store(open_store, 200, enabled_append_prop_crc=True)
    assert both(store_path, monkeypatch)["ok"]
    size = small_geometry["mapped_file_size_commit_log"]
    a, b = results[20], results[120]
    flip(segment(store_path, a.wrote_offset, size), a.wrote_offset % size + 56)  # the store timestamp
    path = segment(store_path, b.wrote_offset, size)
    end = b.wrote_offset % size + b.wrote_bytes
    patch(path, end - 5, b"x")  # a digit of the trailer
    r = both(store_path, monkeypatch)
    assert [p["offset"] for p in r["problems"] if p["kind"] == "commitlog_record"] == [a.wrote_offset,
                                                                                       b.wrote_offset]


def test_non_ascii_keys_and_tags_go_to_the_reference(open_store, store_path, monkeypatch):
    store = open_store()
    for i in range(60):
        store.put_message(Message(topic=TOPIC, body=b"b%d" % i, queue_id=i % 2, keys=[f"ключ{i}", f"k{i}"],
                                  tags="标签" if i % 2 else "t"))
    store.shutdown()
    r = both(store_path, monkeypatch)
    assert r["ok"] and r["index_entries"] == 180
    idx = index_file(store_path)
    e = bytearray(idx.read_bytes()[entry_pos(1):entry_pos(1) + 20])
    e[0:4] = (int.from_bytes(e[0:4], "big") ^ 1).to_bytes(4, "big")
    patch(idx, entry_pos(1), bytes(e))
    r = both(store_path, monkeypatch)
    assert r["problem_count"] == 1 and "is none of the record's keys" in r["problems"][0]["detail"]


def test_pure_env_gives_the_same_cli_report(open_store, store_path, small_geometry):
    results = make_store(open_store)
    size = small_geometry["mapped_file_size_commit_log"]
    flip(segment(store_path, results[42].wrote_offset, size), results[42].wrote_offset % size + BODY_HEADER_V4 + 3)
    out = {}
    for pure in ("0", "1"):
        env = {**os.environ, "RMQ_EVENTSTORE_PURE": pure}
        p = subprocess.run([sys.executable, "-m", "rmq_eventstore", "verify", str(store_path), "--json"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 1, p.stderr
        out[pure] = json.loads(p.stdout)
    # the record, its consume queue unit and its three index entries (UNIQ_KEY and two keys)
    assert out["0"] == out["1"] and out["0"]["problem_count"] == 5


@native_only
def test_verify_crc32_is_zlibs():
    data = os.urandom(5000)
    for n in [*range(0, 300), 1023, 1024, 1025, 4096, 5000]:
        for off in (0, 1, 5, 15):
            chunk = data[off:off + n]
            assert codec.native.verify_crc32(chunk) == zlib.crc32(chunk), (n, off)


def test_progress_covers_the_commitlog_on_both_paths(open_store, store_path, monkeypatch):
    make_store(open_store)
    for pure in (False, True):
        with monkeypatch.context() as m:
            if pure:
                m.setattr(codec, "native", None)
            seen: list[int] = []
            assert verify(store_path, seen.append).ok
            assert len(seen) > 3 and sum(seen) == commit_log_size(str(store_path))
