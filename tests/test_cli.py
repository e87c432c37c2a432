"""`rmq-eventstore` (rmq_eventstore.cli): read-only inspect / query / msg / dump.

On the golden `commitlog-2k` directory written by Apache RocketMQ's encoder (a copy and the read-only
original), on a store written by `MessageStore` (closed and still open), and on broken input. Every
command is checked to leave the directory's bytes unchanged. `main()` runs in-process; one subprocess
run proves the `python -m rmq_eventstore` entry point.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from golden import GOLDEN_DIR

from rmq_eventstore.cli import main
from rmq_eventstore.cli import store as cli
from rmq_eventstore.cli.output import CliError
from rmq_eventstore.cli.store import infer_index_geometry
from rmq_eventstore.store import Message
from rmq_eventstore.store.config_files import ConsumerOffsetManager, TopicConfig, TopicConfigManager
from rmq_eventstore.store.message_store import MessageStore

REPO = Path(__file__).resolve().parent.parent
GOLDEN_2K = GOLDEN_DIR / "commitlog-2k"

STORE_CONFIG = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 100,
                    max_hash_slot_num=1000, max_index_num=4000)
N_MESSAGES = 300
TOPICS = ("orders", "users")


# -- helpers ----------------------------------------------------------------------------------------
def tree_digest(root: Path) -> dict[str, str]:
    """relative path → sha256 of the bytes, for every file under `root`.

    The `lock` file is only stat'ed (size and mtime): closing any descriptor of it would drop the fcntl
    lock a live store in this process holds on it.
    """
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if name == "lock":
                st = p.stat()
                out[str(p.relative_to(root))] = f"lock size={st.st_size} mtime={st.st_mtime_ns}"
            else:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main(argv) in-process → (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return json.loads(out)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def golden_decoded() -> dict[int, dict]:
    """commitLogOffset → RocketMQ's own decode of that record in commitlog-2k."""
    path = GOLDEN_DIR / "commitlog-2k.decoded.jsonl"
    if not path.exists():
        pytest.fail(f"golden file {path} is missing", pytrace=False)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["commitLogOffset"]: r for r in rows if "commitLogOffset" in r}


