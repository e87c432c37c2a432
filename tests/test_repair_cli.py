"""`rmq-eventstore verify | recover | rebuild` (rmq_eventstore/cli/repair.py over store/repair.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rmq_eventstore.cli import main
from rmq_eventstore.cli.output import EXIT_DAMAGE, EXIT_ERROR, EXIT_OK
from rmq_eventstore.store import Message, MessageStore
from rmq_eventstore.store.repair import rebuild, verify

sys.path.insert(0, os.path.dirname(__file__))
from crash_child import CRASH_GEOMETRY  # noqa: E402
from test_crash import CHILD, _read_acks  # noqa: E402
from test_recovery import BODY_HEADER_V4, TOPIC, flip, patch, put_n, segment  # noqa: E402


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make_store(open_store, n: int = 120):
    store = open_store()
    results = put_n(store, n)
    store.shutdown()
    return results


def test_verify_clean_store(open_store, store_path, capsys):
    make_store(open_store)
    code, out, _ = run_cli(capsys, "verify", str(store_path), "--json")
    assert code == EXIT_OK
    r = json.loads(out)
    assert r["ok"] and r["records"] == 120 and r["units"] == 120 and r["index_entries"] == 240
    code, out, _ = run_cli(capsys, "verify", str(store_path))
    assert code == EXIT_OK and ": OK" in out.splitlines()[0]


def test_verify_reports_a_flipped_bit_with_its_offset(open_store, store_path, small_geometry, capsys):
    results = make_store(open_store)
    bad = results[70]
    size = small_geometry["mapped_file_size_commit_log"]
    flip(segment(store_path, bad.wrote_offset, size), bad.wrote_offset % size + BODY_HEADER_V4 + 9)
    code, out, _ = run_cli(capsys, "verify", str(store_path), "--json")
    assert code == EXIT_DAMAGE
    problems = json.loads(out)["problems"]
    assert {"kind": "commitlog_record", "where": f"{bad.wrote_offset - bad.wrote_offset % size:020d}",
            "offset": bad.wrote_offset, "detail": "body CRC mismatch"} in problems
    code, out, _ = run_cli(capsys, "verify", str(store_path))
    assert code == EXIT_DAMAGE and str(bad.wrote_offset) in out and "body CRC mismatch" in out


def test_verify_finds_bad_units_and_index_entries_then_rebuild_repairs(open_store, store_path, read_queue,
                                                                        capsys):
    make_store(open_store)
    qfile = sorted((store_path / "consumequeue" / TOPIC / "0").iterdir())[-1]
    # unit 3 of queue 0 now points at the record of unit 4 (wrong queue offset), the queue's last unit is
    # zeroed (a lost tail that a clean restart cannot see), and one index entry points at a wrong record
    patch(qfile, 3 * 20, qfile.read_bytes()[4 * 20:5 * 20])
    units = qfile.stat().st_size  # noqa: F841  (the file stays full size)
    data = qfile.read_bytes()
    last = max(i for i in range(len(data) // 20) if any(data[i * 20:i * 20 + 20]))
    patch(qfile, last * 20, bytes(20))
    idx = sorted((store_path / "index").iterdir())[0]
    base = 40 + 1024 * 4
    entry = bytearray(idx.read_bytes()[base + 20:base + 40])
    entry[4:12] = (int.from_bytes(entry[4:12], "big") + 1).to_bytes(8, "big")  # phyOffset off by one
    patch(idx, base + 20, bytes(entry))
    report = verify(store_path)
    kinds = sorted({p.kind for p in report.problems})
    assert kinds == ["cq_missing", "cq_unit", "index_entry"], report.problems
    code, out, _ = run_cli(capsys, "rebuild", str(store_path), "--json")
    assert code == EXIT_OK
    r = json.loads(out)
    assert r["action"] == "rebuild" and r["units"] == 120 and r["recovery"]["records_dispatched"] == 120
    assert verify(store_path).ok
    store = open_store()
    assert [m.body for _, m in read_queue(store, TOPIC, 0)] == [(b"%d-" % i) * 50 for i in range(0, 120, 2)]


def test_recover_after_a_crash_reports_and_clears_abort(open_store, store_path, small_geometry, capsys):
    results = make_store(open_store)
    last = results[-1]
    size = small_geometry["mapped_file_size_commit_log"]
    patch(segment(store_path, last.wrote_offset, size), last.wrote_offset % size + 4, b"\x00\x00\x00\x01")
    (store_path / "abort").write_text("999999")
    code, out, err = run_cli(capsys, "recover", str(store_path), "--json",
                             "--commitlog-file-size", str(size))
    assert code == EXIT_OK, err
    r = json.loads(out)["recovery"]
    assert r["mode"] == "abnormal" and r["commit_log_end"] == last.wrote_offset
    assert r["damage_offset"] == last.wrote_offset and r["truncated_bytes"] > 0
    assert not (store_path / "abort").exists()
    assert verify(store_path).ok
    code, out, _ = run_cli(capsys, "recover", str(store_path))
    assert code == EXIT_OK and "normal-fast" in out


def test_recover_and_rebuild_refuse_a_store_open_in_another_process(tmp_path, capsys):
    store_dir, acks = tmp_path / "store", tmp_path / "acks"
    proc = subprocess.Popen([sys.executable, CHILD, str(store_dir), str(acks), "0", "5", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"READY\n"
        deadline = time.monotonic() + 30
        while len(_read_acks(acks)) < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        for cmd in ("recover", "rebuild"):
            code, out, err = run_cli(capsys, cmd, str(store_dir))
            assert code == EXIT_ERROR and out == ""
            assert err.startswith("rmq-eventstore: error: store ") and "already open" in err and err.count("\n") == 1
        # verify is read-only and works beside the live writer
        v = verify(store_dir)
        assert v.ok, v.problems[:5]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert os.path.isdir(store_dir / "consumequeue")  # rebuild deleted nothing


def test_verify_beside_a_live_writer_in_this_process(open_store, store_path):
    store = open_store(**{k: v for k, v in CRASH_GEOMETRY.items() if k != "flush_disk_type"})
    put_n(store, 5)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            store.put_messages([Message(topic=TOPIC, body=b"live-%d" % j, keys=[f"l{j}"], queue_id=j % 3)
                                for j in range(i, i + 20)])
            i += 20

    t = threading.Thread(target=write)
    t.start()
    try:
        for _ in range(3):
            r = verify(store_path)
            assert r.ok, r.problems[:5]
    finally:
        stop.set()
        t.join()


def test_errors_are_one_line(tmp_path, capsys):
    code, out, err = run_cli(capsys, "verify", str(tmp_path / "nope"))
    assert code == EXIT_ERROR and err == f"rmq-eventstore: error: {tmp_path / 'nope'}: no such file or directory\n"
    code, out, err = run_cli(capsys, "recover", str(tmp_path))
    assert code == EXIT_ERROR and err.count("\n") == 1 and "not a store root" in err


def test_rebuild_library_function_reports_progress(open_store, store_path):
    make_store(open_store, 200)
    seen = []
    report = rebuild(store_path, seen.append)
    assert report.units == 200 and sum(seen) > 0
    assert isinstance(MessageStore, type)


def test_cli_runs_as_a_process(open_store, store_path):
    make_store(open_store, 10)
    p = subprocess.run([sys.executable, "-m", "rmq_eventstore", "verify", str(store_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "OK" in p.stdout
    assert Path(store_path / "lock").exists()
