"""Recovery (spec §9, store/recovery.py): clean restarts without a scan, torn and bit-flipped tails,
damaged consume queue and index files rebuilt instead of failing the start (RocketMQ #10108), and a crash
right after a commitlog roll (RocketMQ #1434). The SIGKILL suite is tests/test_crash.py."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_eventstore.store import Message, MessageStore, PutMessageStatus, StoreLoadError
from rmq_eventstore.store.checkpoint import StoreCheckpoint
from rmq_eventstore.store.repair import verify

sys.path.insert(0, os.path.dirname(__file__))
from crash_child import CRASH_GEOMETRY  # noqa: E402
from test_crash import CHILD, _cq_units, _index_entries, _read_acks, check_store  # noqa: E402

TOPIC = "RecoveryTopic"
BODY_HEADER_V4 = 88


def put_n(store: MessageStore, n: int, start: int = 0, size: int = 200, queues: int = 2) -> list:
    out = []
    for i in range(start, start + n):
        r = store.put_message(Message(topic=TOPIC, body=(b"%d-" % i) * (size // 4), queue_id=i % queues,
                                      keys=[f"k{i}"], tags=f"tag{i % 3}"))
        assert r.status == PutMessageStatus.PUT_OK, r
        out.append(r.append_result)
    return out


def segment(store_path: Path, offset: int, file_size: int) -> Path:
    return store_path / "commitlog" / f"{offset - offset % file_size:020d}"


def patch(path: Path, pos: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, pos)
    finally:
        os.close(fd)


def flip(path: Path, pos: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, pos)[0] ^ 0x10]), pos)
    finally:
        os.close(fd)


def rebuilt_copy(store_path: Path, tmp: Path, config: dict) -> MessageStore:
    import shutil
    copy = tmp / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copytree(store_path / "commitlog", copy / "commitlog")
    return MessageStore.open(copy, **config)


def assert_equals_rebuild(store: MessageStore, store_path: Path, tmp: Path, config: dict) -> None:
    other = rebuilt_copy(store_path, tmp, config)
    try:
        assert other.get_max_phy_offset() == store.get_max_phy_offset()
        assert _cq_units(other) == _cq_units(store)
        assert _index_entries(other) == _index_entries(store)
    finally:
        other.shutdown()


# -- clean restart -----------------------------------------------------------------------------------------
def test_clean_restart_verifies_the_recorded_end_instead_of_scanning(open_store, store_path):
    store = open_store()
    put_n(store, 300)  # several 64 KiB segments
    end = store.get_max_phy_offset()
    store.shutdown()
    assert StoreCheckpoint(str(store_path / "checkpoint"), read_only=True).confirm_phy_offset == end
    store = open_store()
    rep = store.recovery_report
    assert rep.mode == "normal-fast" and rep.commit_log_end == end
    assert rep.bytes_scanned < 1024 and rep.records_dispatched == 0
    assert store.get_max_offset_in_queue(TOPIC, 0) == 150
    r = store.put_message(Message(topic=TOPIC, body=b"next", queue_id=0))
    assert (r.append_result.wrote_offset, r.append_result.logics_offset) == (end, 150)


def test_clean_restart_with_a_wrong_hint_falls_back_to_the_scan(open_store, store_path):
    """A checkpoint written by someone else (a Java broker writes the *start* of its last record) is
    not trusted: the walk from the queues' last record does not land on it, RocketMQ's scan runs."""
    store = open_store()
    results = put_n(store, 50)
    end = store.get_max_phy_offset()
    store.shutdown()
    cp = StoreCheckpoint(str(store_path / "checkpoint"))
    cp.confirm_phy_offset = results[-1].wrote_offset
    cp.shutdown()
    store = open_store()
    assert store.recovery_report.mode == "normal-scan"
    assert store.get_max_phy_offset() == end and store.get_max_offset_in_queue(TOPIC, 1) == 25


# -- torn and bit-flipped tails ----------------------------------------------------------------------------
@pytest.mark.parametrize("abort", [False, True], ids=["clean", "abort"])
@pytest.mark.parametrize("damage", ["zero-tail", "flip-body-end", "flip-body", "garbage-after-end",
                                    "cut-file"])
def test_torn_or_flipped_tail_is_detected_and_truncated(open_store, store_path, small_geometry, tmp_path,
                                                        damage, abort):
    store = open_store()
    results = put_n(store, 40)
    store.shutdown()
    size = small_geometry["mapped_file_size_commit_log"]
    last = results[-1]
    seg = segment(store_path, last.wrote_offset, size)
    pos = last.wrote_offset % size
    expect_end = last.wrote_offset
    if damage == "zero-tail":  # the last bytes written (from inside the body on) never reached the disk
        patch(seg, pos + BODY_HEADER_V4 + 50, bytes(last.wrote_bytes - BODY_HEADER_V4 - 50))
    elif damage == "flip-body-end":  # (the body CRC covers the body only, not topic and properties)
        flip(seg, pos + BODY_HEADER_V4 + 149)
    elif damage == "flip-body":
        flip(seg, pos + BODY_HEADER_V4 + 3)
    elif damage == "garbage-after-end":  # a half-written record after the last good one
        patch(seg, pos + last.wrote_bytes, struct.pack(">ii", 500, -626843481) + os.urandom(100))
        expect_end = last.wrote_offset + last.wrote_bytes
    else:  # the file itself lost its tail (cut inside the last record)
        os.truncate(seg, pos + BODY_HEADER_V4 + 20)
    if abort:
        (store_path / "abort").write_text("1")
    store = open_store()
    rep = store.recovery_report
    assert rep.mode == ("abnormal" if abort else "normal-scan")
    assert store.get_max_phy_offset() == expect_end
    if expect_end == last.wrote_offset:
        assert rep.damage_offset == last.wrote_offset or damage in ("zero-tail", "cut-file")
        assert store.get_max_offset_in_queue(TOPIC, 1) == 19
        assert store.query_message(TOPIC, "k39").messages == []
    assert [m.body for m in store.query_message(TOPIC, "k38").messages] == [b"38-" * 50]
    assert_equals_rebuild(store, store_path, tmp_path, small_geometry)
    r = store.put_message(Message(topic=TOPIC, body=b"after", queue_id=1, keys=["after"]))
    assert r.append_result.wrote_offset == expect_end
    store.shutdown()
    assert verify(store_path).ok
    store = open_store()
    assert store.recovery_report.mode == "normal-fast"
    assert [m.body for m in store.query_message(TOPIC, "after").messages] == [b"after"]


def test_flipped_bit_in_the_middle_is_reported_by_verify_not_silently_truncated(open_store, store_path,
                                                                                 small_geometry):
    """A clean restart does not rescan the log (so it does not cut 100 good records after one bad one);
    `verify` reports the damaged record's offset."""
    store = open_store()
    results = put_n(store, 100)
    store.shutdown()
    bad = results[40]
    flip(segment(store_path, bad.wrote_offset, small_geometry["mapped_file_size_commit_log"]),
         bad.wrote_offset % small_geometry["mapped_file_size_commit_log"] + BODY_HEADER_V4 + 5)
    report = verify(store_path)
    assert not report.ok
    crc = [p for p in report.problems if p.kind == "commitlog_record"]
    assert [(p.offset, p.detail) for p in crc] == [(bad.wrote_offset, "body CRC mismatch")]
    assert report.records == 100  # the walk went on past the bad record
    store = open_store()
    assert store.recovery_report.mode == "normal-fast"
    assert store.get_max_offset_in_queue(TOPIC, 0) == 50