@pytest.fixture(params=["copy", "original"])
def golden_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The golden commitlog-2k directory: a writable copy, or the read-only original itself."""
    if not GOLDEN_2K.is_dir():
        pytest.fail(f"golden directory {GOLDEN_2K} is missing", pytrace=False)
    if request.param == "original":
        return GOLDEN_2K
    dst = tmp_path / "commitlog-2k"
    shutil.copytree(GOLDEN_2K, dst)
    for p in [dst, *dst.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def body_of(i: int) -> str:
    return f"event-{i};" * 8  # 300 messages fill more than one 64 KiB segment


def message_for(i: int) -> Message:
    topic = TOPICS[i % 2]
    return Message(topic=topic, body=body_of(i).encode(), tags=f"T{i % 3}",
                   keys=[f"k{i}", f"grp{i % 7}"], queue_id=i % 4)


def fill(store: MessageStore, start: int, n: int) -> dict[int, int]:
    """Put messages start..start+n-1; returns message number → commitlog offset."""
    offsets = {}
    for i in range(start, start + n):
        r = store.put_message(message_for(i))
        assert r.append_result is not None
        offsets[i] = r.append_result.wrote_offset
    assert store.wait_for_dispatch(10)
    return offsets


def expected_offsets(offsets: dict[int, int], topic: str, key: str) -> list[int]:
    return sorted(off for i, off in offsets.items()
                  if TOPICS[i % 2] == topic and key in (f"k{i}", f"grp{i % 7}"))


@pytest.fixture(scope="module")
def closed_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    """A store of N_MESSAGES messages over two topics and four queues, shut down, with config files."""
    root = tmp_path_factory.mktemp("cli") / "store"
    store = MessageStore.open(root, **STORE_CONFIG)
    try:
        offsets = fill(store, 0, N_MESSAGES)
    finally:
        store.shutdown()
    topics = TopicConfigManager(root / "config")
    for t in TOPICS:
        topics.put(TopicConfig(t, read_queue_nums=4, write_queue_nums=4))
    consumers = ConsumerOffsetManager(root / "config")
    consumers.commit_offset("billing", "orders", 1, 10)
    consumers.commit_offset("crm", "users", 0, 3)
    consumers.persist()
    return root, offsets


@pytest.fixture
def live_store(tmp_path: Path):
    """An open store (lock held, abort present) with N_MESSAGES messages; quiet once the fixture yields."""
    root = tmp_path / "live"
    store = MessageStore.open(root, flush_commit_log_thorough_interval=10**9, **STORE_CONFIG)
    try:
        offsets = fill(store, 0, N_MESSAGES)
        # Wait until the background flushes (checkpoint, consume queues) stop changing bytes.
        before = tree_digest(root)
        for _ in range(20):
            time.sleep(1.1)
            now = tree_digest(root)
            if now == before:
                break
            before = now
        yield store, root, offsets
    finally:
        store.shutdown()


# -- golden commitlog-2k (Apache RocketMQ's bytes) ---------------------------------------------------
def test_inspect_golden(capsys: pytest.CaptureFixture[str], golden_dir: Path) -> None:
    before = tree_digest(golden_dir)
    r = run_json(capsys, "inspect", golden_dir, "--json")
    assert r["kind"] == "commitlog" and r["root"] is None and r["ok"] is True and r["damage"] == []
    segs = r["commitlog"]["segments"]
    assert [s["name"] for s in segs] == ["00000000000000000000", "00000000000000002048"]
    assert [s["records"] for s in segs] == [13, 2]
    assert segs[0]["endsWithBlank"] is True and segs[0]["validEnd"] == 1851
    assert segs[1]["endsWithBlank"] is False and segs[1]["validEnd"] == 3771
    assert r["commitlog"]["fileSize"] == 2048
    assert (r["commitlog"]["minOffset"], r["commitlog"]["maxOffset"], r["commitlog"]["records"]) == (0, 3771, 15)
    assert r["topicsSource"] == "commitlog"
    topics = {t["topic"]: {q["queueId"]: (q["minOffset"], q["maxOffset"], q["count"]) for q in t["queues"]}
              for t in r["topics"]}
    assert topics["TopicTest"] == {0: (0, 2, 2), 1: (0, 1, 1)}
    assert topics["TopicBig"] == {0: (0, 1, 1)}
    assert r["checkpoint"] is None and r["index"] is None and r["lock"] is None

    code, out, _ = run(capsys, "inspect", golden_dir)
    assert code == 0
    assert "bare commitlog directory" in out and "Damage: none found" in out
    seg_line = next(line for line in out.splitlines() if "00000000000000000000" in line)
    assert seg_line.split()[1:5] == ["2048", "1851", "13", "yes"]

    r = run_json(capsys, "inspect", golden_dir, "--json", "--crc")
    assert r["ok"] and r["commitlog"]["crcChecked"] and r["commitlog"]["records"] == 15
    assert tree_digest(golden_dir) == before


def test_msg_by_offset_and_id_golden(capsys: pytest.CaptureFixture[str], golden_dir: Path) -> None:
    before = tree_digest(golden_dir)
    want = golden_decoded()[2048]
    by_offset = run_json(capsys, "msg", golden_dir, "--offset", "2048", "--json", "--body", "hex")
    assert by_offset["topic"] == "TopicBig"
    for k in ("msgId", "queueId", "queueOffset", "storeSize", "bodyCRC", "sysFlag", "bornTimestamp", "bornHost",
              "storeTimestamp", "storeHost", "bodyLength"):
        assert by_offset[k] == want[k], k
    assert by_offset["bodyHex"] == want["bodyHex"]
    by_id = run_json(capsys, "msg", golden_dir, "--id", "7F00000100002A9F0000000000000800", "--json", "--body", "hex")
    assert by_id == by_offset
    assert run_json(capsys, "msg", golden_dir, "--offset", "0x800", "--json", "--body", "hex") == by_offset

    code, out, _ = run(capsys, "msg", golden_dir, "--offset", "105")
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(" ") and " " in line)
    assert fields["topic"].strip() == "TopicTest" and fields["keys"].strip() == "k1 k2"
    assert fields["body"].strip() == "with tags and keys"
    assert tree_digest(golden_dir) == before


@pytest.mark.parametrize("argv, needle", [
    (["--id", "this-is-not-an-id"], "32 (IPv4) or 56 (IPv6) hex"),
    (["--id", "Z" * 32], "not hexadecimal"),
    (["--offset", "1851"], "BLANK"),  # the end-of-file record of the first segment
    (["--offset", "100"], "no message starts at commitlog offset 100"),  # inside a record
    (["--offset", "99999"], "outside the commitlog"),
    (["--id", "C0A8011400004E21000000000000000A"], "UNIQ_KEY"),  # a client id: points at offset 10
])
def test_msg_errors_golden(capsys: pytest.CaptureFixture[str], golden_dir: Path, argv: list[str],
                           needle: str) -> None:
    code, out, err = run(capsys, "msg", golden_dir, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "error" in err and needle in err
    assert "Traceback" not in err


def test_dump_golden(capsys: pytest.CaptureFixture[str], golden_dir: Path) -> None:
    before = tree_digest(golden_dir)
    decoded = golden_decoded()
    code, out, err = run(capsys, "dump", golden_dir, "--topic", "TopicTest")
    assert code == 0 and "commitlog scan" in err
    rows = json_lines(out)
    assert [(m["queueId"], m["queueOffset"]) for m in rows] == [(0, 0), (1, 0), (0, 1)]
    assert [m["commitLogOffset"] for m in rows] == [0, 105, 3647]
    for m in rows:
        want = decoded[m["commitLogOffset"]]
        assert (m["msgId"], m["body"], m["storeTimestamp"]) == (want["msgId"], want["body"], want["storeTimestamp"])

    code, out, _ = run(capsys, "dump", golden_dir, "--topic", "TopicTest", "--queue", "0", "--from-offset", "1")
    assert [(m["queueId"], m["queueOffset"]) for m in json_lines(out)] == [(0, 1)]
    code, out, _ = run(capsys, "dump", golden_dir, "--topic", "TopicTest", "--limit", "1", "--body", "none")
    (only,) = json_lines(out)
    assert "body" not in only and "bodyHex" not in only
    code, out, _ = run(capsys, "dump", golden_dir, "--topic", "NoSuchTopic")
    assert code == 0 and out == ""
    assert tree_digest(golden_dir) == before


def test_query_golden_by_scan(capsys: pytest.CaptureFixture[str], golden_dir: Path) -> None:
    before = tree_digest(golden_dir)
    r = run_json(capsys, "query", golden_dir, "--topic", "TopicTest", "--key", "k1", "--json")
    assert r["how"] == "scan" and r["count"] == 1
    (m,) = r["messages"]
    assert m["commitLogOffset"] == 105 and m["tags"] == "TagA" and m["body"] == "with tags and keys"
    # the UNIQ_KEY finds it too; another topic or a time window before it does not
    r = run_json(capsys, "query", golden_dir, "--topic", "TopicTest", "--key", "C0A8011400004E21000000000000000A",
                 "--json")
    assert [m["commitLogOffset"] for m in r["messages"]] == [105]
    assert run_json(capsys, "query", golden_dir, "--topic", "TopicZ", "--key", "k1", "--json")["count"] == 0
    assert run_json(capsys, "query", golden_dir, "--topic", "TopicTest", "--key", "k1", "--end",
                    "1700000000005", "--json")["count"] == 0
    code, out, _ = run(capsys, "query", golden_dir, "--topic", "TopicTest", "--key", "k2")
    assert code == 0 and "commitlog scan" in out and "C0A8010A00002A9F0000000000000069" in out
    assert tree_digest(golden_dir) == before


def test_entry_point_subprocess() -> None:
    """`python -m rmq_eventstore inspect` on the read-only original, as a real process."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "rmq_eventstore", "inspect", str(GOLDEN_2K), "--json"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert [s["validEnd"] for s in r["commitlog"]["segments"]] == [1851, 3771]
    assert p.stderr == ""  # stderr is no TTY: no progress bar


