"""Topic deletion (DELETE_TOPIC_IN_BROKER, 215) over the wire, and across a SIGKILL in the middle of it.

A deleted topic loses its consume queue files, its entry in topics.json, every group's offsets and its
route; its pop retry topic goes with it; system topics and names that are no topic names are refused with
INVALID_PARAMETER (29); an unknown topic is SUCCESS, as RocketMQ answers. Commitlog records stay, but a
restart (clean or after a crash) never builds a queue for them again, and a topic created again starts at
queue offset 0. The crash tests kill a real broker process at chosen steps of the deletion and check that
the reopened store has the topic either fully or not at all, and that `verify` finds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.cli.app import main as cli_main
from rmq_eventstore.cli.output import EXIT_ERROR
from rmq_eventstore.client import FOUND, Admin, Message, MQBrokerError, PopConsumer, Producer, PullConsumer
from rmq_eventstore.remoting import ResponseCode
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store.repair import verify


def _fill(namesrv: str, topic: str, n: int = 5) -> None:
    with Producer(namesrv, "pg") as p:
        for i in range(n):
            p.send(Message(topic, f"m{i}".encode()), queue_id=i % 2)


def test_delete_topic_over_the_wire(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s") as rb:
        ns = rb.namesrv_address
        with Admin(ns) as admin:
            admin.create_topic("Doomed", queue_nums=2)
            admin.create_topic("Kept", queue_nums=1)
            _fill(ns, "Doomed")
            _fill(ns, "Kept", 1)
            with PullConsumer(ns, "cg") as c:
                r = c.pull("Doomed", 0, 0, suspend_timeout_ms=2000)
                assert r.status == FOUND
                c.commit_offset("Doomed", 0, r.next_begin_offset)
            with PopConsumer(ns, "popg") as pc:  # pop state and a pop retry topic for the group
                msgs = pc.pop("Doomed", max_nums=1, invisible_time=60_000, queue_id=1)
                assert msgs
                pc.change_invisible_time(msgs[0], 0)
            rb.store.wait_for_dispatch()
            rb.broker.pop_service.revive_once()
            retry = "%RETRY%popg_Doomed"
            assert admin.topic_route(retry).queues  # the revive put it back on the pop retry topic
            cq = tmp_path / "s" / "consumequeue"
            assert (cq / "Doomed").is_dir() and (cq / "Kept").is_dir()

            admin.delete_topic("Doomed")

            assert not (cq / "Doomed").exists() and not (cq / retry).exists()
            assert (cq / "Kept").is_dir()
            topics = json.loads((tmp_path / "s" / "config" / "topics.json").read_text())["topicConfigTable"]
            assert "Doomed" not in topics and retry not in topics and "Kept" in topics
            assert all(not k.startswith("Doomed@") for k in rb.store.consumer_offset_manager.offset_table())
            assert "Doomed" not in admin.topic_list()
            rb.broker.config.auto_create_topic_enable = False
            with pytest.raises(MQBrokerError) as e:
                admin.topic_route("Doomed")
            assert e.value.code == ResponseCode.TOPIC_NOT_EXIST
            rb.broker.config.auto_create_topic_enable = True
            assert rb.broker.pop_service.pending_count() == 0 and rb.broker.pop_service.buffer.size() == 0

            # system topics, bad names, blank: INVALID_PARAMETER from the broker, ValueError in the client
            for bad in ("SCHEDULE_TOPIC_XXXX", "rmq_sys_REVIVE_LOG_DefaultCluster", "RMQ_SYS_TRANS_HALF_TOPIC"):
                with pytest.raises(MQBrokerError) as e:
                    admin.delete_topic(bad)
                assert e.value.code == ResponseCode.INVALID_PARAMETER and "system topic" in str(e.value)
            with pytest.raises(ValueError):
                admin.delete_topic("no spaces allowed")
            from rmq_eventstore.client.base import ClientBase
            from rmq_eventstore.remoting import RemotingCommand, RequestCode
            base = ClientBase(ns, 5.0)
            base.start()
            try:
                for bad, code in (("", ResponseCode.INVALID_PARAMETER), ("bad name!", ResponseCode.INVALID_PARAMETER)):
                    r = base.remoting.invoke(rb.broker_address, RemotingCommand.request(
                        RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": bad}), 5.0)
                    assert r.code == code, (bad, r.code, r.remark)
            finally:
                base.shutdown()
            admin.delete_topic("NeverExisted")  # SUCCESS, as RocketMQ answers for an unknown topic

            # created again: queue offsets start at 0, the old records stay out
            _fill(ns, "Doomed", 2)
            with PullConsumer(ns, "cg2") as c:
                r = c.pull("Doomed", 0, 0, suspend_timeout_ms=2000)
                assert r.status == FOUND and [m.queue_offset for m in r.messages] == [0]
                assert r.messages[0].body == b"m0"
    # a clean restart does not bring the old records back either, nor does a rebuild from the commitlog
    with MessageStore.open(tmp_path / "s") as store:
        assert store.get_max_offset_in_queue("Doomed", 0) == 1
        assert store.get_max_offset_in_queue(retry, 0) == 0
    assert not verify(tmp_path / "s").problems
    from rmq_eventstore.store.config import StoreConfig
    store = MessageStore(StoreConfig(store_path_root_dir=str(tmp_path / "s")))
    try:
        store.load(drop_derived=True)
        store.start()
        assert store.get_max_offset_in_queue("Doomed", 0) == 1 and store.get_max_offset_in_queue("Doomed", 1) == 1
        assert store.get_max_offset_in_queue("Kept", 0) == 1
    finally:
        store.shutdown()


def _acl_file(tmp_path: Path) -> Path:
    """An ACL with an admin account and a user that may publish and subscribe but not administer."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(textwrap.dedent("""\
        accounts:
          - accessKey: adminKey
            secretKey: adminSecret12
            admin: true
          - accessKey: userKey
            secretKey: userSecret12
            defaultTopicPerm: PUB|SUB
            defaultGroupPerm: PUB|SUB
        """))
    return acl


def test_delete_topic_needs_admin(tmp_path: Path) -> None:
    acl = _acl_file(tmp_path)
    with serve_in_thread(tmp_path / "s", acl_enable=True, acl_file=str(acl)) as rb:
        ns = rb.namesrv_address
        with Admin(ns, access_key="adminKey", secret_key="adminSecret12") as admin:
            admin.create_topic("Guarded", queue_nums=1)
        with Admin(ns, access_key="userKey", secret_key="userSecret12") as user:
            with pytest.raises(MQBrokerError) as e:
                user.delete_topic("Guarded")
            assert e.value.code == ResponseCode.NO_PERMISSION
        assert rb.broker.topic_manager.get("Guarded") is not None
        with Admin(ns, access_key="adminKey", secret_key="adminSecret12") as admin:
            admin.delete_topic("Guarded")
        assert rb.broker.topic_manager.get("Guarded") is None


def test_cli_topic_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_in_thread(tmp_path / "s") as rb:
        ns = rb.namesrv_address
        _fill(ns, "ViaCli", 1)
        rb.store.wait_for_dispatch()
        assert cli_main(["topic-delete", "ViaCli", "--namesrv", ns]) == 0
        assert "deleted topic ViaCli" in capsys.readouterr().out
        assert rb.broker.topic_manager.get("ViaCli") is None
        assert cli_main(["topic-delete", "SCHEDULE_TOPIC_XXXX", "--namesrv", ns]) == EXIT_ERROR
        err = capsys.readouterr().err
        assert "refused" in err and "system topic" in err
        assert cli_main(["topic-delete", "bad name", "--namesrv", ns]) == EXIT_ERROR
        assert "cannot delete" in capsys.readouterr().err


def test_cli_topic_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`topic-create` makes a topic (or widens it), with an admin account under ACL; a non-admin account, a bad
    name or a bad count is refused in one line."""
    acl = _acl_file(tmp_path)
    with serve_in_thread(tmp_path / "s", acl_enable=True, acl_file=str(acl)) as rb:
        ns = rb.namesrv_address
        admin = ["--namesrv", ns, "--access-key", "adminKey", "--secret-key", "adminSecret12"]
        assert cli_main(["topic-create", "Made", "--queues", "2", *admin]) == 0
        assert "created topic Made (2 queues)" in capsys.readouterr().out
        assert rb.broker.topic_manager.get("Made").write_queue_nums == 2
        assert cli_main(["topic-create", "Made", "--queues", "10", *admin]) == 0
        assert rb.broker.topic_manager.get("Made").write_queue_nums == 10
        capsys.readouterr()
        user = ["--namesrv", ns, "--access-key", "userKey", "--secret-key", "userSecret12"]
        assert cli_main(["topic-create", "Other", *user]) == EXIT_ERROR
        err = capsys.readouterr().err
        assert "refused to create 'Other'" in err and "NO_PERMISSION" in err
        assert rb.broker.topic_manager.get("Other") is None
        assert cli_main(["topic-create", "bad name", *admin]) == EXIT_ERROR
        assert "cannot create" in capsys.readouterr().err
        assert cli_main(["topic-create", "Made", "--queues", "0", *admin]) == EXIT_ERROR
        assert "1 to 1024 queues" in capsys.readouterr().err


