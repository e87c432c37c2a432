"""``manage.py eventstore verify | recover | rebuild | inspect | query | dump | serve``
(rmq_eventstore/django/management/commands/eventstore.py over store/repair.py and store/inspection.py).

Stores are real: written by `MessageStore.open` in the test, shut down, then inspected, damaged and
repaired through `call_command`; `serve` runs as a `python -m django` process answering a client.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer
from rmq_eventstore.store import Message as StoreMessage
from rmq_eventstore.store import MessageStore, PutMessageStatus

REPO = Path(__file__).resolve().parents[2]
TOPIC = "orders"
GEOMETRY = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
            "max_hash_slot_num": 1024, "max_index_num": 4096}
SEGMENT = GEOMETRY["mapped_file_size_commit_log"]
N = 150


def make_store(path: Path, n: int = N) -> list:
    """`n` messages over three queues (bodies `i-i-...`, key `k{i}`), the store shut down cleanly."""
    store = MessageStore.open(path, **GEOMETRY)
    try:
        out = []
        for i in range(n):
            r = store.put_message(StoreMessage(topic=TOPIC, body=(b"%d-" % i) * 50, queue_id=i % 3,
                                               keys=[f"k{i}"], tags=f"t{i % 2}"))
            assert r.status == PutMessageStatus.PUT_OK, r
            out.append(r.append_result)
        assert store.wait_for_dispatch(10)
    finally:
        store.shutdown()
    return out


def patch(path: Path, pos: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, pos)
    finally:
        os.close(fd)


def segment_of(store: Path, offset: int) -> Path:
    return store / "commitlog" / f"{offset - offset % SEGMENT:020d}"


def run(*args: str, **options: object) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("eventstore", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def run_error(*args: str, **options: object) -> tuple[CommandError, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as info:
        call_command("eventstore", *args, stdout=out, stderr=err, **options)
    return info.value, out.getvalue(), err.getvalue()


@pytest.fixture
def store_dir(tmp_path: Path, settings) -> Path:
    """The "default" alias's store (not created yet), and a "remote" alias naming a name server."""
    path = tmp_path / "store"
    settings.RMQ_EVENTSTORE = {"default": {"URL": f"file://{path}"},
                               "remote": {"URL": "rmq://127.0.0.1:9876"}}
    return path


@pytest.fixture
def filled(store_dir: Path) -> tuple[Path, list]:
    return store_dir, make_store(store_dir)


# -- read-only commands on a healthy store -------------------------------------------------------------
def test_verify_a_clean_store(filled) -> None:
    path, _ = filled
    out, _ = run("verify")
    assert out.splitlines()[0] == f"store {path}: OK" and f"{N} records" in out
    out, _ = run("verify", "--json")
    doc = json.loads(out)
    assert doc["ok"] and doc["records"] == N and doc["units"] == N and doc["index_entries"] == 2 * N
    assert run("verify", verbosity=0) == ("", "")
    assert run("verify", "-v", "0") == ("", "")  # Django's option also after the sub-command


def test_inspect_summary_items_and_json(filled) -> None:
    path, _ = filled
    out, _ = run("inspect")
    assert f"store {path}" in out and f"{N} records" in out and "damage: none found" in out
    assert "state      not open" in out and f"{TOPIC}/0" not in out  # per-queue lines need -v 2
    out, _ = run("inspect", "-v", "2", "--crc")
    assert f"{TOPIC}/0  offsets 0..50" in out and "CRC checked" in out
    doc = json.loads(run("inspect", "--json")[0])
    assert doc["ok"] and doc["commitlog"]["records"] == N and doc["lock"]["heldBy"] is None
    assert [(q["queueId"], q["count"]) for q in doc["topics"][0]["queues"]] == [(0, 50), (1, 50), (2, 50)]