# -- damage and errors -------------------------------------------------------------------------------
def test_inspect_finds_damage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "cl"
    shutil.copytree(GOLDEN_2K, d)
    seg = d / "00000000000000000000"
    seg.chmod(0o644)
    data = bytearray(seg.read_bytes())
    data[296 + 4] ^= 0xFF  # the magic code of the third record
    seg.write_bytes(bytes(data))
    code, out, _ = run(capsys, "inspect", d)
    assert code == 1 and "Damage: 1 problem(s)" in out and "illegal magic code" in out
    r = json.loads(run(capsys, "inspect", d, "--json")[1])
    assert r["ok"] is False and r["commitlog"]["segments"][0]["validEnd"] == 296
    assert r["commitlog"]["segments"][0]["records"] == 2 and r["commitlog"]["maxOffset"] == 296
    (problem,) = r["damage"]
    assert "at offset 296" in problem and "later segments are unreachable" in problem


def test_inspect_crc_finds_flipped_body(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "cl"
    shutil.copytree(GOLDEN_2K, d)
    seg = d / "00000000000000002048"
    seg.chmod(0o644)
    data = bytearray(seg.read_bytes())
    data[200] ^= 0x01  # a byte of TopicBig's 1500-byte body
    seg.write_bytes(bytes(data))
    assert run(capsys, "inspect", d)[0] == 0  # structure intact
    code, out, _ = run(capsys, "inspect", d, "--json", "--crc")
    r = json.loads(out)
    assert code == 1 and r["commitlog"]["segments"][1]["damage"] == "body CRC mismatch"


@pytest.mark.parametrize("case", ["missing", "file", "empty-dir", "wrong-segment-size"])
def test_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    path = tmp_path / "x"
    if case == "file":
        path.write_text("not a store")
    elif case == "empty-dir":
        path.mkdir()
    elif case == "wrong-segment-size":
        (path / "commitlog").mkdir(parents=True)
        (path / "commitlog" / f"{0:020d}").write_bytes(bytes(1000))
        (path / "commitlog" / f"{4096:020d}").write_bytes(bytes(4096))
    for argv in (["inspect", path], ["dump", path, "--topic", "t"], ["msg", path, "--offset", "0"],
                 ["query", path, "--topic", "t", "--key", "k"]):
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("rmq-eventstore: error: ")
        assert "Traceback" not in err


def test_unreadable_file_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                closed_store: tuple[Path, dict[int, int]]) -> None:
    """An unreadable segment (simulated: this may run as root, who reads any file) → one line, exit 2."""
    root, _ = closed_store
    real_open = os.open
    victim = str(root / "commitlog" / f"{64 * 1024:020d}")

    def deny(path, *a, **kw):  # type: ignore[no-untyped-def]
        if os.fspath(path) == victim:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    for argv in (["inspect", root], ["dump", root, "--topic", "orders"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err == f"rmq-eventstore: error: {victim}: Permission denied\n"


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["msg", str(GOLDEN_2K)]) == 2  # neither --id nor --offset
    assert "one of the arguments --id --offset is required" in capsys.readouterr().err
    assert main(["msg", str(GOLDEN_2K), "--id", "00", "--offset", "1"]) == 2
    assert main(["dump", str(GOLDEN_2K)]) == 2  # --topic is required
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("inspect", "query", "msg", "dump"))


