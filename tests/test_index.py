"""IndexFile / IndexService (spec §7): RocketMQ's IndexFileTest, byte layout, batched == sequential puts,
roll-over, queries across files, expiry, recovery after an abnormal exit and read-only mode."""

from __future__ import annotations

import hashlib
import os
import random
import re
import struct
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common.codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    DispatchRequest,
    index_key_hash,
    java_string_hash,
)
from rmq_eventstore.store.index import (
    INDEX_ENTRY_DTYPE,
    IndexFile,
    IndexReadOnlyError,
    IndexService,
    index_file_size,
    index_key_hashes,
    time_millis_to_human_string,
)
from rmq_eventstore.store.mapped_file import StoreLoadError

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
FAR = 2**62


@pytest.fixture
def tz_shanghai():
    old = os.environ.get("TZ")
    os.environ["TZ"] = "CST-8"  # POSIX form of UTC+8, no tzdata needed
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def req(offset: int, ts: int, keys: str | None = None, uniq: str | None = None, topic: str = "T",
        sys_flag: int = 0) -> DispatchRequest:
    return DispatchRequest(topic, 0, offset, 100, 0, ts, 0, keys, uniq, sys_flag, 0, "")


def entry(path: str, slots: int, i: int) -> tuple[int, int, int, int]:
    with open(path, "rb") as fh:
        fh.seek(40 + slots * 4 + i * 20)
        return ENTRY.unpack(fh.read(20))


def header(path: str) -> tuple[int, ...]:
    with open(path, "rb") as fh:
        return HEADER.unpack(fh.read(40))


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


# -- RocketMQ's ST/index/IndexFileTest ---------------------------------------------------------------
def test_put_key_399_of_400(tmp_path):
    f = IndexFile(str(tmp_path / "100"), 100, 400, 0, 0)
    now = int(time.time() * 1000)
    for i in range(399):
        assert f.put_key(str(i), i, now)
    assert not f.put_key("400", 400, now)
    assert f.is_write_full() and f.index_count == 400 and f.entry_count == 399
    f.destroy()
    assert not (tmp_path / "100").exists()


def test_select_phy_offset(tmp_path):
    f = IndexFile(str(tmp_path / "200"), 100, 400, 0, 0)
    now = int(time.time() * 1000)
    for i in range(399):
        assert f.put_key(str(i), i, now)
    assert not f.put_key("400", 400, now)
    assert f.select_phy_offsets("60", 10, 0, 2**63 - 1) == [60]
    f.destroy()


# -- byte layout -----------------------------------------------------------------------------------
def test_tiny_file_layout(tmp_path):
    # "Aa" and "BB" share hashCode 2112 (slot 0 of 4); "a" is 97 (slot 1).
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    p = str(tmp_path / "f")
    f = IndexFile(p, 4, 4)
    assert os.path.getsize(p) == index_file_size(4, 4) == 136
    assert f.index_count == 1 and header(p) == (0, 0, 0, 0, 0, 0)
    assert f.put_key("Aa", 100, 5000)
    assert f.put_key("BB", 200, 7500)
    assert f.put_key("a", 300, 9999)
    assert not f.put_key("zz", 400, 10000)
    assert header(p) == (5000, 9999, 100, 300, 2, 4)
    with open(p, "rb") as fh:
        raw = fh.read()
    assert struct.unpack_from(">4i", raw, 40) == (2, 3, 0, 0)
    assert entry(p, 4, 0) == (0, 0, 0, 0)
    assert entry(p, 4, 1) == (2112, 100, 0, 0)  # first entry: begin was 0 → timeDiff 0
    assert entry(p, 4, 2) == (2112, 200, 2, 1)  # (7500 - 5000) / 1000, chained to entry 1
    assert entry(p, 4, 3) == (97, 300, 4, 0)
    # a hash match, not a key match: "BB" returns both entries of the chain, newest first
    assert f.select_phy_offsets("BB", 10, 0, FAR) == [200, 100]
    assert f.select_phy_offsets("BB", 1, 0, FAR) == [200]
    assert f.select_phy_offsets("b", 10, 0, FAR) == []
    # time filter: entry 2 reads as 5000 + 2000 = 7000, entry 1 as 5000
    assert f.select_phy_offsets("Aa", 10, 6000, 8000) == [200]
    f.flush()
    f.close()
    g = IndexFile(p, 4, 4, read_only=True)
    assert (g.begin_timestamp, g.end_timestamp, g.begin_phy_offset, g.end_phy_offset) == (5000, 9999, 100, 300)
    assert g.hash_slot_count == 2 and g.index_count == 4 and g.is_write_full()
    g.close()