CHILD = textwrap.dedent("""\
    import functools, os, signal, sys
    from rmq_eventstore.broker import serve_in_thread
    store, step = sys.argv[1], sys.argv[2]
    rb = serve_in_thread(store, flush_disk_type="SYNC_FLUSH")
    seen = {"n": 0}
    def crash_at(s):
        if s == step:
            seen["n"] += 1
            if seen["n"] == 1:
                os.kill(os.getpid(), signal.SIGKILL)
    rb.store.delete_topic = functools.partial(rb.store.delete_topic, crash_at=crash_at)
    print(rb.namesrv_address, flush=True)
    signal.pause()
    """)

STEPS = ["before-begin", "after-begin", "queues-closed", "queue-dir-removed", "queues-deleted", "config-deleted",
         "offsets-deleted"]


@pytest.mark.parametrize("step", STEPS)
def test_crash_mid_delete(tmp_path: Path, step: str) -> None:
    store = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(store), step], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        ns = proc.stdout.readline().strip()
        assert ns, proc.stderr.read() if proc.poll() is not None else "no address"
        with Admin(ns) as admin:
            admin.create_topic("Victim", queue_nums=2)
            admin.create_topic("Bystander", queue_nums=2)
            _fill(ns, "Victim", 6)
            _fill(ns, "Bystander", 3)
            with PullConsumer(ns, "cg") as c:
                c.commit_offset("Victim", 0, 2)
                c.commit_offset("Bystander", 0, 1)
            try:
                admin.delete_topic("Victim")
            except Exception:
                pass  # the broker died under the request
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with MessageStore.open(store) as s:
        tc = s.topic_config_manager.get("Victim")
        n0, n1 = s.get_max_offset_in_queue("Victim", 0), s.get_max_offset_in_queue("Victim", 1)
        if step == "before-begin":  # fully there
            assert tc is not None and (n0, n1) == (3, 3)
        else:  # fully gone, rolled forward at load
            assert tc is None and (n0, n1) == (0, 0)
            assert not (store / "consumequeue" / "Victim").exists()
            assert all(not k.startswith("Victim@") for k in s.consumer_offset_manager.offset_table())
            assert not s.topic_deletions.pending
        assert s.get_max_offset_in_queue("Bystander", 0) + s.get_max_offset_in_queue("Bystander", 1) == 3
        # created again after the crash: offsets from 0, the old records stay out
        s.put_message(Message("Victim", b"again", queue_id=0))
        s.wait_for_dispatch()
        assert s.get_max_offset_in_queue("Victim", 0) == (4 if step == "before-begin" else 1)
    assert not verify(store).problems
    with MessageStore.open(store) as s:  # and once more: a clean restart keeps it that way
        assert s.get_max_offset_in_queue("Victim", 0) == (4 if step == "before-begin" else 1)