def test_index_geometry_inference() -> None:
    assert infer_index_geometry(40 + 84 * 1000) == (1000, 4000)
    assert infer_index_geometry(420_000_040) == (5_000_000, 20_000_000)  # RocketMQ's defaults
    assert infer_index_geometry(40 + 4 * 1000 + 20 * 3000, hash_slot_num=1000) == (1000, 3000)
    assert infer_index_geometry(40 + 4 * 1000 + 20 * 3000, index_num=3000) == (1000, 3000)
    with pytest.raises(CliError, match="--index-slots"):
        infer_index_geometry(40 + 4 * 1000 + 20 * 3000)
    with pytest.raises(CliError):
        infer_index_geometry(40 + 84 * 1000, hash_slot_num=7)


def test_broken_pipe_is_quiet(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`dump ... | head -1`: the reader goes away after one line; exit 0 and nothing on stderr."""

    class HeadPipe(io.StringIO):
        def write(self, s: str) -> int:
            if self.getvalue():
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(s)

    pipe = HeadPipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    assert main(["dump", str(GOLDEN_2K), "--topic", "TopicTest"]) == 0
    assert len(pipe.getvalue().splitlines()) == 1
    assert capsys.readouterr().err == ""


def test_progress_bar_only_on_a_tty(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["inspect", str(GOLDEN_2K), "--json"]) == 0
    assert "inspect" in tty.getvalue()  # tqdm drew its bar (by bytes) on the terminal
    tty2 = Tty()
    monkeypatch.setattr(sys, "stderr", tty2)
    assert main(["inspect", str(GOLDEN_2K), "--json", "--no-progress"]) == 0
    assert tty2.getvalue() == ""
    capsys.readouterr()


# -- a store written by MessageStore ---------------------------------------------------------------
def check_store_inspection(r: dict, root: Path, total: int) -> None:
    assert r["kind"] == "store" and r["root"] == str(root) and r["ok"] is True
    assert r["lock"]["present"] is True
    cp = r["checkpoint"]
    assert cp is not None and cp["size"] == 4096 and cp["logicsMsgTimestamp"] > 0
    assert cp["logicsMsgTime"].startswith("20") and set(cli._CHECKPOINT_FIELDS) <= set(cp)
    cl = r["commitlog"]
    assert cl["fileSize"] == 64 * 1024 and len(cl["segments"]) >= 2 and cl["records"] == total
    assert cl["segments"][0]["endsWithBlank"] is True
    assert r["topicsSource"] == "consumequeue"
    queues = {(t["topic"], q["queueId"]): q for t in r["topics"] for q in t["queues"]}
    assert set(queues) == {("orders", 0), ("orders", 2), ("users", 1), ("users", 3)}
    assert sum(q["count"] for q in queues.values()) == total
    for q in queues.values():
        assert q["minOffset"] == 0 and q["maxOffset"] == q["count"] == total // 4
    idx = r["index"]
    assert idx["hashSlotNum"] == 1000 and idx["indexNum"] == 4000 and idx["geometry"] == "inferred"
    assert len(idx["files"]) == 1  # 3 keys a message, 900 + 1 < 4000
    f = idx["files"][0]
    assert f["size"] == 40 + 84 * 1000 and f["indexCount"] == 3 * total + 1 and f["beginPhyOffset"] == 0
    assert f["beginTimestamp"] > 0 and f["endTime"] is not None


def test_closed_store(capsys: pytest.CaptureFixture[str], closed_store: tuple[Path, dict[int, int]]) -> None:
    root, offsets = closed_store
    before = tree_digest(root)

    r = run_json(capsys, "inspect", root, "--json", "--crc")
    check_store_inspection(r, root, N_MESSAGES)
    assert r["abort"]["present"] is False
    files = r["config"]["files"]
    assert files["topics.json"]["topics"] == 2
    assert files["consumerOffset.json"]["groups"] == {"billing": ["orders"], "crm": ["users"]}
    code, out, _ = run(capsys, "inspect", root)
    assert code == 0
    for text in ("store root", "Checkpoint", "logicsMsgTimestamp", "consume queues", "orders", "users",
                 "1000 slots, 4000 entries", "topics.json", "2 topics", "billing", "Damage: none found"):
        assert text in out, text

    # query: the index, exactly the matching messages (hash matches of other keys filtered out)
    for topic, key in (("orders", "grp3"), ("users", "k42"), ("orders", "k42"), ("users", "nope")):
        q = run_json(capsys, "query", root, "--topic", topic, "--key", key, "--json", "--max", "64")
        assert q["how"] == "index"
        assert [m["commitLogOffset"] for m in q["messages"]] == expected_offsets(offsets, topic, key)
        s = run_json(capsys, "query", root, "--topic", topic, "--key", key, "--json", "--max", "64", "--scan")
        assert s["how"] == "scan" and s["messages"] == q["messages"]
    newest = run_json(capsys, "query", root, "--topic", "orders", "--key", "grp3", "--json", "--max", "5")
    assert [m["commitLogOffset"] for m in newest["messages"]] == expected_offsets(offsets, "orders", "grp3")[-5:]
    m42 = run_json(capsys, "msg", root, "--offset", str(offsets[42]), "--json")
    q = run_json(capsys, "query", root, "--topic", "orders", "--key", m42["uniqKey"], "--json")
    assert [m["commitLogOffset"] for m in q["messages"]] == [offsets[42]]
    assert run_json(capsys, "msg", root, "--id", m42["msgId"], "--json") == m42
    assert m42["body"] == body_of(42) and m42["keys"] == "k42 grp0"
    code, out, _ = run(capsys, "query", root, "--topic", "orders", "--key", "grp3")
    assert code == 0 and "found via the index" in out

    # dump: through the consume queues, in commitlog order
    code, out, err = run(capsys, "dump", root, "--topic", "orders", "--body", "none")
    assert code == 0 and "via consume queue" in err
    rows = json_lines(out)
    assert [m["commitLogOffset"] for m in rows] == sorted(o for i, o in offsets.items() if i % 2 == 0)
    code, out, _ = run(capsys, "dump", root, "--topic", "users", "--queue", "3", "--from-offset", "70")
    rows = json_lines(out)
    assert [(m["queueId"], m["queueOffset"]) for m in rows] == [(3, q) for q in range(70, 75)]
    assert rows[0]["body"] == body_of(3 + 4 * 70)
    code, out, _ = run(capsys, "dump", root, "--topic", "users", "--limit", "7")
    assert len(json_lines(out)) == 7

    assert tree_digest(root) == before


def test_live_store(capsys: pytest.CaptureFixture[str], live_store) -> None:
    store, root, offsets = live_store
    before = tree_digest(root)

    r = run_json(capsys, "inspect", root, "--json")
    check_store_inspection(r, root, N_MESSAGES)
    assert r["abort"] == {"present": True, "pid": os.getpid(), "running": True, "bakPresent": False}
    code, out, _ = run(capsys, "inspect", root)
    assert code == 0 and f"pid {os.getpid()} (running)" in out

    q = run_json(capsys, "query", root, "--topic", "orders", "--key", "grp5", "--json", "--max", "64")
    assert q["how"] == "index"
    assert [m["commitLogOffset"] for m in q["messages"]] == expected_offsets(offsets, "orders", "grp5")
    code, out, err = run(capsys, "dump", root, "--topic", "users")
    assert "via consume queue" in err and len(json_lines(out)) == N_MESSAGES // 2
    m = run_json(capsys, "msg", root, "--offset", str(offsets[7]), "--json")
    assert m["topic"] == "users" and m["keys"] == "k7 grp0"
    assert tree_digest(root) == before

    # The tool took no lock and did not disturb the owner's: another process still cannot lock the store.
    probe = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)\nexcept OSError:\n    sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", probe, str(root / "lock")], timeout=60)
    assert p.returncode == 3

    # The store keeps working, and the next look sees what it appended meanwhile.
    more = fill(store, N_MESSAGES, 20)
    code, out, _ = run(capsys, "dump", root, "--topic", "users", "--body", "none")
    assert len(json_lines(out)) == (N_MESSAGES + 20) // 2
    q = run_json(capsys, "query", root, "--topic", "orders", "--key", f"k{N_MESSAGES}", "--json")
    assert [m["commitLogOffset"] for m in q["messages"]] == [more[N_MESSAGES]]
    r = run_json(capsys, "inspect", root, "--json")
    assert r["commitlog"]["records"] == N_MESSAGES + 20


def test_index_with_other_geometry(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Index files of 1000 slots and 3000 entries (not 4:1): geometry from --index-slots / --index-num."""
    root = tmp_path / "s"
    cfg = dict(STORE_CONFIG, max_index_num=3000)
    with MessageStore.open(root, **cfg) as store:
        offsets = fill(store, 0, 40)
    before = tree_digest(root)
    code, _, err = run(capsys, "query", root, "--topic", "orders", "--key", "grp1")
    assert code == 2 and "--index-slots" in err
    want = expected_offsets(offsets, "orders", "grp1")
    for opts in (["--index-slots", "1000"], ["--index-num", "3000"], ["--index-slots", "1000", "--index-num", "3000"]):
        q = run_json(capsys, "query", root, "--topic", "orders", "--key", "grp1", "--json", *opts)
        assert q["how"] == "index" and [m["commitLogOffset"] for m in q["messages"]] == want
    r = run_json(capsys, "inspect", root, "--json")  # inspect still works, and says why it cannot tell
    assert r["ok"] and r["index"]["hashSlotNum"] is None and "--index-slots" in r["index"]["error"]
    r = run_json(capsys, "inspect", root, "--json", "--index-slots", "1000")
    assert (r["index"]["hashSlotNum"], r["index"]["indexNum"], r["index"]["geometry"]) == (1000, 3000, "given")
    assert tree_digest(root) == before


def test_lock_file_never_opened(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                closed_store: tuple[Path, dict[int, int]]) -> None:
    """Closing any descriptor of `lock` would drop an fcntl lock this process holds: never open it."""
    root, _ = closed_store
    real_open = os.open
    opened: list[str] = []

    def spy(path, *a, **kw):  # type: ignore[no-untyped-def]
        opened.append(os.fspath(path))
        return real_open(path, *a, **kw)

    real_builtin_open = open

    def spy_builtin(path, *a, **kw):  # type: ignore[no-untyped-def]
        if isinstance(path, (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(path))
        return real_builtin_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    monkeypatch.setattr("builtins.open", spy_builtin)
    monkeypatch.setattr(fcntl, "lockf", lambda *a, **kw: pytest.fail("the CLI must not lock"))
    assert run(capsys, "inspect", root, "--json")[0] == 0
    assert opened and not any(os.path.basename(p) == "lock" for p in opened)
