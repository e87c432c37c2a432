"""The crash suite: a child process puts under SYNC_FLUSH and is killed with SIGKILL at random instants.

After every kill the store is reopened (abnormal recovery, the child's `abort` file is still there) and:
every acknowledged message is present and intact, found by queue offset (`get_message`) and by key
(`query_message`); every queue's offsets run 0..max with no duplicate or gap; the consume queues and the
index equal what a rebuild from the commitlog alone gives; `verify` finds nothing. Rounds reuse a
directory (crash, recover, clean restart, crash again...) and start fresh directories every few rounds.

`CRASH_ROUNDS` (default 50) sets the number of rounds, `CRASH_SEED` the base seed (printed per round for
reproduction); `make crashtest` runs 1000.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rmq_eventstore.store import GetMessageStatus, MessageStore, StoreLockedError
from rmq_eventstore.store.index import INDEX_ENTRY_DTYPE
from rmq_eventstore.store.repair import verify

sys.path.insert(0, os.path.dirname(__file__))
from crash_child import CRASH_GEOMETRY, QUEUES, TOPICS, body_of, tags_of  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")
ROUNDS = int(os.environ.get("CRASH_ROUNDS", "50"))
BASE_SEED = int(os.environ.get("CRASH_SEED", "20261122"))
ROUNDS_PER_DIR = 4


def _spawn(store: Path, acks: Path, rnd: int, seed: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, str(store), str(acks), str(rnd), str(seed), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_ready(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    assert line == b"READY\n", (line, proc.stderr.read() if proc.poll() is not None else b"")
    assert time.monotonic() < deadline


def _drop_partial_line(acks: Path) -> None:
    if acks.exists():
        data = acks.read_bytes()
        if data and not data.endswith(b"\n"):
            os.truncate(acks, data.rfind(b"\n") + 1)


def _read_acks(acks: Path) -> list[tuple[str, int, int, str, int]]:
    out = []
    if not acks.exists():
        return out
    for line in acks.read_text().splitlines():
        assert not line.startswith("UNFLUSHED"), f"SYNC_FLUSH acknowledged an unflushed put: {line}"
        parts = line.split()
        if len(parts) == 5:
            out.append((parts[0], int(parts[1]), int(parts[2]), parts[3], int(parts[4])))
    return out


def _read_queue(store: MessageStore, topic: str, qid: int) -> list:
    out = []
    offset = store.get_min_offset_in_queue(topic, qid)
    offset = max(offset, 0)
    while True:
        r = store.get_message("crash", topic, qid, offset, 32)
        if r.status != GetMessageStatus.FOUND:
            assert r.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE), \
                (topic, qid, offset, r.status)
            return out
        assert r.next_begin_offset == offset + r.message_count, "a unit was skipped inside the queue"
        out.extend(zip(r.message_queue_offsets, r.messages, strict=True))
        offset = r.next_begin_offset


def _cq_units(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    out = {}
    for cq in store._all_consume_queues():
        n = cq.get_max_offset_in_queue()
        units = []
        k = cq.get_min_offset_in_queue()
        while k < n:
            got = cq.get_units(k, 4096)
            assert got, (cq, k)
            units.extend(got)
            k += len(got)
        if units:
            out[(cq.topic, cq.queue_id)] = units
    return out


def _index_entries(store: MessageStore) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for f in store.index_service.files:
        count = f.index_count
        base = 40 + f.hash_slot_num * 4
        arr = np.frombuffer(f.mm, dtype=INDEX_ENTRY_DTYPE, count=count, offset=base)
        out.update(zip(arr["h"][1:].tolist(), arr["p"][1:].tolist(), strict=True))
        del arr
    return out


def check_store(path: Path, acked: list[tuple[str, int, int, str, int]], tmp: Path, label: str,
                checked_before: int = 0) -> MessageStore:
    """Reopen after a kill and check everything the module docstring promises; returns the open store."""
    store = MessageStore.open(path, **CRASH_GEOMETRY)
    report = store.recovery_report
    assert report is not None
    # 1. every queue is contiguous, duplicate-free and every message in it is intact
    queues = {}
    seen_phys: set[int] = set()
    for topic in TOPICS:
        for qid in range(QUEUES):
            entries = _read_queue(store, topic, qid)
            assert [q for q, _ in entries] == list(range(len(entries))), f"{label}: {topic}-{qid} offsets"
            for q, m in entries:
                assert m.queue_offset == q and m.topic == topic and m.queue_id == qid, label
                assert m.commit_log_offset not in seen_phys, f"{label}: record in two queue slots"
                seen_phys.add(m.commit_log_offset)
                (key,) = m.keys_list()
                assert m.body == body_of(key) and m.tags == tags_of(key), f"{label}: damaged {key}"
            queues[(topic, qid)] = {q: m for q, m in entries}
    assert store.get_max_offset_in_queue(TOPICS[0], QUEUES) == 0
    # 2. every acknowledged message by queue offset; by key every one acknowledged since the last check
    # and a sample of the older ones (each was looked up after its own crash, and the whole index is
    # compared with a rebuild below)
    rng = random.Random(label)
    for i, (topic, qid, qoff, key, phys) in enumerate(acked):
        m = queues[(topic, qid)].get(qoff)
        assert m is not None, f"{label}: acked {key} missing at {topic}-{qid}@{qoff} ({report})"
        assert m.keys_list() == [key] and m.commit_log_offset == phys, f"{label}: wrong message at {key}"
        if i >= checked_before or rng.random() < 0.1:
            found = store.query_message(topic, key).messages
            assert [x.commit_log_offset for x in found] == [phys], f"{label}: key {key} -> {found}"
    # 3. consume queues and index equal a rebuild from the commitlog alone
    copy = tmp / "rebuild"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    if (path / "commitlog").exists():
        shutil.copytree(path / "commitlog", copy / "commitlog")
    rebuilt = MessageStore.open(copy, **CRASH_GEOMETRY)
    try:
        assert rebuilt.get_max_phy_offset() == store.get_max_phy_offset(), label
        assert _cq_units(rebuilt) == _cq_units(store), f"{label}: consume queues differ from a rebuild"
        assert _index_entries(rebuilt) == _index_entries(store), f"{label}: index differs from a rebuild"
    finally:
        rebuilt.shutdown()
    # 4. the read-only verifier agrees (a store killed before its first put has no commitlog yet)
    if (path / "commitlog").exists():
        v = verify(path)
        assert v.ok, f"{label}: verify: {v.problems[:5]}"
    return store


def run_rounds(tmp_path: Path, rounds: int, base_seed: int) -> dict[str, int]:
    stats = {"acked": 0, "rounds": 0, "early_kills": 0, "abnormal": 0, "fast_restarts": 0}
    store_dir = None
    acks = None
    acked: list = []
    for rnd in range(rounds):
        seed = base_seed + rnd
        rng = random.Random(seed)
        if rnd % ROUNDS_PER_DIR == 0:
            store_dir = tmp_path / f"store{rnd}"
            acks = tmp_path / f"acks{rnd}"
            acked = []
        label = f"round {rnd} seed {seed} ({store_dir.name})"
        early = rng.random() < 0.1
        proc = _spawn(store_dir, acks, rnd, seed, "--threads", str(rng.randint(1, 4)))
        try:
            if early:  # kill while it opens the store (loads, recovers, starts)
                time.sleep(rng.uniform(0.05, 0.5))
                stats["early_kills"] += 1
            else:
                _wait_ready(proc)
                # a second process cannot open the store the child owns, and learns it at once
                t0 = time.monotonic()
                with pytest.raises(StoreLockedError):
                    MessageStore.open(store_dir, **CRASH_GEOMETRY)
                assert time.monotonic() - t0 < 1.0
                assert (store_dir / "abort").read_text() == str(proc.pid)
                time.sleep(rng.uniform(0.0, 0.4))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        _drop_partial_line(acks)  # a write cut by the kill; the next round appends to this file
        checked_before = len(acked)
        acked = _read_acks(acks)
        stats["acked"] += len(acked) - checked_before  # acknowledged by this round's child
        if not store_dir.exists():
            continue
        store = check_store(store_dir, acked, tmp_path, label, checked_before)
        mode = store.recovery_report.mode
        stats["abnormal"] += mode == "abnormal"
        has_messages = any(store._all_consume_queues())
        store.shutdown()
        # the clean restart the next child makes must take the fast path
        again = MessageStore(store_path_root_dir=str(store_dir), **CRASH_GEOMETRY)
        again.load()
        fast = again.recovery_report.mode == "normal-fast"
        again.shutdown()
        assert fast or not has_messages, f"{label}: clean restart took {again.recovery_report}"
        stats["fast_restarts"] += fast
        stats["rounds"] += 1
    return stats


def test_sigkill_crash_rounds(tmp_path):
    """ROUNDS kills at random instants (see the module docstring)."""
    t0 = time.monotonic()
    stats = run_rounds(tmp_path, ROUNDS, BASE_SEED)
    print(f"crash suite: {ROUNDS} rounds in {time.monotonic() - t0:.1f} s: {stats}")
    assert stats["rounds"] >= ROUNDS * 0.8
    assert stats["abnormal"] >= stats["rounds"] * 0.8
    assert stats["fast_restarts"] >= stats["rounds"] * 0.8
    assert stats["acked"] > 0


def test_undispatched_messages_survive_a_crash(tmp_path):
    """RocketMQ #467: messages in the commitlog but not yet in any consume queue or index when the
    process died are dispatched by recovery, with their queue offsets, and the next put continues."""
    store_dir, acks = tmp_path / "store", tmp_path / "acks"
    proc = _spawn(store_dir, acks, 0, 467, "--threads", "2", "--count", "25", "--mode", "undispatched")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    acked = _read_acks(acks)
    assert len(acked) >= 50
    # nothing of what was acknowledged is in a consume queue yet
    units = sum(len(v) for v in _cq_units_offline(store_dir).values())
    assert units == 0
    store = check_store(store_dir, acked, tmp_path, "#467")
    try:
        assert store.recovery_report.mode == "abnormal"
        assert store.recovery_report.records_dispatched >= len(acked)
        from rmq_eventstore.store import Message
        topic, qid = acked[0][0], acked[0][1]
        r = store.put_message(Message(topic=topic, body=b"after", queue_id=qid))
        assert r.append_result.logics_offset == sum(1 for a in acked if a[:2] == (topic, qid))
    finally:
        store.shutdown()


def _cq_units_offline(path: Path) -> dict:
    from rmq_eventstore.store import StoreReader
    out = {}
    with StoreReader(path) as reader:
        for topic in reader.topics():
            for qid in reader.queue_ids(topic):
                cq = reader.consume_queue(topic, qid)
                if cq is not None and cq.get_max_offset_in_queue():
                    out[(topic, qid)] = cq.get_max_offset_in_queue()
    return {k: [0] * v for k, v in out.items()}