def test_rolled_file_initialisation_and_first_entry_quirk(tmp_path):
    p = str(tmp_path / "f")
    f = IndexFile(p, 4, 8, end_phy_offset=50, end_timestamp=1000)
    # only the four setters wrote: counts stay 0 on disk, 1 in memory
    assert header(p) == (1000, 1000, 50, 50, 0, 0)
    assert f.index_count == 1 and f.is_time_matched(1000, 1000)
    f.put_key("a", 60, 4500)
    # timeDiff of the first entry is computed against the inherited beginTimestamp (quirk)
    assert entry(p, 4, 1) == (97, 60, 3, 0)
    assert header(p) == (4500, 4500, 60, 60, 1, 2)
    # so it reads back as 4500 + 3000
    assert f.select_phy_offsets("a", 10, 7500, 7500) == [60]
    assert f.select_phy_offsets("a", 10, 4500, 4500) == []
    f.close()


def test_time_diff_caps_and_loader_index_count(tmp_path):
    p = str(tmp_path / "f")
    f = IndexFile(p, 8, 8)
    f.put_key("a", 1, 1000)
    f.put_key("b", 2, 500)  # before begin → 0
    f.put_key("c", 3, 1000 + (2**31) * 1000 + 5000)  # capped at Integer.MAX_VALUE
    assert entry(p, 8, 2)[2] == 0
    assert entry(p, 8, 3)[2] == 2**31 - 1
    f.close()
    q = str(tmp_path / "g")
    with open(q, "wb") as fh:
        fh.write(HEADER.pack(1, 2, 3, 4, 0, -5))
        fh.truncate(index_file_size(8, 8))
    g = IndexFile(q, 8, 8)
    assert g.index_count == 1 and g.begin_timestamp == 1 and os.path.getsize(q) == index_file_size(8, 8)
    g.close()
    # A file of another size (another geometry, or damage) is refused, never extended or reinterpreted.
    short = str(tmp_path / "short")
    with open(short, "wb") as fh:
        fh.write(HEADER.pack(1, 2, 3, 4, 0, -5))
    with pytest.raises(StoreLoadError, match="written with"):
        IndexFile(short, 8, 8)
    assert os.path.getsize(short) == HEADER.size


def test_slot_value_beyond_index_count_is_ignored(tmp_path):
    p = str(tmp_path / "f")
    f = IndexFile(p, 4, 8)
    with open(p, "r+b") as fh:  # garbage in slot 1 (hash of "a" is 97 → slot 1)
        fh.seek(44)
        fh.write(struct.pack(">i", 7))
    f.put_key("a", 10, 1000)
    assert entry(p, 4, 1)[3] == 0 and f.hash_slot_count == 1
    f.close()


# -- batched == sequential ---------------------------------------------------------------------------
_KEY_ALPHABET = "AaBb#Tc0\u00e9\U0001f600"


