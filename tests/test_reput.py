"""ReputMessageService and dispatch (spec §6.3, §7.4, §9, §10) through `MessageStore`, on real files:
consume queues and the index are derived data rebuilt from the commitlog; a commitlog written by Apache
RocketMQ itself (`/work/shared/golden/commitlog-2k`) is dispatched into queues and index; transaction
records are (not) dispatched as RocketMQ does; arrival notifications; dispatch progress is only
reported once the dispatchers have run.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import zlib
from pathlib import Path

from golden import golden_path, read_jsonl

from rmq_eventstore.common import codec
from rmq_eventstore.store import GetMessageStatus, Message, PutMessageStatus
from tests.conftest import stop_reput_thread

GEOMETRY = {
    "mapped_file_size_commit_log": 4096,
    "mapped_file_size_consume_queue": 10 * 20,
    "max_hash_slot_num": 16,
    "max_index_num": 64,
}


def ok(r) -> None:
    assert r.status == PutMessageStatus.PUT_OK, r




def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fill(store, n: int = 300) -> dict[str, int]:
    """Messages over three topics and several queues, singles and batches, rolling every kind of file."""
    keys: dict[str, int] = {}
    i = 0
    while i < n:
        topic = ("Orders", "Payments", "%RETRY%billing")[i % 3]
        q = i % 4
        if i % 7 == 0:
            msgs = [Message(topic=topic, body=b"batch-%d" % (i + j), queue_id=q, keys=[f"key-{i + j}"],
                            tags="TagB") for j in range(5)]
            r = store.put_messages(msgs)
            ok(r)
            for j in range(5):
                keys[f"key-{i + j}"] = r.append_result.offsets[j]
            i += 5
        else:
            r = store.put_message(Message(topic=topic, body=b"single-%d" % i * (i % 5 + 1), queue_id=q,
                                          keys=[f"key-{i}", "common"], tags="TagA"))
            ok(r)
            keys[f"key-{i}"] = r.append_result.wrote_offset
            i += 1
    return keys


def snapshot_queues(store, read_queue) -> dict[tuple[str, int], list[tuple[int, int, bytes]]]:
    out = {}
    for topic in store.topics():
        for q in store.queue_ids(topic):
            out[(topic, q)] = [(o, m.commit_log_offset, m.body) for o, m in read_queue(store, topic, q)]
    return out


# -- rebuilding derived data ---------------------------------------------------------------------------------
def test_queues_and_index_are_rebuilt_from_the_commitlog(open_store, store_path, read_queue):
    store = open_store(**GEOMETRY)
    keys = fill(store)
    assert store.wait_for_dispatch()
    before = snapshot_queues(store, read_queue)
    assert sum(len(v) for v in before.values()) == len(keys)
    found_before = {k: [m.commit_log_offset for m in store.query_message(t, k).messages]
                    for k in keys for t in ("Orders", "Payments", "%RETRY%billing")
                    if store.query_message(t, k).messages}
    common_before = {t: [m.commit_log_offset for m in store.query_message(t, "common", 64).messages]
                     for t in ("Orders", "Payments", "%RETRY%billing")}
    max_phy = store.get_max_phy_offset()
    store.shutdown()
    cq_files = tree_bytes(store_path / "consumequeue")
    assert len(cq_files) > 12  # several files per queue
    assert len(os.listdir(store_path / "index")) > 3
    assert len(os.listdir(store_path / "commitlog")) > 3

    shutil.rmtree(store_path / "consumequeue")
    shutil.rmtree(store_path / "index")
    store = open_store(**GEOMETRY)
    assert store.get_max_phy_offset() == max_phy
    assert store.wait_for_dispatch()
    assert store.dispatch_behind_bytes() == 0
    assert snapshot_queues(store, read_queue) == before
    assert {k: [m.commit_log_offset for m in store.query_message(t, k).messages]
            for k in keys for t in ("Orders", "Payments", "%RETRY%billing")
            if store.query_message(t, k).messages} == found_before
    assert found_before == {k: [off] for k, off in keys.items()}
    assert {t: [m.commit_log_offset for m in store.query_message(t, "common", 64).messages]
            for t in ("Orders", "Payments", "%RETRY%billing")} == common_before
    # The queue-offset table is rebuilt too: the next put continues every queue.
    r = store.put_message(Message(topic="Orders", body=b"after", queue_id=0))
    ok(r)
    assert r.append_result.logics_offset == len(before[("Orders", 0)])
    store.shutdown()
    # Byte for byte the same consume queue files (plus the unit of the new message).
    after = tree_bytes(store_path / "consumequeue")
    assert after.keys() == cq_files.keys()
    changed = [k for k in after if after[k] != cq_files[k]]
    assert len(changed) == 1 and changed[0].startswith(os.path.join("Orders", "0"))


def test_index_alone_is_rebuilt_from_the_commitlog(open_store, store_path):
    """Queues and indexes are derived data (DESIGN.md): with the consume queues intact but `index/` gone,
    reopening must index the commitlog again so that keys are found."""
    store = open_store(**GEOMETRY)
    keys = fill(store, 60)
    assert store.wait_for_dispatch()
    store.shutdown()
    shutil.rmtree(store_path / "index")
    store = open_store(**GEOMETRY)
    assert store.wait_for_dispatch()
    missing = [k for k, off in keys.items()
               if [m.commit_log_offset for t in ("Orders", "Payments", "%RETRY%billing")
                   for m in store.query_message(t, k).messages] != [off]]
    assert missing == [], f"{len(missing)} of {len(keys)} keys are no longer found, e.g. {missing[:3]}"


# -- a commitlog written by Apache RocketMQ -----------------------------------------------------------------
GOLDEN_QUEUES = {
    ("TopicTest", 0): [0, 3647],
    ("TopicTest", 1): [105],
    ("TopicV6", 0): [296, 437],
    ("TopicV6", 1): [562],
    ("TopicV2", 2): [686],
    ("TopicEmpty", 3): [1052],
    ("TopicTx", 0): [1291],  # the COMMIT record; the PREPARED one at 1153 is not dispatched
    ("TopicZ", 0): [1398],
    ("%RETRY%GID_x", 0): [1653],
    ("TopicBig", 0): [2048],
}


def test_golden_commitlog_is_dispatched(open_store, store_path, read_queue, caplog):
    src = golden_path("commitlog-2k")
    (store_path / "commitlog").mkdir(parents=True)
    for name in sorted(os.listdir(src)):
        shutil.copyfile(src / name, store_path / "commitlog" / name)  # the golden files are read-only
        os.chmod(store_path / "commitlog" / name, 0o644)
    decoded = {d["commitLogOffset"]: d for d in read_jsonl("commitlog-2k.decoded.jsonl")
               if d.get("commitLogOffset") is not None}
    long_topic = decoded[803]["topic"]
    assert len(long_topic) == 130 and decoded[1513]["topic"] == "Topic中文"

    with caplog.at_level(logging.WARNING):
        store = open_store(mapped_file_size_commit_log=2048)
        assert store.wait_for_dispatch()
    assert store.get_max_phy_offset() == 3647 + 124
    assert store.dispatch_behind_bytes() == 0
    got = {(t, q): [m.commit_log_offset for _, m in read_queue(store, t, q)]
           for t in store.topics() for q in store.queue_ids(t)}
    assert got == GOLDEN_QUEUES
    for topic, q in GOLDEN_QUEUES:
        for qoff, (o, m) in enumerate(read_queue(store, topic, q)):
            d = decoded[m.commit_log_offset]
            assert o == qoff == d["queueOffset"]
            stored_flag = d.get("storedSysFlag", d["sysFlag"])
            # the store keeps the producer's (compressed) bytes; the golden view is decompressed
            body = zlib.decompress(m.body) if stored_flag & codec.COMPRESSED_FLAG else m.body
            assert body == (bytes.fromhex(d["bodyHex"]) if "bodyHex" in d else d["body"].encode())
            assert (m.topic, m.queue_id, m.sys_flag, m.msg_id) == (topic, q, stored_flag, d["msgId"])
            assert m.body_crc == d["bodyCRC"] and m.store_size == d["storeSize"]
    # The two records whose topics cannot be directory names are skipped, loudly, and nothing is
    # created for them.
    for bad in (long_topic, "Topic中文"):
        assert any(bad in rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING), bad
        assert bad not in os.listdir(store_path / "consumequeue")
    assert store.look_message_by_offset(803).topic == long_topic  # still readable by offset
    # The index: KEYS and UNIQ_KEY of the tags_keys record.
    for key in ("k1", "k2", "C0A8011400004E21000000000000000A"):
        found = store.query_message("TopicTest", key).messages
        assert [(m.commit_log_offset, m.body) for m in found] == [(105, b"with tags and keys")], key
    assert store.query_message("TopicTest", "k3").messages == []
    assert store.get_message("g", "TopicTest", 1, 0, 32, "TagA").messages[0].tags == "TagA"
    # The store continues the log and every queue where RocketMQ left them.
    r = store.put_message(Message(topic="TopicTest", body=b"next"))
    ok(r)
    assert (r.append_result.wrote_offset, r.append_result.logics_offset) == (3771, 2)
    r = store.put_message(Message(topic="TopicTx", body=b"tx-next"))
    assert r.append_result.logics_offset == 1


# -- what dispatch puts where ------------------------------------------------------------------------------
def test_transaction_records_are_not_queued(open_store, store_path, read_queue):
    store = open_store(**GEOMETRY)
    kinds = [(0, "normal-0"), (codec.TRANSACTION_PREPARED_TYPE, "prepared"),
             (codec.TRANSACTION_COMMIT_TYPE, "commit"), (codec.TRANSACTION_ROLLBACK_TYPE, "rollback"),
             (0, "normal-1")]
    logics = []
    for flag, name in kinds:
        r = store.put_message(Message(topic="Tx", body=name.encode(), sys_flag=flag, keys=[name]))
        ok(r)
        logics.append(r.append_result.logics_offset)
        m = store.look_message_by_offset(r.append_result.wrote_offset)
        assert codec.transaction_value(m.sys_flag) == flag
        assert m.queue_offset == r.append_result.logics_offset
    assert logics == [0, 0, 1, 0, 2]

    def check():
        assert store.wait_for_dispatch()
        assert [m.body for _, m in read_queue(store, "Tx", 0)] == [b"normal-0", b"commit", b"normal-1"]
        # PREPARED records are indexed (spec §7.4), ROLLBACK records are not.
        for name in ("normal-0", "prepared", "commit", "normal-1"):
            assert [m.body for m in store.query_message("Tx", name).messages] == [name.encode()], name
        assert store.query_message("Tx", "rollback").messages == []

    check()
    store.shutdown()
    shutil.rmtree(store_path / "consumequeue")
    shutil.rmtree(store_path / "index")
    store = open_store(**GEOMETRY)
    check()
    r = store.put_message(Message(topic="Tx", body=b"normal-2"))
    assert r.append_result.logics_offset == 3


def test_arrival_listener_is_told_which_queues_grew(store):
    seen: dict[tuple[str, int], int] = {}
    lock = threading.Lock()

    def listener(grown: dict[tuple[str, int], int]) -> None:
        with lock:
            for k, v in grown.items():
                seen[k] = max(seen.get(k, 0), v)

    def broken(grown):
        raise RuntimeError("a listener must not stop dispatch")

    store.reput_message_service.listeners.extend([broken, listener])
    for i in range(3):
        ok(store.put_message(Message(topic="T", body=b"%d" % i, queue_id=0)))
    ok(store.put_messages([Message(topic="T", body=b"b", queue_id=1), Message(topic="U", body=b"u")]))
    assert store.wait_for_dispatch()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(seen) < 3:
        time.sleep(0.01)
    assert seen == {("T", 0): 3, ("T", 1): 1, ("U", 0): 1}  # consumeQueueOffset + 1, as `arriving`
    assert store.get_max_offset_in_queue("U", 0) == 1


# -- dispatch progress ---------------------------------------------------------------------------------------
def test_wait_for_dispatch_waits_for_the_dispatchers(store):
    """`wait_for_dispatch` ("every record written so far is in the consume queues and index") must not
    return while the dispatchers are still working on the last records; RocketMQ moves
    `reputFromOffset` past a record only after `doDispatch` returned."""
    svc = store.reput_message_service
    real = svc.dispatch

    def slow_dispatch(requests):
        time.sleep(0.3)
        real(requests)

    svc.dispatch = slow_dispatch
    ok(store.put_message(Message(topic="Slow", body=b"x", keys=["slow-key"])))
    time.sleep(0.05)  # the reput thread has taken the record and is inside the dispatchers
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue("Slow", 0) == 1
    assert [m.body for m in store.query_message("Slow", "slow-key").messages] == [b"x"]


def test_a_failed_dispatch_is_retried_not_skipped(store):
    """A dispatcher error (RocketMQ: an exception out of `doDispatch`) must leave the records to be
    dispatched again, not silently skip them."""
    svc = store.reput_message_service
    real = svc.dispatch
    failures = []

    def flaky_dispatch(requests):
        if not failures:
            failures.append(len(requests))
            raise OSError("transient dispatcher failure")
        real(requests)

    svc.dispatch = flaky_dispatch
    ok(store.put_message(Message(topic="Flaky", body=b"x", keys=["flaky-key"])))
    # wait_for_dispatch returns True only once the retried dispatch has built the queue AND the index
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not store.wait_for_dispatch(timeout=0.1):
        time.sleep(0.02)
    assert failures == [1]
    assert store.get_max_offset_in_queue("Flaky", 0) == 1
    r = store.get_message("g", "Flaky", 0, 0, 32)
    assert r.status == GetMessageStatus.FOUND and r.messages[0].body == b"x"
    assert [m.body for m in store.query_message("Flaky", "flaky-key").messages] == [b"x"]


def test_shutdown_while_dispatch_is_behind_keeps_the_abort_file(open_store, store_path, read_queue):
    """`DefaultMessageStoreShutDownTest.testDispatchBehindWhenShutdown`: a store that cannot catch up its
    dispatch by shutdown is not shut down normally (the `abort` file stays), and the next start
    dispatches what is missing."""
    store = open_store(**GEOMETRY)
    ok(store.put_message(Message(topic="Behind", body=b"dispatched", keys=["k0"])))
    assert store.wait_for_dispatch()

    def failing_dispatch(requests):
        raise OSError("dispatcher down")

    store.reput_message_service.dispatch = failing_dispatch
    ok(store.put_message(Message(topic="Behind", body=b"not yet", keys=["k1"])))
    assert not store.wait_for_dispatch(timeout=0.3)
    assert store.dispatch_behind_bytes() > 0
    assert store.get_max_offset_in_queue("Behind", 0) == 1
    store.shutdown()  # waits (up to 5 s, as RocketMQ) for a dispatch that never comes
    assert (store_path / "abort").exists()
    store = open_store(**GEOMETRY)
    assert not store.last_exit_ok
    assert store.wait_for_dispatch()
    assert [m.body for _, m in read_queue(store, "Behind", 0)] == [b"dispatched", b"not yet"]
    assert [m.body for m in store.query_message("Behind", "k1").messages] == [b"not yet"]
    store.shutdown()
    assert not (store_path / "abort").exists()


# -- dispatch on the calling thread (the broker's loop after a write) ---------------------------------------
def test_held_wakeups_are_dispatched_by_the_caller(store):
    """After `hold_wakeups`, a put wakes nobody; `dispatch_here` dispatches it on the calling thread and
    lets later puts wake the thread again."""
    svc = store.reput_message_service
    stop_reput_thread(svc)
    assert svc.hold_wakeups()
    assert not svc.hold_wakeups()  # held already: nothing more to promise
    ok(store.put_message(Message(topic="Here", body=b"a", keys=["here-a"])))
    assert not svc._wakeup.is_set()
    assert store.get_max_offset_in_queue("Here", 0) == 0
    assert svc.dispatch_here() == 1
    assert store.get_max_offset_in_queue("Here", 0) == 1  # at once, on this thread
    assert [m.body for m in store.query_message("Here", "here-a").messages] == [b"a"]
    assert not svc._wakeup.is_set() and not svc._signalled
    ok(store.put_message(Message(topic="Here", body=b"b")))  # not held: the hand-off wakes the thread
    assert svc._wakeup.is_set()


def test_dispatch_here_leaves_to_the_thread_what_it_cannot_take(store):
    """`dispatch_here` never waits for the dispatch lock: when the thread holds it, or when a put lands
    after its pass, the thread is woken so that nothing stays undispatched."""
    svc = store.reput_message_service
    stop_reput_thread(svc)
    assert svc.hold_wakeups()
    ok(store.put_message(Message(topic="Busy", body=b"a")))
    with svc._lock:  # the dispatch thread is in a pass
        assert svc.dispatch_here() == 0
    assert svc._wakeup.is_set() and store.get_max_offset_in_queue("Busy", 0) == 0
    assert svc.do_reput() == 1
    svc._wakeup.clear()
    svc._signalled = False

    real = svc._reput_locked

    def pass_then_put(one_pass: bool = False) -> int:  # another thread's put right after the pass
        n = real(one_pass)
        ok(store.put_message(Message(topic="Busy", body=b"late")))
        return n

    # the Python pass (the native one clears `_signalled` in the same step as its last look: no put can
    # land in between, see test_dispatch_native.py)
    fast, svc._fast_ctx = svc._fast_ctx, None
    svc._reput_locked = pass_then_put
    assert svc.hold_wakeups()
    ok(store.put_message(Message(topic="Busy", body=b"b")))
    assert svc.dispatch_here() == 1
    assert svc._wakeup.is_set()  # "late" saw the hold and woke nobody: dispatch_here did
    del svc._reput_locked
    svc._fast_ctx = fast
    assert svc.do_reput() == 1
    assert store.get_max_offset_in_queue("Busy", 0) == 3


def test_a_failed_dispatch_here_is_left_to_the_thread(store, caplog):
    svc = store.reput_message_service
    stop_reput_thread(svc)
    real = svc.dispatch
    svc.dispatch = lambda reqs: (_ for _ in ()).throw(OSError("disk trouble"))
    assert svc.hold_wakeups()
    ok(store.put_message(Message(topic="Fails", body=b"x")))
    with caplog.at_level(logging.ERROR):
        assert svc.dispatch_here() == 0
    assert "reput on the calling thread failed" in caplog.text
    assert svc._wakeup.is_set() and svc.errors == 1
    svc.dispatch = real
    assert svc.do_reput() == 1
    assert store.get_max_offset_in_queue("Fails", 0) == 1