def test_query_by_key_offset_and_id(filled) -> None:
    _, results = filled
    out, _ = run("query", "--topic", TOPIC, "--key", "k7")
    assert "1 message(s) of topic orders with key 'k7', found via the index" in out
    doc = json.loads(run("query", "--topic", TOPIC, "--key", "k7", "--json")[0])
    assert doc["how"] == "index" and doc["count"] == 1 and doc["messages"][0]["body"] == "7-" * 50
    doc = json.loads(run("query", "--topic", TOPIC, "--key", "k7", "--scan", "--json")[0])
    assert doc["how"] == "scan" and doc["messages"][0]["commitLogOffset"] == results[7].wrote_offset
    doc = json.loads(run("query", "--offset", str(results[9].wrote_offset), "--json", "--body", "none")[0])
    assert doc["count"] == 1 and doc["messages"][0]["keys"] == "k9" and "body" not in doc["messages"][0]
    msg_id = results[11].msg_id
    doc = json.loads(run("query", "--id", msg_id, "--json")[0])
    assert doc["messages"][0]["msgId"] == msg_id and doc["messages"][0]["body"] == "11-" * 50
    out, _ = run("query", "--id", msg_id, "-v", "2")
    assert "property KEYS" in out and "k11" in out
    e, _, _ = run_error("query", "--offset", str(results[9].wrote_offset + 1))
    assert "no message starts at commitlog offset" in str(e) or "no record" in str(e)
    e, _, _ = run_error("query", "--key", "k1")
    assert "--topic" in str(e)