@st.composite
def _index_scenarios(draw):
    slots = draw(st.integers(1, 9))
    index_num = draw(st.integers(2, 40))
    ts_strategy = st.one_of(st.integers(-3000, 10**13), st.integers(-(2**63), 2**63 - 1),
                            st.sampled_from([0, 1, 999, 1000, 1001]))
    init_phy = draw(st.sampled_from([0, 0, 17, 2**40]))
    init_ts = draw(st.one_of(st.just(0), ts_strategy))
    garbage = draw(st.lists(st.tuples(st.integers(0, slots - 1), st.integers(-3, index_num + 3)), max_size=4))
    n = draw(st.integers(0, 60))
    keys = draw(st.lists(st.text(_KEY_ALPHABET, max_size=5), min_size=n, max_size=n))
    phys = draw(st.lists(st.integers(0, 2**50), min_size=n, max_size=n))
    tss = draw(st.lists(ts_strategy, min_size=n, max_size=n))
    prefix = draw(st.integers(0, n))
    cuts = sorted(draw(st.lists(st.integers(prefix, n), max_size=3)))
    return slots, index_num, init_phy, init_ts, garbage, keys, phys, tss, prefix, cuts


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_index_scenarios())
def test_put_keys_matches_put_key_bytes(scenario):
    slots, index_num, init_phy, init_ts, garbage, keys, phys, tss, prefix, cuts = scenario
    with tempfile.TemporaryDirectory() as d:
        files = []
        for name in ("seq", "bat"):
            f = IndexFile(os.path.join(d, name), slots, index_num, init_phy, init_ts)
            for s, v in garbage:
                struct.pack_into(">i", f.mm, 40 + s * 4, v)
            files.append(f)
        seq, bat = files
        ok_seq = sum(seq.put_key(k, p, t) for k, p, t in zip(keys, phys, tss, strict=True))
        # the batched file: a few sequential puts first, then batches split at `cuts`
        ok_bat = sum(bat.put_key(k, p, t) for k, p, t in zip(keys[:prefix], phys[:prefix], tss[:prefix],
                                                              strict=True))
        hashes = index_key_hashes(keys)
        assert hashes.tolist() == [index_key_hash(k) for k in keys]
        bounds = [prefix, *cuts, len(keys)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            ok_bat += bat.put_keys(hashes[a:b], np.asarray(phys[a:b], dtype=np.int64),
                                   np.asarray(tss[a:b], dtype=np.int64))
        assert ok_bat == ok_seq == min(len(keys), index_num - 1)
        assert bytes(seq.mm) == bytes(bat.mm)
        for attr in ("begin_timestamp", "end_timestamp", "begin_phy_offset", "end_phy_offset",
                     "hash_slot_count", "index_count"):
            assert getattr(seq, attr) == getattr(bat, attr), attr
        for f in files:
            f.close()


def test_put_keys_structured_entries(tmp_path):
    f = IndexFile(str(tmp_path / "f"), 5, 10)  # "Aa"/"BB" → slot 2112 % 5 = 2, "x" → 120 % 5 = 0
    n = f.put_keys(index_key_hashes(["Aa", "BB", "x", "Aa"]), np.array([1, 2, 3, 4]),
                   np.array([1000, 2000, 3000, 4000]))
    assert n == 4
    e = np.frombuffer(bytes(f.mm), dtype=INDEX_ENTRY_DTYPE, count=5, offset=40 + 20)
    assert e["prev"].tolist() == [0, 0, 1, 0, 2]
    assert e["t"].tolist() == [0, 0, 1, 2, 3]
    assert f.hash_slot_count == 2
    f.close()


# -- IndexService ------------------------------------------------------------------------------------
def test_index_file_name_local_time(tz_shanghai):
    assert time_millis_to_human_string(1699971200123) == "20231114221320123"


def test_roll_over_names_and_initialisation(tmp_path, tz_shanghai):
    full: list[int] = []
    clock = Clock(1699971200123)
    svc = IndexService(str(tmp_path / "index"), 4, 5, on_index_file_full=full.append,
                       flush_in_background=False, clock=clock)
    # 3 keys per message (uniq + 2 KEYS tokens), 4 entries per file
    reqs = [req(100 * i, 10_000 + 1000 * i, keys=f"k{i} j{i}", uniq=f"U{i}") for i in range(1, 5)]
    assert svc.build_index(reqs) == 12
    files = svc.files
    assert len(files) == 3
    names = [f.file_name for f in files]
    assert names == ["20231114221320123", "20231114221320124", "20231114221320125"]  # same ms: bumped
    assert all(re.fullmatch(r"\d{17}", n) for n in names)
    assert [f.entry_count for f in files] == [4, 4, 4]
    # message 2's keys straddle files 1 and 2
    assert (files[0].begin_phy_offset, files[0].end_phy_offset) == (100, 200)
    assert (files[1].begin_phy_offset, files[1].end_phy_offset) == (200, 300)
    assert (files[2].begin_phy_offset, files[2].end_phy_offset) == (300, 400)
    assert full == [files[0].end_timestamp, files[1].end_timestamp] == [12_000, 13_000]
    # full files were flushed: their header on disk is complete
    assert header(files[0].path) == (11_000, 12_000, 100, 200, files[0].hash_slot_count, 5)
    # the next dispatch (even without keys) opens a new file initialised from the last one's end
    clock.ms += 5000
    assert svc.build_index([req(500, 15_000)]) == 0
    last = svc.files[-1]
    assert last.file_name == "20231114221325123"
    assert header(last.path) == (14_000, 14_000, 400, 400, 0, 0)
    assert svc.build_index([req(600, 16_000, keys="z")]) == 1
    # first-entry quirk: timeDiff against the inherited 14 000 → 2 s
    assert entry(last.path, 4, 1)[2] == 2
    assert svc.get_total_entries() == 13
    svc.shutdown()


def test_build_index_skip_rules(tmp_path):
    svc = IndexService(str(tmp_path), 16, 100)
    assert svc.build_index([
        req(100, 1000, keys="a"),
        req(200, 2000, keys="rb", sys_flag=TRANSACTION_ROLLBACK_TYPE),
        req(300, 3000, keys="pr", sys_flag=TRANSACTION_PREPARED_TYPE),
        req(400, 4000, keys="cm", sys_flag=TRANSACTION_COMMIT_TYPE),
        req(350, 5000, keys="late"),  # below endPhyOffset 400 → already indexed
        req(500, 6000, keys="  sp  x ", uniq=""),  # empty tokens skipped; empty uniq key still indexed
    ]) == 6
    q = svc.query_offset
    assert q("T", "a", 10, 0, FAR).phy_offsets == [100]
    assert q("T", "rb", 10, 0, FAR).phy_offsets == []
    assert q("T", "pr", 10, 0, FAR).phy_offsets == [300]
    assert q("T", "cm", 10, 0, FAR).phy_offsets == [400]
    assert q("T", "late", 10, 0, FAR).phy_offsets == []
    assert q("T", "sp", 10, 0, FAR).phy_offsets == [500]
    assert q("T", "", 10, 0, FAR).phy_offsets == [500]
    # re-dispatch after recovery: everything below the last endPhyOffset is skipped, the last one is not
    assert svc.build_index([req(100, 1000, keys="a"), req(500, 6000, keys="x")]) == 1
    r = q("T", "x", 10, 0, FAR)
    assert r == (r.phy_offsets, 6000, 500) and r.phy_offsets == [500, 500]
    svc.shutdown()


def test_hash_collision_returns_both(tmp_path):
    # "Aa".hashCode() == "BB".hashCode(), so "AaTopic#BB" and "BBTopic#Aa" are the same index key
    assert java_string_hash("AaTopic#BB") == java_string_hash("BBTopic#Aa")
    svc = IndexService(str(tmp_path), 1000, 100)
    svc.build_index([req(0, 1000, keys="BB", topic="AaTopic"), req(90, 2000, keys="Aa", topic="BBTopic")])
    assert sorted(svc.query_offset("AaTopic", "BB", 32, 0, FAR).phy_offsets) == [0, 90]
    assert sorted(svc.query_offset("BBTopic", "Aa", 32, 0, FAR).phy_offsets) == [0, 90]
    svc.shutdown()


def _three_period_service(path: str) -> IndexService:
    # files of 10 entries: [1..10] t=1000s.., [11..20], [21..30]; key "k" in every message
    svc = IndexService(path, 8, 11, flush_in_background=False)
    reqs = [req(i * 10, i * 1_000_000, keys="k") for i in range(1, 31)]
    svc.build_index(reqs)
    assert len(svc.files) == 3
    return svc


def test_query_across_files_with_time_ranges(tmp_path):
    svc = _three_period_service(str(tmp_path))
    f1, f2, f3 = svc.files
    assert (f1.begin_timestamp, f1.end_timestamp) == (1_000_000, 10_000_000)
    r = svc.query_offset("T", "k", 64, 0, FAR)
    assert r.phy_offsets == [i * 10 for i in range(30, 0, -1)]  # newest file first, newest entry first
    assert (r.index_last_update_timestamp, r.index_last_update_phyoffset) == (30_000_000, 300)
    # a window inside the middle file: the walk stops after it (its begin < begin). Offset 110 is the
    # file's first entry, whose timeDiff was taken against the inherited begin (10 000 000), so it
    # reads back as 11 000 000 + 1000 s = 12 000 000 and falls inside the window (RocketMQ does the same)
    r = svc.query_offset("T", "k", 64, 12_000_000, 15_000_000)
    assert r.phy_offsets == [150, 140, 130, 120, 110]
    # spans files 2 and 3
    r = svc.query_offset("T", "k", 64, 19_000_000, 22_000_000)
    assert r.phy_offsets == [220, 210, 200, 190]
    # nothing matches in time
    assert svc.query_offset("T", "k", 64, 40_000_000, 50_000_000).phy_offsets == []
    svc.shutdown()


def test_have_candidates_answers_as_query_offset_does_over_every_file(tmp_path):
    """`have_candidates` is whether `query_offset` over all time would return anything: a key in the oldest
    of three files, a key only in the newest, a missing key, and a hash collision (a candidate too)."""
    svc = _three_period_service(str(tmp_path))
    svc.build_index([req(400, 31_000_000, keys="late")])
    pairs = [("T", "k"), ("T", "late"), ("T", "absent"), ("U", "k")]
    assert svc.have_candidates(pairs) == [bool(svc.query_offset(t, k, 64, 0, FAR).phy_offsets) for t, k in pairs]
    assert svc.have_candidates(pairs) == [True, True, False, False]
    assert svc.have_candidates([]) == []
    svc.shutdown()
    svc = IndexService(str(tmp_path / "collide"), 1000, 100)
    svc.build_index([req(0, 1000, keys="BB", topic="AaTopic")])
    assert svc.have_candidates([("BBTopic", "Aa"), ("AaTopic", "BB"), ("AaTopic", "Ab")]) == [True, True, False]
    svc.shutdown()


def test_query_max_results(tmp_path):
    svc = IndexService(str(tmp_path), 8, 50, flush_in_background=False)
    svc.build_index([req(i, 1000 + i, keys="k") for i in range(200)])
    assert len(svc.files) == 5
    assert svc.query_offset("T", "k", 10, 0, FAR).phy_offsets == list(range(199, 189, -1))
    assert len(svc.query_offset("T", "k", 1000, 0, FAR).phy_offsets) == 64  # maxMsgsNumBatch
    assert len(svc.query_offset("T", "k", 0, 0, FAR).phy_offsets) == 0
    svc.shutdown()


def test_delete_expired_file(tmp_path):
    svc = _three_period_service(str(tmp_path))
    f1, f2, f3 = svc.files
    assert (f1.end_phy_offset, f2.end_phy_offset, f3.end_phy_offset) == (100, 200, 300)
    assert svc.delete_expired_file(100) == 0  # first file's end is not below the min offset
    assert svc.delete_expired_file(101) == 1
    assert not os.path.exists(f1.path) and svc.files == [f2, f3]
    assert svc.delete_expired_file(10**9) == 1  # never the last file
    assert svc.files == [f3] and os.path.exists(f3.path)
    assert svc.delete_expired_file(10**9) == 0
    assert svc.query_offset("T", "k", 64, 0, FAR).phy_offsets == [i * 10 for i in range(30, 20, -1)]
    svc.shutdown()


def test_delete_expired_file_stops_at_first_unexpired(tmp_path):
    svc = IndexService(str(tmp_path), 8, 3, flush_in_background=False)
    for offs in ([10, 20], [30, 40], [50, 60], [70, 80]):
        svc.build_index([req(o, o, keys="k") for o in offs])
    assert [f.end_phy_offset for f in svc.files] == [20, 40, 60, 80]
    svc.files[1]._end_phy_offset = 1000  # a file still needed sits between two expired ones
    assert svc.delete_expired_file(100) == 1  # the walk stops there: file 3 stays although it is expired
    assert [f.end_phy_offset for f in svc.files] == [1000, 60, 80]
    svc.shutdown()


def test_load_after_abnormal_exit_deletes_newer_files(tmp_path):
    full: list[int] = []
    path = str(tmp_path)
    svc = IndexService(path, 8, 11, on_index_file_full=full.append, flush_in_background=False)
    svc.build_index([req(i * 10, i * 1000, keys="k") for i in range(1, 36)])
    assert len(svc.files) == 4 and full == [10_000, 20_000, 30_000]
    names = [f.file_name for f in svc.files]
    svc.shutdown()
    # normal restart keeps everything
    svc = IndexService(path, 8, 11)
    assert svc.load(True, 0)
    assert [f.file_name for f in svc.files] == names and svc.get_total_entries() == 35
    svc.shutdown()
    # the checkpoint saw only the first full file: files 2..4 end later and are deleted
    svc = IndexService(path, 8, 11)
    assert svc.load(False, full[0])
    assert [f.file_name for f in svc.files] == names[:1]
    assert sorted(os.listdir(path)) == names[:1]
    # indexing resumes: offsets up to the first file's end are skipped, later ones indexed
    assert svc.build_index([req(i * 10, i * 1000, keys="k") for i in range(1, 36)]) == 26  # 100 again
    assert svc.query_offset("T", "k", 64, 0, FAR).phy_offsets[:3] == [350, 340, 330]
    svc.shutdown()


def test_load_ignores_foreign_names(tmp_path):
    (tmp_path / "notes.txt").write_bytes(b"x")
    svc = IndexService(str(tmp_path), 8, 11)
    svc.load(True)
    assert svc.files == []


def test_read_only_mode(tmp_path):
    path = str(tmp_path)
    w = IndexService(path, 8, 11, flush_in_background=False)
    w.build_index([req(i * 10, i * 1000, keys="k") for i in range(1, 16)])
    w.flush()
    digest = {n: hashlib.sha256((tmp_path / n).read_bytes()).digest() for n in os.listdir(path)}
    r = IndexService(path, 8, 11, read_only=True)
    r.load(False, 0)  # abnormal exit + read-only: nothing is deleted
    assert len(r.files) == 2
    assert r.query_offset("T", "k", 64, 0, FAR).phy_offsets == [i * 10 for i in range(15, 0, -1)]
    with pytest.raises(IndexReadOnlyError):
        r.build_index([req(1000, 1000, keys="k")])
    with pytest.raises(IndexReadOnlyError):
        r.files[0].put_key("k", 1, 1)
    with pytest.raises(IndexReadOnlyError):
        r.delete_expired_file(10**9)
    r.flush()
    assert {n: hashlib.sha256((tmp_path / n).read_bytes()).digest() for n in os.listdir(path)} == digest
    # the writer goes on and rolls into a third file; the reader picks it up
    w.build_index([req(i * 10, i * 1000, keys="k") for i in range(16, 26)])
    r.refresh_read_only()
    assert len(r.files) == 3
    assert r.query_offset("T", "k", 64, 0, FAR).phy_offsets == [i * 10 for i in range(25, 0, -1)]
    # the writer deletes the old files; the reader drops them
    assert w.delete_expired_file(10**9) == 2
    r.refresh_read_only()
    assert len(r.files) == 1
    assert r.query_offset("T", "k", 64, 0, FAR).phy_offsets == [i * 10 for i in range(25, 20, -1)]
    r.shutdown()
    w.shutdown()


def test_read_only_never_writes(tmp_path):
    p = str(tmp_path / "20240101000000000")
    f = IndexFile(p, 8, 11)
    f.put_key("x", 5, 5000)
    f.close()
    before = (tmp_path / "20240101000000000").read_bytes()
    st_before = os.stat(p)
    r = IndexService(str(tmp_path), 8, 11, read_only=True)
    r.load(False, 0)
    assert r.query_offset("T", "x", 10, 0, FAR).phy_offsets == []  # key is T#x, not x
    assert r.files[0].select_phy_offsets("x", 10, 0, FAR) == [5]
    r.flush()
    r.shutdown()
    assert (tmp_path / "20240101000000000").read_bytes() == before
    assert os.stat(p).st_mtime_ns == st_before.st_mtime_ns


def test_read_only_short_file(tmp_path):
    p = tmp_path / "20240101000000000"
    p.write_bytes(HEADER.pack(1000, 2000, 1, 2, 1, 2) + b"\0" * 10)  # truncated copy
    f = IndexFile(str(p), 8, 11, read_only=True)
    assert f.index_count == 2 and f.mapped_size == 50
    assert f.select_phy_offsets("x", 10, 0, FAR) == []
    f.close()


def test_200k_keys_lookup(tmp_path):
    n = 200_000
    svc = IndexService(str(tmp_path), 100_000, n + 1, flush_in_background=False)
    base = 1_700_000_000_000
    for start in range(0, n, 2000):
        svc.build_index([req(i * 64, base + i, uniq=f"key-{i:08d}-uniq-message-id-padding") for i in
                         range(start, start + 2000)])
    assert len(svc.files) == 1 and svc.files[0].entry_count == n and svc.files[0].is_write_full()
    rnd = random.Random(7)
    for i in rnd.sample(range(n), 200):
        r = svc.query_offset("T", f"key-{i:08d}-uniq-message-id-padding", 64, base + i - 1000, base + i + 1000)
        assert i * 64 in r.phy_offsets
    svc.shutdown()


def test_short_passes_without_arrays_leave_the_same_bytes(tmp_path, monkeypatch):
    """`build_index` of a short pass (up to 16 records) hands the native key loop's bytes straight to the
    entry loop (`IndexFile.put_keys_raw`); the array path (`put_keys`) must leave the same files: random
    keys, rollbacks, re-dispatched records below the end offset, and files filling up mid-pass."""
    from rmq_eventstore.common import codec
    from rmq_eventstore.store import index as index_module

    if codec.native is None:
        pytest.skip("the raw path is the native core's")
    rng = random.Random(7)
    passes = []
    off = 100
    for _ in range(60):
        batch = []
        for _ in range(rng.randint(1, 16)):
            flag = rng.choice([0, 0, 0, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE])
            keys = " ".join(f"k{rng.randint(0, 50)}" for _ in range(rng.randint(0, 3))) or None
            batch.append(req(off, 1_000 + off // 10, keys=keys, uniq=f"U{off}", sys_flag=flag))
            off += 100
        if rng.random() < 0.2:
            batch.insert(0, req(off - 300, 1_000, keys="again"))  # below the end offset: skipped
        passes.append(batch)

    def build(root, raw_max):
        monkeypatch.setattr(index_module, "_RAW_MAX", raw_max)
        svc = IndexService(str(root), 8, 40, flush_in_background=False, clock=Clock(1_700_000_000_000))
        counts = [svc.build_index(b) for b in passes]
        svc.flush()
        names = [f.file_name for f in svc.files]
        svc.shutdown()
        return counts, {n: (root / n).read_bytes() for n in names}

    raw = build(tmp_path / "raw", 16)
    arrays = build(tmp_path / "arrays", 0)
    assert raw[0] == arrays[0]
    assert len(raw[1]) > 3  # several files filled up
    assert raw[1] == arrays[1]