# -- damaged consume queues and index (#10108) -------------------------------------------------------------
@pytest.mark.parametrize("damage", ["cut-to-odd-size", "garbage-units", "zeroed-units", "deleted",
                                    "short-middle-file", "points-elsewhere", "torn-tags"])
@pytest.mark.parametrize("abort", [False, True], ids=["clean", "abort"])
def test_damaged_consume_queue_is_rebuilt_not_fatal(open_store, store_path, small_geometry, tmp_path,
                                                    read_queue, damage, abort):
    cfg = {**small_geometry, "mapped_file_size_consume_queue": 20 * 50}
    store = open_store(**cfg)
    put_n(store, 240, queues=2)  # 120 units per queue: 3 files of 50 units
    store.shutdown()
    qdir = store_path / "consumequeue" / TOPIC / "0"
    files = sorted(qdir.iterdir())
    assert len(files) == 3
    if damage == "cut-to-odd-size":
        os.truncate(files[-1], 20 * 20 + 7)
    elif damage == "garbage-units":
        patch(files[-1], 20 * 15, os.urandom(20 * 5))
    elif damage == "zeroed-units":  # a hole (lost page) with units after it
        patch(files[-1], 20 * 10, bytes(20 * 5))
    elif damage == "deleted":
        for f in files:
            f.unlink()
    elif damage == "short-middle-file":
        os.truncate(files[1], 300)
    elif damage == "torn-tags":  # the last unit's copy was cut: offset and size there, tags code not
        patch(files[-1], 20 * 19 + 12, bytes(8))
    else:  # units that point at records of another queue
        other = (store_path / "consumequeue" / TOPIC / "1" / files[-1].name).read_bytes()
        patch(files[-1], 20 * 12, other[20 * 12:20 * 20])
    if abort:
        (store_path / "abort").write_text("1")
    store = open_store(**cfg)
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [(b"%d-" % i) * 50 for i in range(0, 240, 2)]
    assert_equals_rebuild(store, store_path, tmp_path, cfg)
    r = store.put_message(Message(topic=TOPIC, body=b"x", queue_id=0))
    assert r.append_result.logics_offset == 120
    store.shutdown()
    assert verify(store_path).ok