def test_dump_json_lines_queue_and_limit(filled) -> None:
    out, err = run("dump", "--topic", TOPIC, "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == N and [m["keys"] for m in lines[:3]] == ["k0", "k1", "k2"]
    assert err.strip() == f"dump: {N} message(s) of {TOPIC} via consume queue"  # not on stdout
    out, _ = run("dump", "--topic", TOPIC, "--queue", "1", "--limit", "4", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(m["queueId"], m["queueOffset"]) for m in lines] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    out, _ = run("dump", "--topic", TOPIC, "--limit", "2")
    assert len(out.splitlines()) == 3 and "dump: 2 message(s)" in out
    assert run("dump", "--topic", "nothing-here", "--json", verbosity=0) == ("", "")


def test_progress_goes_to_stderr_only(filled) -> None:
    out, err = run("verify", "--json", "--progress")
    assert json.loads(out)["ok"] and "verify" in err
    out, err = run("inspect", "--json")  # stderr is no terminal: no bar by default
    assert json.loads(out)["ok"] and err == ""


# -- where the store comes from ------------------------------------------------------------------------
def test_offline_commands_need_a_file_url_or_a_path(filled, tmp_path: Path, settings) -> None:
    path, _ = filled
    for sub in ("verify", "inspect", "recover", "rebuild"):
        e, _, _ = run_error(sub, "--store", "remote")
        assert "'remote'" in str(e) and "rmq://127.0.0.1:9876" in str(e) and "file://" in str(e)
        assert e.returncode == 2
    e, _, _ = run_error("verify", "--store", "nope")
    assert "'nope'" in str(e) and "'default'" in str(e)
    settings.RMQ_EVENTSTORE = {}  # --path needs no settings at all
    out, _ = run("verify", "--path", str(path))
    assert ": OK" in out
    e, _, _ = run_error("verify", "--path", str(tmp_path / "missing"))
    assert "no such file or directory" in str(e)


# -- damage and repair ---------------------------------------------------------------------------------
def test_damaged_tail_fails_verify_and_recover_repairs(filled) -> None:
    path, results = filled
    last = results[-1]
    # the last record's TOTALSIZE says 1 byte (a torn write), and the abort file says it crashed
    patch(segment_of(path, last.wrote_offset), last.wrote_offset % SEGMENT, b"\x00\x00\x00\x01")
    (path / "abort").write_text("999999")

    e, out, _ = run_error("verify")
    assert e.returncode == 1 and "damaged" in str(e) and str(last.wrote_offset) in str(e)
    assert "problem(s)" in out
    e, out, _ = run_error("verify", "--json")
    doc = json.loads(out)  # the report is still printed, then the command fails
    assert e.returncode == 1 and not doc["ok"]
    assert any(p["offset"] == last.wrote_offset and p["kind"].startswith("commitlog") for p in doc["problems"])
    e, out, _ = run_error("inspect")
    assert e.returncode == 1 and "damage:" in out

    out, _ = run("recover", "--dry-run", "-v", "2")
    assert f"the first at offset {last.wrote_offset}" in out and "abnormal" in out
    plan = json.loads(run("recover", "--dry-run", "--json")[0])
    assert plan["firstCommitLogDamage"] == last.wrote_offset and plan["mode"] == "abnormal"
    assert not plan["refused"] and plan["commitLogProblems"] >= 1
    assert (path / "abort").exists()  # a dry run changes nothing

    doc = json.loads(run("recover", "--json")[0])
    r = doc["recovery"]
    assert r["mode"] == "abnormal" and r["commit_log_end"] == last.wrote_offset and r["truncated_bytes"] > 0
    assert doc["abort_cleared"] and not (path / "abort").exists()
    out, _ = run("verify")
    assert ": OK" in out and f"{N - 1} records" in out
    out, _ = run("recover")
    assert "recover done" in out and "normal" in out


def test_bad_consume_queue_unit_then_rebuild(filled) -> None:
    path, _ = filled
    qfile = sorted((path / "consumequeue" / TOPIC / "0").iterdir())[0]
    patch(qfile, 3 * 20, qfile.read_bytes()[4 * 20:5 * 20])  # unit 3 points at unit 4's record
    e, out, _ = run_error("verify", "-v", "2")
    assert e.returncode == 1 and "cq_unit" in out
    out, _ = run("rebuild", "-v", "2")
    assert "rebuild done" in out and f"{N} records re-dispatched" in out and "consume queues  3" in out
    assert ": OK" in run("verify")[0]


CHILD = textwrap.dedent("""
    import json, sys, time
    from rmq_eventstore.store import MessageStore, Message
    store = MessageStore.open(sys.argv[1], **json.loads(sys.argv[2]))
    store.put_message(Message(topic="orders", body=b"live"))
    print("READY", flush=True)
    time.sleep(120)
""")


def test_recover_and_rebuild_refuse_a_store_open_in_a_live_process(store_dir: Path) -> None:
    make_store(store_dir, 10)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(store_dir), json.dumps(GEOMETRY)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "READY\n", proc.stderr.read()
        for sub in ("recover", "rebuild"):
            e, out, _ = run_error(sub)
            assert e.returncode == 2 and out == ""
            assert f"held by pid {proc.pid}" in str(e) and "refusing" in str(e), str(e)
        plan = json.loads(run("recover", "--dry-run", "--json")[0])
        assert plan["refused"] and plan["lockHeldBy"] == proc.pid
        doc = json.loads(run("inspect", "--json")[0])
        assert doc["lock"]["heldBy"] == proc.pid and doc["abort"]["pid"] == proc.pid
        assert ": OK" in run("verify")[0]  # read-only: fine beside the live writer
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert (store_dir / "consumequeue").is_dir()  # rebuild deleted nothing


def test_serve_refuses_a_store_this_process_has_open(store_dir: Path) -> None:
    store = MessageStore.open(store_dir, **GEOMETRY)
    try:
        e, _, _ = run_error("serve", "--namesrv-port", "0", "--broker-port", "0")
        assert f"pid {os.getpid()}" in str(e) and "refusing to serve" in str(e)
    finally:
        store.shutdown()


# -- serve ---------------------------------------------------------------------------------------------
def test_serve_answers_clients_and_stops_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "served"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django_face.settings",
           "RMQ_TEST_STORE_URL": f"file://{path}", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "django", "eventstore", "serve", "--namesrv-port", "0",
                             "--broker-port", "0", "--log-level", "WARNING"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"broker (\S+) serving (\S+); name server (\S+)", line)
        assert m, line + proc.stderr.read()
        assert m.group(2) == str(path)
        namesrv = m.group(3)
        with Producer(namesrv, "pg") as p, PullConsumer(namesrv, "cg") as c:
            sent = p.send(Message(TOPIC, b"through manage.py", keys=["served-1"]), queue_id=0)
            res = c.pull(TOPIC, 0, 0, suspend_timeout_ms=5000)
            assert res.status == FOUND and res.messages[0].body == b"through manage.py"
            assert res.messages[0].msg_id == sent.offset_msg_id
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "shutting down" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (path / "abort").exists()  # a clean shutdown
    doc = json.loads(run("query", "--path", str(path), "--topic", TOPIC, "--key", "served-1", "--json")[0])
    assert doc["count"] == 1 and doc["messages"][0]["body"] == "through manage.py"