def test_deletion_log_forgets_expired_cutoffs_and_stays_small(tmp_path: Path) -> None:
    from rmq_eventstore.store.topic_deletion import COMPACT_SLACK, TopicDeletionLog

    log = TopicDeletionLog(str(tmp_path))
    for i in range(COMPACT_SLACK):
        log.begin(f"T{i}", 100 * i)
        log.done(f"T{i}", 100 * i)
    log.begin("Open", 5)  # a deletion not finished: kept whatever the commitlog's start
    assert log.is_deleted("T3", 299) and not log.is_deleted("T3", 300) and not log.is_deleted("Other", 0)
    with open(log.path, "ab") as f:
        f.write(b'{"topic":"Torn","off')  # a crash mid-append: ignored at load
    again = TopicDeletionLog(str(tmp_path))
    again.load()
    assert again.cutoffs == log.cutoffs and again.pending == {"Open": 5}
    assert open(again.path, "rb").read().endswith(b"\n")  # the torn tail was cut
    assert again.forget_before(100 * 10) == 11  # T0..T10: no record before them is left
    assert "T10" not in again.cutoffs and "T11" in again.cutoffs and "Open" in again.cutoffs
    lines = open(again.path).read().splitlines()
    assert len(lines) == len(again.cutoffs)  # rewritten: one line per live cutoff
    third = TopicDeletionLog(str(tmp_path))
    third.load()
    assert third.cutoffs == again.cutoffs and third.pending == {"Open": 5}
    third.done("Open", 5)
    assert third.forget_before(10**9) == len(again.cutoffs)
    assert not os.path.exists(third.path)  # nothing left to remember