def test_consume_queue_written_with_another_geometry_is_a_clear_error(open_store, store_path,
                                                                      small_geometry):
    store = open_store(**{**small_geometry, "mapped_file_size_consume_queue": 20 * 50})
    put_n(store, 10)
    store.shutdown()
    with pytest.raises(StoreLoadError, match="configured file size"):
        MessageStore.open(store_path, **{**small_geometry, "mapped_file_size_consume_queue": 20 * 40})


@pytest.mark.parametrize("damage", ["cut-last-file", "cut-middle-file"])
def test_damaged_index_file_is_rebuilt_not_fatal(open_store, store_path, small_geometry, tmp_path, damage):
    cfg = {**small_geometry, "max_hash_slot_num": 16, "max_index_num": 64}
    store = open_store(**cfg)
    put_n(store, 120)
    store.shutdown()
    names = sorted((store_path / "index").iterdir())
    assert len(names) >= 4
    victim = names[-1] if damage == "cut-last-file" else names[1]
    os.truncate(victim, 100)
    store = open_store(**cfg)
    for i in range(120):
        assert [m.body for m in store.query_message(TOPIC, f"k{i}").messages] == [(b"%d-" % i) * 50]
    assert_equals_rebuild(store, store_path, tmp_path, cfg)


# -- crash right after a roll (#1434) ------------------------------------------------------------------------
@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
def test_crash_right_after_a_roll_keeps_the_previous_files_tail(tmp_path, index):
    """RocketMQ #1434: the last records of a file and the first of the next were not dispatched when the
    process died, and the checkpoint vouches for the new file: recovery must still dispatch the old
    file's tail. The child stops dispatch, puts until the log rolls, and dies."""
    store_dir, acks = tmp_path / "store", tmp_path / "acks"
    extra = [] if index else ["--no-index"]
    proc = subprocess.Popen([sys.executable, CHILD, str(store_dir), str(acks), "0", "1434", "--threads", "1",
                             "--count", "150", "--mode", "undispatched", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    acked = _read_acks(acks)
    segs = sorted((store_dir / "commitlog").iterdir())
    assert len(segs) >= 2 and len(acked) >= 60
    # The checkpoint vouches for everything up to the first record of the newest file (as if the flush
    # services had run right after the roll): RocketMQ starts its scan at that file.
    with open(segs[-1], "rb") as f:
        head = f.read(64)
    first_ts = struct.unpack_from(">q", head, 56)[0]
    cp = StoreCheckpoint(str(store_dir / "checkpoint"))
    cp.physic_msg_timestamp = cp.logics_msg_timestamp = cp.index_msg_timestamp = first_ts + 3000
    cp.shutdown()
    config = {**CRASH_GEOMETRY, "message_index_enable": index}
    store = MessageStore.open(store_dir, **config)
    try:
        rep = store.recovery_report
        assert rep.mode == "abnormal" and rep.scan_start == int(segs[-1].name)
        assert rep.dispatch_start < int(segs[-1].name)
        for topic, qid, qoff, key, phys in acked:
            r = store.get_message("g", topic, qid, qoff, 1)
            assert r.messages and r.messages[0].keys_list() == [key] and r.commit_log_offsets == [phys]
            if index:
                assert [m.commit_log_offset for m in store.query_message(topic, key).messages] == [phys]
    finally:
        store.shutdown()
    if index:
        check_store(store_dir, acked, tmp_path, "#1434").shutdown()


def test_lock_refuses_a_second_process_at_once(tmp_path):
    """The lock is an OS lock: a second process gets a clear StoreLockedError while the first runs, and
    the store opens again once the first is killed (the kernel drops its lock)."""
    store_dir, acks = tmp_path / "store", tmp_path / "acks"
    proc = subprocess.Popen([sys.executable, CHILD, str(store_dir), str(acks), "0", "7", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"READY\n"
        probe = subprocess.run([sys.executable, "-c", (
            "import sys\n"
            "from rmq_eventstore.store import MessageStore, StoreLockedError\n"
            "try:\n"
            f"    MessageStore.open({str(store_dir)!r}, mapped_file_size_commit_log=65536)\n"
            "except StoreLockedError as e:\n"
            "    print(e); sys.exit(3)\n")], capture_output=True, text=True, timeout=30)
        assert probe.returncode == 3 and "already open" in probe.stdout
        assert (store_dir / "abort").read_text() == str(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    store = MessageStore.open(store_dir, **CRASH_GEOMETRY)
    assert not store.last_exit_ok
    store.shutdown()
    assert not (store_dir / "abort").exists()


# -- the fast skim agrees with the full record check ---------------------------------------------------------
@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[2001:db8::7]:10911"], ids=["store-v4", "store-v6"])
def test_skim_agrees_with_check_message_and_return_size(open_store, store_path, store_host):
    from rmq_eventstore.common import codec
    store = open_store(store_host=store_host)
    long_topic = "T" * 127
    for i in range(120):
        topic = long_topic if i % 3 == 0 else TOPIC
        born = "[2001:db8::1]:4000" if i % 2 else "10.0.0.1:4000"
        if i % 5 == 0:
            r = store.put_messages([Message(topic=topic, body=b"b" * (i + j), born_host=born, keys=[f"k{i}-{j}"])
                                    for j in range(3)])
        else:
            r = store.put_message(Message(topic=topic, body=b"x" * i, born_host=born, tags="t", keys=[f"k{i}"]))
        assert r.status == PutMessageStatus.PUT_OK, r
    store.shutdown()
    total = 0
    for seg in sorted((store_path / "commitlog").iterdir()):
        data = seg.read_bytes()
        want = []
        for p, r in codec.iter_records(data, 0, len(data)):
            if not (r.success and r.size > 0):
                break
            q = r.request
            want.append((p, r.size, q.queue_id, q.consume_queue_offset, q.sys_flag, q.store_timestamp,
                         q.topic.encode()))
        for buf in (data, memoryview(data)):
            got, _nxt, state, _why = codec.skim_records(buf, 0, len(data), True, max_records=10**9)
            assert got == want and state in ("blank", "end")
        total += len(want)
    assert total == 120 + 24 * 2
    # and every kind of damage the full check reports, the skim reports too
    data = bytearray((store_path / "commitlog" / f"{0:020d}").read_bytes())
    first = codec.read_size_magic(data, 0)[0]
    for pos in range(0, first, 3):
        bad = bytearray(data[:first])
        bad[pos] ^= 0x41
        full = codec.check_message_and_return_size(bad, 0, True, len(bad))
        got, _n, state, _w = codec.skim_records(bad, 0, len(bad), True)
        if not full.success:
            assert state == "damage", pos


def test_kill_inside_an_index_put_leaves_no_broken_chain(open_store, store_path, small_geometry, tmp_path):
    """A process killed inside an index put, after the slot table was updated and before the header was
    (found by the crash suite): the slots point past indexCount. Recovery relinks the chains, so the
    entries re-dispatched into those numbers neither loop nor cut older keys off."""
    cfg = {**small_geometry, "max_hash_slot_num": 16, "max_index_num": 400}
    store = open_store(**cfg)
    put_n(store, 100)
    store.shutdown()
    idx = sorted((store_path / "index").iterdir())[-1]
    data = idx.read_bytes()
    bt, _et, bp, _ep, hsc, ic = struct.unpack_from(">qqqqii", data, 0)
    keep = ic - 7  # the header as it was before the last batch of 7 entries
    _h, phy, tdiff, _prev = struct.unpack_from(">iqii", data, 40 + 16 * 4 + (keep - 1) * 20)
    patch(idx, 0, struct.pack(">qqqqii", bt, bt + tdiff * 1000, bp, phy, hsc, keep))
    (store_path / "abort").write_text("1")
    store = open_store(**cfg)
    put_n(store, 50, start=100)
    assert store.wait_for_dispatch()
    for i in range(150):
        assert [m.body for m in store.query_message(TOPIC, f"k{i}").messages] == [(b"%d-" % i) * 50], i
    assert_equals_rebuild(store, store_path, tmp_path, cfg)


PROP_CRC = {"enabled_append_prop_crc": True, "force_verify_prop_crc": True}


def tear(store_path: Path, result, file_size: int, how: str) -> None:
    """Damage the properties of the record `result` wrote: `zero` clears its last 60 bytes, as a kill inside
    the copy leaves it (the trailer, TIMER_OUT_MS-sized values before it); `flip` flips one byte 30 bytes
    before its end (inside the properties, before a trailer)."""
    seg = segment(store_path, result.wrote_offset, file_size)
    end = result.wrote_offset % file_size + result.wrote_bytes
    if how == "zero":
        patch(seg, end - 60, bytes(60))
    else:
        flip(seg, end - 30)


@pytest.mark.parametrize("how", ["zero", "flip"])
@pytest.mark.parametrize("clean", [False, True], ids=["abnormal", "normal"])
@pytest.mark.parametrize("prop_crc", [True, False], ids=["prop-crc", "no-prop-crc"])
def test_a_record_torn_inside_its_properties_is_cut_only_with_the_properties_crc(
        open_store, store_path, small_geometry, prop_crc, clean, how):
    """The body CRC does not cover topic and properties: a record whose properties' tail never landed
    passes it. With RocketMQ 5.2's `__CRC32#` trailer (`enabled_append_prop_crc` + `force_verify_prop_crc`)
    normal and abnormal recovery cut the log at it, as at a body CRC mismatch; without, it is kept."""
    cfg = PROP_CRC if prop_crc else {}
    store = open_store(**cfg)
    results = put_n(store, 30)
    store.shutdown()
    last = results[-1]
    tear(store_path, last, small_geometry["mapped_file_size_commit_log"], how)
    if not clean:
        (store_path / "abort").write_text("1")
    store = open_store(**cfg)
    if prop_crc:
        assert store.get_max_phy_offset() == last.wrote_offset
        assert "CRC32" in store.recovery_report.damage
        assert store.recovery_report.mode == ("normal-scan" if clean else "abnormal")
        assert store.look_message_by_offset(results[-2].wrote_offset) is not None
    else:
        assert store.get_max_phy_offset() == last.wrote_offset + last.wrote_bytes
        assert store.recovery_report.damage == ""


def test_our_broker_writes_and_checks_the_properties_crc(tmp_path, small_geometry):
    """`serve_in_thread` (every broker of ours) turns the trailer on, so a copy torn inside its properties,
    which the timer kill test could leave (DESIGN.md), is cut by the restart's recovery."""
    from rmq_eventstore.broker import serve_in_thread

    path = tmp_path / "store"
    running = serve_in_thread(path, announce=False, **small_geometry)
    try:
        assert running.store.config.enabled_append_prop_crc and running.store.config.force_verify_prop_crc
        results = put_n(running.store, 10)
    finally:
        running.close()
    last = results[-1]
    tear(path, last, small_geometry["mapped_file_size_commit_log"], "zero")
    (path / "abort").write_text("1")
    running = serve_in_thread(path, announce=False, **small_geometry)
    try:
        assert running.store.get_max_phy_offset() == last.wrote_offset
    finally:
        running.close()


def test_records_without_the_trailer_survive_force_verify(open_store, store_path, small_geometry, tmp_path):
    """A store written without the trailer (before the setting, by RocketMQ's default, by an embedded store)
    and then with it, and then without it again: `force_verify_prop_crc` keeps every whole record (RocketMQ
    would truncate the log at the first record without `__CRC32#`) and still cuts a torn one of each kind."""
    store = open_store()
    put_n(store, 20)
    store.shutdown()
    store = open_store(**PROP_CRC)
    put_n(store, 20, start=20)
    store.shutdown()
    store = open_store()
    results = put_n(store, 20, start=40)
    store.shutdown()
    end = results[-1].wrote_offset + results[-1].wrote_bytes
    for clean in (True, False):
        if not clean:
            (store_path / "abort").write_text("1")
        store = open_store(**PROP_CRC)
        assert store.get_max_phy_offset() == end and store.recovery_report.damage == ""
        store.shutdown()
    # a record without the trailer whose tail is zero is torn (a whole one ends with 0x02 or a topic byte)
    tear(store_path, results[-1], small_geometry["mapped_file_size_commit_log"], "zero")
    (store_path / "abort").write_text("1")
    store = open_store(**PROP_CRC)
    assert store.get_max_phy_offset() == results[-1].wrote_offset
    assert store.recovery_report.damage == "__CRC32# property missing"
    assert_equals_rebuild(store, store_path, tmp_path, {**small_geometry, **PROP_CRC})


@pytest.mark.parametrize("name", ["commitlog-2k", "store-crc.bin"])
def test_rocketmqs_records_with_and_without_the_trailer_pass_force_verify(open_store, store_path, name):
    """Apache RocketMQ's own records (the golden vectors: `commitlog-2k` without `__CRC32#`, `store-crc.bin`
    with it) are all kept by an abnormal recovery with `force_verify_prop_crc`, and read back."""
    from golden import golden_path

    src = golden_path(name)
    (store_path / "commitlog").mkdir(parents=True)
    if name == "store-crc.bin":
        size = 65536
        data = src.read_bytes()
        (store_path / "commitlog" / f"{0:020d}").write_bytes(data + bytes(size - len(data)))
        want = len(data)
    else:
        size = 2048
        for f in sorted(src.iterdir()):
            (store_path / "commitlog" / f.name).write_bytes(f.read_bytes())
        want = 3647 + 124
    (store_path / "abort").write_text("1")
    store = open_store(mapped_file_size_commit_log=size, **PROP_CRC)
    assert store.get_max_phy_offset() == want and store.recovery_report.damage == ""
    assert store.wait_for_dispatch()
    assert store.look_message_by_offset(0).body is not None
    if name == "store-crc.bin":
        store.shutdown()
        flip(store_path / "commitlog" / f"{0:020d}", 120)  # the first record's topic (125 bytes long)
        (store_path / "abort").write_text("1")
        store = open_store(mapped_file_size_commit_log=size, **PROP_CRC)
        assert store.get_max_phy_offset() == 0 and "__CRC32#" in store.recovery_report.damage


def test_verify_reports_a_trailer_that_does_not_match(open_store, store_path, small_geometry):
    """`rmq-eventstore verify` checks the `__CRC32#` trailer of every record that ends with one."""
    store = open_store(**PROP_CRC)
    results = put_n(store, 30)
    store.shutdown()
    assert verify(store_path).ok
    mid = results[10]
    flip(segment(store_path, mid.wrote_offset, small_geometry["mapped_file_size_commit_log"]),
         mid.wrote_offset % small_geometry["mapped_file_size_commit_log"] + mid.wrote_bytes - 5)  # a digit
    report = verify(store_path)
    assert [(p.kind, p.offset, p.detail) for p in report.problems] == [
        ("commitlog_record", mid.wrote_offset, "__CRC32# property mismatch")]


def test_kill_inside_an_index_header_write(open_store, store_path, small_geometry, tmp_path):
    """A kill inside the index header write (found by the crash suite): the new endPhyOffset is on disk
    beside the old indexCount. Recovery must not take endPhyOffset's word for what is indexed."""
    cfg = {**small_geometry, "max_hash_slot_num": 16, "max_index_num": 400}
    store = open_store(**cfg)
    results = put_n(store, 100)
    store.shutdown()
    idx = sorted((store_path / "index").iterdir())[-1]
    bt, et, bp, ep, hsc, ic = struct.unpack_from(">qqqqii", idx.read_bytes(), 0)
    assert ep == results[-1].wrote_offset
    patch(idx, 0, struct.pack(">qqqqii", bt, et, bp, ep, hsc, ic - 40))  # 20 records' entries not counted
    (store_path / "abort").write_text("1")
    store = open_store(**cfg)
    for i in range(100):
        assert [m.body for m in store.query_message(TOPIC, f"k{i}").messages] == [(b"%d-" % i) * 50], i
    assert_equals_rebuild(store, store_path, tmp_path, cfg)