def test_commitlog_expiry_forgets_the_cutoff(tmp_path: Path) -> None:
    """Once the commitlog files holding a deleted topic's records are gone, its cutoff is forgotten at load."""
    cfg = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 100}
    with MessageStore.open(tmp_path, **cfg) as s:
        s.put_message(Message("Gone", b"x" * 1000, queue_id=0))
        s.wait_for_dispatch()
        assert s.delete_topic("Gone")
        assert "Gone" in s.topic_deletions.cutoffs
        for _ in range(200):  # several files after it
            s.put_message(Message("Filler", b"y" * 1000, queue_id=0))
        s.wait_for_dispatch()
        first = s.commit_log.mapped_file_queue.mapped_files[0]
    os.unlink(first.path)  # what the cleanup service does when the file expires
    with MessageStore.open(tmp_path, **cfg) as s:
        assert "Gone" not in s.topic_deletions.cutoffs
        assert s.get_max_offset_in_queue("Gone", 0) == 0


def test_dispatch_leaves_out_units_before_the_cutoff(tmp_path: Path) -> None:
    """Both dispatch paths (requests, and the columns of a native batch put) drop a deleted topic's units from
    before its deletion and keep those after it."""
    import numpy as np

    from rmq_eventstore.common import codec

    with MessageStore.open(tmp_path, message_index_enable=False) as s:
        s.put_messages([Message("Cut", b"a", queue_id=0), Message("Cut", b"b", queue_id=0)])
        s.wait_for_dispatch()
        assert s.delete_topic("Cut")
        cutoff = s.topic_deletions.cutoffs["Cut"]
        rows = np.array([[cutoff - 200, 100, 0, 0], [cutoff + 50, 100, 0, 0]], dtype=np.int64)
        s._dispatch(codec.DispatchColumns(2, [(("Cut", 0), rows.tobytes())], b"", b"", b"", 0))
        assert s.get_max_offset_in_queue("Cut", 0) == 1  # only the unit after the cutoff
        assert s.get_commit_log_offset_in_queue("Cut", 0, 0) == cutoff + 50
        old = codec.DispatchRequest("Cut2", 0, 10, 100, 0, 0, 0, None, None, 0, 0, "")
        s.topic_deletions.cutoffs["Cut2"] = 20  # as if Cut2 had been deleted at 20
        s._dispatch([old, old._replace(commit_log_offset=30)])
        assert s.get_max_offset_in_queue("Cut2", 0) == 1
        assert s.get_commit_log_offset_in_queue("Cut2", 0, 0) == 30


def test_a_revive_racing_the_deletion_leaves_no_retry_topic(tmp_path: Path) -> None:
    """A requeued message whose revive runs while its topic is being deleted (here: right before the topic's
    own queues go) must not leave a pop retry topic behind: the deletion first stops revives of the topic,
    then lists its retry topics. (Seen once in CI: kombu's queue_delete after a requeue.)"""
    with serve_in_thread(tmp_path / "s") as rb:
        ns = rb.namesrv_address
        with Admin(ns) as admin:
            admin.create_topic("Racy", queue_nums=2)
            _fill(ns, "Racy", 2)
            with PopConsumer(ns, "popr") as pc:
                msgs = pc.pop("Racy", max_nums=1, invisible_time=60_000, queue_id=0)
                assert msgs
                pc.change_invisible_time(msgs[0], 0)  # due for revive at once
            rb.store.wait_for_dispatch()
            retry = "%RETRY%popr_Racy"
            assert rb.broker.topic_manager.get(retry) is None  # not revived yet
            store = rb.broker.store
            real_delete = store.delete_topic
            revived = []

            def delete_after_a_revive(t: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                if t == "Racy" and not revived:
                    revived.append(rb.broker.pop_service.revive_once(now_ms=2**62))
                return real_delete(t, *args, **kwargs)

            store.delete_topic = delete_after_a_revive
            try:
                admin.delete_topic("Racy")
            finally:
                del store.delete_topic
            assert revived == [0]  # the checkpoint was void: nothing put back
            assert rb.broker.topic_manager.get(retry) is None
            assert retry not in admin.topic_list() and "Racy" not in admin.topic_list()
